"""The stateless routing scorers (CLU-3.19..3.21, DELTA-30/35/36), one ``cfunc`` each.

They have exactly the signature of a user scorer (``blis_fast.kernels.hooks.SCORER_SIG``):
they read the per-instance snapshot rows and write one score per instance. The engine calls
them through a table of function pointers, so adding a scorer is one function here plus one
line in ``blis_fast.policies.SCORERS`` (see docs/extending.md). Integer-valued inputs arrive
as float64; every formula below gives the same float64 results as the reference's integer
arithmetic (the values are far below 2**53).
"""

from __future__ import annotations

from numba import cfunc

from blis_fast.kernels.hooks import (
    SCORER_SIG,
    SNAP_BATCH,
    SNAP_IN_FLIGHT,
    SNAP_KV_UTIL,
    SNAP_QUEUE,
)

LOAD_AWARE_QUEUE_THRESHOLD = 128.0  # sim/routing_scorers.go loadAwareQueueThreshold


@cfunc(SCORER_SIG, cache=True)
def score_queue_depth(snapshots, request, out):
    """queue-depth: min-max over wait-queue lengths, shortest queue scores 1 (DELTA-30)."""
    n = snapshots.shape[0]
    lo = snapshots[0, SNAP_QUEUE]
    hi = lo
    for i in range(1, n):
        q = snapshots[i, SNAP_QUEUE]
        lo = min(lo, q)
        hi = max(hi, q)
    for i in range(n):
        out[i] = 1.0 if hi == lo else (hi - snapshots[i, SNAP_QUEUE]) / (hi - lo)


@cfunc(SCORER_SIG, cache=True)
def score_kv_utilization(snapshots, request, out):
    """kv-utilization: 1 - used/total GPU blocks (CLU-3.20)."""
    for i in range(snapshots.shape[0]):
        out[i] = 1.0 - snapshots[i, SNAP_KV_UTIL]


@cfunc(SCORER_SIG, cache=True)
def score_load_balance(snapshots, request, out):
    """load-balance: 1 / (1 + queue + batch + in-flight) (CLU-3.21)."""
    for i in range(snapshots.shape[0]):
        load = (snapshots[i, SNAP_QUEUE] + snapshots[i, SNAP_BATCH]) + snapshots[i, SNAP_IN_FLIGHT]
        out[i] = 1.0 / (1.0 + load)


@cfunc(SCORER_SIG, cache=True)
def score_active_requests(snapshots, request, out):
    """active-requests: (max - in-flight) / max; 1 for an instance with none (DELTA-35)."""
    n = snapshots.shape[0]
    top = 0.0
    for i in range(n):
        top = max(top, snapshots[i, SNAP_IN_FLIGHT])
    for i in range(n):
        f = snapshots[i, SNAP_IN_FLIGHT]
        out[i] = 1.0 if (f == 0.0 or top == 0.0) else (top - f) / top


@cfunc(SCORER_SIG, cache=True)
def score_running_requests(snapshots, request, out):
    """running-requests: min-max over running-batch sizes, smallest scores 1 (DELTA-35)."""
    n = snapshots.shape[0]
    lo = snapshots[0, SNAP_BATCH]
    hi = lo
    for i in range(1, n):
        b = snapshots[i, SNAP_BATCH]
        lo = min(lo, b)
        hi = max(hi, b)
    for i in range(n):
        out[i] = 1.0 if hi == lo else (hi - snapshots[i, SNAP_BATCH]) / (hi - lo)


@cfunc(SCORER_SIG, cache=True)
def score_load_aware(snapshots, request, out):
    """load-aware: 0.5 for an empty queue, else 0.5 * (1 - min(queue, 128) / 128) (DELTA-35)."""
    for i in range(snapshots.shape[0]):
        q = snapshots[i, SNAP_QUEUE]
        if q == 0.0:
            out[i] = 0.5
        else:
            out[i] = 0.5 * (1.0 - min(q, LOAD_AWARE_QUEUE_THRESHOLD) / LOAD_AWARE_QUEUE_THRESHOLD)


@cfunc(SCORER_SIG, cache=True)
def score_vllm_dp(snapshots, request, out):
    """vllm-dp: min-max over 4 * queue + batch, lowest scores 1 (DELTA-36)."""
    n = snapshots.shape[0]
    lo = snapshots[0, SNAP_QUEUE] * 4.0 + snapshots[0, SNAP_BATCH]
    hi = lo
    for i in range(1, n):
        raw = snapshots[i, SNAP_QUEUE] * 4.0 + snapshots[i, SNAP_BATCH]
        lo = min(lo, raw)
        hi = max(hi, raw)
    for i in range(n):
        raw = snapshots[i, SNAP_QUEUE] * 4.0 + snapshots[i, SNAP_BATCH]
        out[i] = 1.0 if hi == lo else (hi - raw) / (hi - lo)
