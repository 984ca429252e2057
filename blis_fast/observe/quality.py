"""Which observed requests can teach the simulator anything about the server (issue 30).

A trace records when the *client* saw each chunk. That is the server's timing only when the
chunks travelled as a stream and the client read them on time. Three things break it, and
this module flags each per request, from the trace's own columns (so ``blis observe``,
``blis calibrate`` and ``blis fit`` judge a trace alike):

* **burst**: a streamed request whose chunks reached the client all at once (a proxy or
  gateway buffering SSE, a CPU-starved frontend flushing whole streams). Its TTFT is its
  E2E and its ITL is the speed of one network read. A request is a burst when it has at
  least :data:`MIN_CHUNKS` chunks and either its first chunk time equals its last, or its
  mean chunk gap (last - first over chunks - 1) is under :data:`BURST_GAP_FLOOR_US` (no
  decode step is that fast), or its mean gap is under :data:`BURST_GAP_FRACTION` of the
  median gap of the requests the two absolute rules left alone *and* its chunk spread is
  under :data:`BURST_SPREAD_FRACTION` of its own E2E. The median is taken over those
  requests only, never over the whole trace: when most requests are bursts the trace's
  median gap is itself near zero and would clear every one of them.
* **not_streamed**: a request sent with ``stream: false`` (or a session follow-up round,
  which the April reference sends unstreamed): its first chunk is the whole answer, so its
  TTFT is its E2E by construction and it has no ITL.
* **client_late**: the client's event loop ran more than :data:`CLIENT_LATE_US` late while
  the request was in flight (``blis observe`` samples its own loop; a trace read from a CSV
  knows nothing of it unless the lag column is there), so its timestamps carry the client's
  delay.

With an ITL file (one row per chunk), :func:`chunk_bursts` judges the recorded chunk gaps by
the same floor and median rule. E2E stays usable in all three cases (the last chunk still marks the end of the answer);
TTFT and ITL do not. Only requests with status ``ok`` and a first chunk are judged.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from blis_fast.errors import BlisInputError
from blis_fast.files import MAX_TRACE_BYTES, read_input_text

if TYPE_CHECKING:
    from blis_fast.workload.replay import TraceRecords

__all__ = ["BURST_GAP_FLOOR_US", "BURST_GAP_FRACTION", "BURST_SPREAD_FRACTION",
           "CLIENT_LAG_WARN_US", "CLIENT_LATE_US", "LAG_SAMPLE_S", "MIN_CHUNKS", "Quality",
           "chunk_bursts",
           "assess", "assess_trace", "lag_per_request", "lag_warning", "trace_client_lag_us"]

MIN_CHUNKS = 3
"""Fewest chunks a streamed request needs to be judged a burst (a role chunk, one token and
the usage chunk legitimately arrive together)."""
BURST_GAP_FLOOR_US = 250
"""A mean chunk gap under this (µs) is no decode step: the chunks came in one or a few reads."""
BURST_GAP_FRACTION = 0.1
"""A mean gap under this share of the median gap of the stream-like requests is a burst..."""
BURST_SPREAD_FRACTION = 0.05
"""...when the request's chunks also span under this share of its own E2E."""
CLIENT_LATE_US = 10_000
"""Client event-loop lag (µs) above which a request's timestamps are the client's, not the
server's."""
CLIENT_LAG_WARN_US = 10_000
"""``blis observe`` warns at the end of a run when the 99th percentile of its event-loop lag
exceeds this (µs)."""
LAG_SAMPLE_S = 0.01
"""How often ``blis observe`` checks its own event loop for lag (seconds)."""


@dataclass(frozen=True)
class Quality:
    """Per-request flags of one trace (arrays in the trace's row order) and their summary."""

    judged: np.ndarray  # bool: status ok with a first chunk
    burst: np.ndarray  # bool
    not_streamed: np.ndarray  # bool
    client_late: np.ndarray  # bool
    client_lag_us: np.ndarray  # int64, -1 where unknown

    @property
    def flagged(self) -> np.ndarray:
        """Requests whose TTFT and ITL do not measure the server (E2E still does)."""
        return self.burst | self.not_streamed | self.client_late

    @property
    def usable(self) -> np.ndarray:
        """Judged requests with no flag: their TTFT and ITL measure the server."""
        return self.judged & ~self.flagged

    def summary_lines(self) -> list[str]:
        """One line per kind of flag raised (none when every judged request is clean)."""
        n = int(self.judged.sum())
        lines = []
        for count, text in (
                (int(self.burst.sum()), "arrived in one burst: TTFT and ITL of these measure the "
                                        "delivery path, not the server"),
                (int(self.not_streamed.sum()), "were not streamed: their TTFT is their E2E and "
                                               "they have no ITL"),
                (int(self.client_late.sum()),
                 f"were in flight while the client's own event loop ran over "
                 f"{CLIENT_LATE_US / 1000:g} ms late: their TTFT and ITL carry the client's "
                 f"delay")):
            if count:
                lines.append(f"{count} of {n} requests {text}")
        return lines


def assess(streaming: np.ndarray, ok: np.ndarray, send_us: np.ndarray, first_us: np.ndarray,
           last_us: np.ndarray, num_chunks: np.ndarray,
           client_lag_us: np.ndarray | None = None) -> Quality:
    """Flag each request (module docstring); ``client_lag_us`` is -1 (or absent) where the
    client's lag is unknown."""
    streaming = np.asarray(streaming, dtype=bool)
    send = np.asarray(send_us, dtype=np.int64)
    first = np.asarray(first_us, dtype=np.int64)
    last = np.asarray(last_us, dtype=np.int64)
    chunks = np.asarray(num_chunks, dtype=np.int64)
    judged = np.asarray(ok, dtype=bool) & (first > 0)
    spread = np.maximum(last - first, 0)
    e2e = np.maximum(last - send, 0)
    candidate = judged & streaming & (chunks >= MIN_CHUNKS)
    gap = spread / np.maximum(chunks - 1, 1)
    absolute = candidate & ((spread == 0) | (gap < BURST_GAP_FLOOR_US))
    stream_like = candidate & ~absolute
    relative = np.zeros_like(absolute)
    if int(stream_like.sum()) >= 3:
        ref = float(np.median(gap[stream_like]))
        relative = stream_like & (gap < BURST_GAP_FRACTION * ref) & (
            spread < BURST_SPREAD_FRACTION * e2e)
    if client_lag_us is None:
        lag = np.full(send.shape, -1, dtype=np.int64)
    else:
        lag = np.asarray(client_lag_us, dtype=np.int64)
    return Quality(judged=judged, burst=absolute | relative, not_streamed=judged & ~streaming,
                   client_late=judged & (lag > CLIENT_LATE_US), client_lag_us=lag)


def assess_trace(records: TraceRecords, client_lag_us: np.ndarray | None = None) -> Quality:
    """:func:`assess` over a trace's data columns."""
    return assess(np.asarray(records.streaming, dtype=bool),
                  np.asarray([s == "ok" for s in records.status], dtype=bool),
                  records.send_us, records.first_chunk_us, records.last_chunk_us,
                  records.num_chunks, client_lag_us)


def lag_per_request(sample_wall_us: np.ndarray, sample_lag_us: np.ndarray,
                    send_us: np.ndarray, end_us: np.ndarray) -> np.ndarray:
    """The largest event-loop lag sampled while each request was in flight (µs; 0 when no
    sample fell inside ``[send, end]``, -1 for a request never sent)."""
    t = np.asarray(sample_wall_us, dtype=np.int64)
    lag = np.asarray(sample_lag_us, dtype=np.int64)
    send = np.asarray(send_us, dtype=np.int64)
    end = np.maximum(np.asarray(end_us, dtype=np.int64), send)
    out = np.zeros(send.shape, dtype=np.int64)
    if t.size == 0:
        out[send <= 0] = -1
        return out
    order = np.argsort(t, kind="stable")
    t, lag = t[order], lag[order]
    lo = np.searchsorted(t, send, side="left")
    # a sample at time s measured how late the loop was just before s: a request that was in
    # flight up to ``end`` is covered by the first sample after it too
    hi = np.minimum(np.searchsorted(t, end, side="right") + 1, t.size)
    for i in range(send.size):
        if send[i] <= 0:
            out[i] = -1
        elif hi[i] > lo[i]:
            out[i] = int(lag[lo[i]:hi[i]].max())
    return out


def lag_warning(sample_lag_us: np.ndarray) -> str | None:
    """The end-of-run warning when the client's own lag's 99th percentile is over
    :data:`CLIENT_LAG_WARN_US`, with the percentiles; None otherwise."""
    lag = np.asarray(sample_lag_us, dtype=np.float64)
    if lag.size == 0:
        return None
    p50, p90, p99 = np.percentile(lag, [50, 90, 99])
    if p99 <= CLIENT_LAG_WARN_US:
        return None
    return (f"the client's own event loop ran late during the run (lag p50 {p50 / 1000:.1f} ms, "
            f"p90 {p90 / 1000:.1f} ms, p99 {p99 / 1000:.1f} ms, max {lag.max() / 1000:.1f} ms "
            f"over {lag.size} checks; over {CLIENT_LAG_WARN_US / 1000:g} ms at p99): the "
            f"recorded times include this delay; run the client on a less busy machine or "
            f"lower --max-concurrency")


def trace_client_lag_us(path: str, n_rows: int) -> np.ndarray | None:
    """The ``client_lag_us`` column of a trace CSV written with ``blis observe
    --quality-columns`` (row order), or None when the file has no such column. A value that is
    not a whole number is refused naming the file and row (exit 2)."""
    text = read_input_text(path, MAX_TRACE_BYTES, universal_newlines=False)
    rows = csv.reader(io.StringIO(text, newline=""))
    header = next(rows, [])
    if "client_lag_us" not in header:
        return None
    k = header.index("client_lag_us")
    out = np.full(n_rows, -1, dtype=np.int64)
    for i, row in enumerate(rows):
        if i >= n_rows:
            break
        if k < len(row) and row[k] != "":
            try:
                out[i] = int(row[k])
            except ValueError:
                raise BlisInputError(f"--trace-data {path}: row {i + 2}: client_lag_us must be "
                                     f"a whole number of µs, got {row[k][:40]!r}") from None
    return out


def chunk_bursts(request_id: np.ndarray, chunk_index: np.ndarray, timestamp_us: np.ndarray,
                 warm_up: int = 0) -> np.ndarray:
    """Request ids (sorted) whose recorded chunks (an ITL file's rows) came in a burst: the
    mean of their non-negative gaps under :data:`BURST_GAP_FLOOR_US`, or under
    :data:`BURST_GAP_FRACTION` of the median mean gap of the requests above that floor (never
    of the whole file: a file of bursts has a median near zero). Requests below ``warm_up``
    and with fewer than two chunks are not judged."""
    rid = np.asarray(request_id, dtype=np.int64)
    order = np.lexsort((np.asarray(chunk_index), rid))
    rid = rid[order]
    ts = np.asarray(timestamp_us, dtype=np.float64)[order]
    same = rid[1:] == rid[:-1]
    gap = np.diff(ts)
    use = same & (gap >= 0) & (rid[1:] >= warm_up)
    ids, inverse = np.unique(rid[1:][use], return_inverse=True)
    if ids.size == 0:
        return ids
    mean_gap = np.bincount(inverse, weights=gap[use]) / np.bincount(inverse)
    burst = mean_gap < BURST_GAP_FLOOR_US
    if int((~burst).sum()) >= 3:
        burst |= mean_gap < BURST_GAP_FRACTION * float(np.median(mean_gap[~burst]))
    return ids[burst]
