"""The report's anomaly counters (CLU-7.13/7.14): priority inversions and head-of-line
blocking."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from blis_fast.output.summary import InstanceMetrics


def count_inversion_pairs(e2e: np.ndarray, brute_force_max: int = 256) -> int:
    """Number of pairs ``i < j`` with ``e2e[i] > 2 * e2e[j]`` (O(n log^2 n), exact)."""
    e = np.asarray(e2e, dtype=np.float64)
    n = e.size
    if n < 2:
        return 0
    q = e * 2.0
    if n <= brute_force_max:
        return int(np.count_nonzero(np.triu(e[:, None] > q[None, :], k=1)))
    uniq = np.unique(np.concatenate([e, q]))
    m = np.int64(uniq.size)
    ra = np.searchsorted(uniq, e).astype(np.int64)
    rq = np.searchsorted(uniq, q).astype(np.int64)
    idx = np.arange(n, dtype=np.int64)
    total = 0
    s = 1
    while s < n:
        blk = idx // (2 * s)
        right = (idx // s) % 2 == 1
        lk = np.sort(blk[~right] * m + ra[~right])
        b = blk[right]
        hi = np.searchsorted(lk, (b + 1) * m, side="left")
        le = np.searchsorted(lk, b * m + rq[right], side="right")
        total += int(np.sum(hi - le))
        s *= 2
    return total


def detect_priority_inversions(
    handled_by: np.ndarray,
    slo_class: Sequence[str] | np.ndarray,
    arrival_us: np.ndarray,
    e2e_us: np.ndarray,
    priority_policy: str,
    request_id: Sequence[str] | np.ndarray | None = None,
) -> int:
    """``detectPriorityInversions`` (CLU-7.13); arrival ties broken by request ID (OPEN-1)."""
    if priority_policy in ("constant", ""):
        return 0
    hb = np.asarray(handled_by, dtype=np.int64)
    if hb.size == 0:
        return 0
    arrived = np.asarray(arrival_us, dtype=np.int64).astype(np.float64) / 1e6
    e2e = np.asarray(e2e_us, dtype=np.float64)
    cls = np.asarray(slo_class)
    cls = np.where(cls == "", "default", cls.astype(str))
    if request_id is None:
        tie = np.arange(hb.size)
    else:
        tie = np.argsort(np.argsort(np.asarray(request_id), kind="stable"), kind="stable")
    total = 0
    instances, counts = np.unique(hb[hb >= 0], return_counts=True)
    for inst, cnt in zip(instances.tolist(), counts.tolist(), strict=True):
        if cnt < 2:
            continue
        sel = np.flatnonzero((hb == inst) & ~np.isnan(e2e))
        if sel.size < 2:
            continue
        groups, ginv = np.unique(cls[sel], return_inverse=True)
        for g in range(groups.size):
            rows = sel[ginv == g]
            if rows.size < 2:
                continue
            order = np.lexsort((tie[rows], arrived[rows]))
            total += count_inversion_pairs(e2e[rows[order]])
    return total


def detect_hol_blocking(instances: Sequence[InstanceMetrics]) -> int:
    """``detectHOLBlocking`` (CLU-7.14): instances whose mean wait-queue length > 2x the mean."""
    if len(instances) < 2:
        return 0
    avgs = []
    total = 0.0
    for m in instances:
        avg = 0.0
        if m.wait_queue_len_steps > 0:
            avg = float(m.wait_queue_len_sum) / float(m.wait_queue_len_steps)
        avgs.append(avg)
        total += avg
    mean = total / float(len(avgs))
    if mean > 0:
        return sum(1 for a in avgs if a > 2.0 * mean)
    return 0
