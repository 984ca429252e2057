"""The KV offload chain's transfer station (issue 32; spec kv-offload.md KVO-6): per instance and
per secondary tier, read and write servers with FIFO queues, a service time from the tier's
device figures (base latency, bandwidth with a queue-depth ramp, a jitter factor drawn by the
caller), and one completion heap across the instance's tiers.

Everything lives in preallocated arrays (:class:`StationState`, built by :func:`new_station`);
a job occupies one row of ``jobs`` from its submit until the caller has applied its completion
and freed it (:func:`free_job`), so the row count bounds the jobs in flight (the caller sizes it:
the chain has at most one write per pinned CPU block and tier plus one read per promoted run).
The station only moves when told: :func:`submit` first advances it to the submit tick, and
:func:`poll` advances it to ``now`` and hands over every job completed since the last poll, in
the heap's order ``(complete_at, submit_tick, tier, direction, id)`` (KVO-6.7). A server freed
by a completion starts queued work at that completion's tick.

Its one user is the tier chain (``kv_chain.py``): write-through writes (KVO-4.4) and
promotion reads (KVO-5.4) submit here, and ``chain_poll`` applies the completions at each
step start.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.go.gomath import go_round
from blis_fast.kernels.go.gorand import new_source, norm_float64
from blis_fast.kernels.jit import njit

READ, WRITE = 0, 1
"""Job directions (a read completes before a write of the same tick and submit tick)."""
MAX_SERVICE_TICKS = np.int64(1) << np.int64(60)
"""Ceiling of one job's service time (a huge payload on a slow tier saturates here)."""
JITTER_MIN_FACTOR = 0.05
"""Floor of a drawn jitter factor: a transfer is at most 20x faster than its mean."""


class TierIntT(NamedTuple):
    """Integer figures of a tier (``tier_int[t, *]``)."""

    N_READ: int = 0  # read-priority servers
    N_WRITE: int = 1  # write-priority servers
    BASE: int = 2  # base latency in ticks, rounded (reads and writes alike, KVO-D8)
    QSAT: int = 3  # saturation queue depth of the ramp (< 2: no ramp)
    SIZE: int = 4


TierInt = TierIntT()


class TierFloatT(NamedTuple):
    """Real figures of a tier (``tier_f[t, *]``): bandwidths in bytes per tick."""

    READ_BW: int = 0
    WRITE_BW: int = 1
    F1: int = 2  # single-transfer fraction of the bandwidth (the ramp's start)
    SIGMA: int = 3  # relative jitter standard deviation (0: none)
    SIZE: int = 4


TierFloat = TierFloatT()


class TierStateT(NamedTuple):
    """Per instance and tier (``tier_state[i, t, *]``): servers, queues (linked job rows,
    -1 = empty) and the tier's transfer figures."""

    FREE_READ: int = 0
    FREE_WRITE: int = 1
    ACTIVE_READ: int = 2  # read jobs in service (the ramp's queue depth)
    ACTIVE_WRITE: int = 3
    RQ_HEAD: int = 4
    RQ_TAIL: int = 5
    WQ_HEAD: int = 6
    WQ_TAIL: int = 7
    READS: int = 8  # jobs started, per direction
    WRITES: int = 9
    BYTES_READ: int = 10
    BYTES_WRITTEN: int = 11
    QUEUE_WAIT: int = 12  # sum over started jobs of start - submit tick
    SIZE: int = 16


TierState = TierStateT()


class JobFieldT(NamedTuple):
    """A job row (``jobs[i, j, *]``)."""

    ID: int = 0  # submit order on the instance, from 1
    TIER: int = 1
    DIR: int = 2
    BYTES: int = 3
    SUBMIT: int = 4
    COMPLETE_AT: int = 5  # valid once in service
    SERVER: int = 6  # READ or WRITE server class serving it
    NEXT: int = 7  # queue link while queued, free-list link while free
    TAG: int = 8  # the caller's reference (what the completion applies to)
    SIZE: int = 9


JobField = JobFieldT()


class StationMetaT(NamedTuple):
    """Per instance (``meta[i, *]``)."""

    LAST_TICK: int = 0  # the station's clock (never decreases)
    NEXT_ID: int = 1
    HEAP_LEN: int = 2
    FREE_HEAD: int = 3  # first free job row, -1 when full
    DONE_LEN: int = 4  # completions not yet handed over by poll
    SIZE: int = 8


StationMeta = StationMetaT()


class StationState(NamedTuple):
    """Every instance's transfer station (see the module docstring)."""

    tier_int: np.ndarray  # int64 [n_tiers, TierInt.SIZE]
    tier_f: np.ndarray  # float64 [n_tiers, TierFloat.SIZE]
    tier_state: np.ndarray  # int64 [n_instances, n_tiers, TierState.SIZE]
    jobs: np.ndarray  # int64 [n_instances, max_jobs, JobField.SIZE]
    jitter: np.ndarray  # float64 [n_instances, max_jobs]: the job's factor (<= 0: none)
    heap: np.ndarray  # int64 [n_instances, max_jobs]: job rows in service, a binary heap
    done: np.ndarray  # int64 [n_instances, max_jobs]: completed job rows, in order
    meta: np.ndarray  # int64 [n_instances, StationMeta.SIZE]
    rng: np.ndarray  # int64 [n_instances, gorand state]: the jitter streams (KVO-6.6)


def new_station(n_instances: int, n_read: list[int], n_write: list[int],
                base_latency: list[float], read_bw: list[float], write_bw: list[float],
                qsat: list[int], f1: list[float], sigma: list[float], max_jobs: int,
                rng_seed: int) -> StationState:
    """Empty stations for ``n_instances`` instances with one tier per list entry.

    ``rng_seed`` seeds every instance's jitter stream alike (the reference builds each
    instance's generator from the same run seed, KVO-6.6 / KVO-D5): pass
    ``subsystem_seed(seed, "kv-offload")``."""
    n_tiers = len(n_read)
    tier_int = np.zeros((max(n_tiers, 1), TierInt.SIZE), np.int64)
    tier_f = np.zeros((max(n_tiers, 1), TierFloat.SIZE), np.float64)
    for t in range(n_tiers):
        tier_int[t] = (n_read[t], n_write[t], int(go_round(float(base_latency[t]))), qsat[t])
        tier_f[t] = (read_bw[t], write_bw[t], f1[t], sigma[t])
    state = np.zeros((n_instances, max(n_tiers, 1), TierState.SIZE), np.int64)
    state[:, :n_tiers, TierState.FREE_READ] = tier_int[:n_tiers, TierInt.N_READ]
    state[:, :n_tiers, TierState.FREE_WRITE] = tier_int[:n_tiers, TierInt.N_WRITE]
    for col in (TierState.RQ_HEAD, TierState.RQ_TAIL, TierState.WQ_HEAD, TierState.WQ_TAIL):
        state[:, :, col] = -1
    rows = max(int(max_jobs), 1)
    jobs = np.zeros((n_instances, rows, JobField.SIZE), np.int64)
    jobs[:, :, JobField.NEXT] = np.arange(1, rows + 1)
    jobs[:, rows - 1, JobField.NEXT] = -1
    meta = np.zeros((n_instances, StationMeta.SIZE), np.int64)
    meta[:, StationMeta.FREE_HEAD] = 0
    src = new_source(int(rng_seed))
    return StationState(
        tier_int=tier_int, tier_f=tier_f, tier_state=state, jobs=jobs,
        jitter=np.zeros((n_instances, rows), np.float64),
        heap=np.zeros((n_instances, rows), np.int64),
        done=np.zeros((n_instances, rows), np.int64), meta=meta,
        rng=np.repeat(src[None, :], n_instances, axis=0))


@njit(cache=True, _nrt=False, error_model="numpy")
def effective_bandwidth(bw, q, qsat, f1):
    """The bandwidth of a job started at same-direction depth ``q`` (KVO-6.4): the full
    bandwidth without a ramp (``qsat < 2``, ``f1`` outside (0, 1)) or from depth ``qsat`` on,
    else ``bw × (f1 + (1 − f1)(q − 1)/(qsat − 1))``."""
    if qsat < 2 or f1 <= 0.0 or f1 >= 1.0:
        return bw
    if q < 1:
        q = 1
    if q >= qsat:
        return bw
    return bw * (f1 + (1.0 - f1) * np.float64(q - 1) / np.float64(qsat - 1))


@njit(cache=True, _nrt=False, error_model="numpy")
def service_ticks(st, t, direction, nbytes, q):
    """Service time of a job of ``nbytes`` on tier ``t`` started at depth ``q`` (KVO-6.2):
    the base latency plus the bytes over the effective bandwidth, truncated."""
    bw = st.tier_f[t, TierFloat.READ_BW] if direction == READ else st.tier_f[t, TierFloat.WRITE_BW]
    eff = effective_bandwidth(bw, q, st.tier_int[t, TierInt.QSAT], st.tier_f[t, TierFloat.F1])
    var = np.float64(nbytes) / eff
    if var >= np.float64(MAX_SERVICE_TICKS):
        v = MAX_SERVICE_TICKS
    else:
        v = np.int64(var)
    return st.tier_int[t, TierInt.BASE] + v


@njit(cache=True, _nrt=False, error_model="numpy")
def draw_jitter(st, i, t):
    """The jitter factor of a job submitted now on tier ``t`` of instance ``i`` (KVO-6.5): 0
    (no draw) without jitter, else ``max(0.05, 1 + N(0,1) × σ)`` from the instance's stream."""
    sigma = st.tier_f[t, TierFloat.SIGMA]
    if sigma <= 0.0:
        return 0.0
    f = 1.0 + norm_float64(st.rng[i]) * sigma
    if f < JITTER_MIN_FACTOR:
        f = JITTER_MIN_FACTOR
    return f


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _before(jobs, i, a, b):
    """True when job row ``a`` completes before row ``b`` (the heap order, KVO-6.7)."""
    for f in (JobField.COMPLETE_AT, JobField.SUBMIT, JobField.TIER, JobField.DIR, JobField.ID):
        if jobs[i, a, f] != jobs[i, b, f]:
            return jobs[i, a, f] < jobs[i, b, f]
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def _heap_push(st, i, j):
    h = st.heap
    n = st.meta[i, StationMeta.HEAP_LEN]
    h[i, n] = j
    st.meta[i, StationMeta.HEAP_LEN] = n + 1
    while n > 0:
        p = (n - 1) // 2
        if not _before(st.jobs, i, h[i, n], h[i, p]):
            break
        h[i, n], h[i, p] = h[i, p], h[i, n]
        n = p


@njit(cache=True, _nrt=False, error_model="numpy")
def _heap_pop(st, i):
    h = st.heap
    n = st.meta[i, StationMeta.HEAP_LEN] - 1
    top = h[i, 0]
    h[i, 0] = h[i, n]
    st.meta[i, StationMeta.HEAP_LEN] = n
    k = 0
    while True:
        c = 2 * k + 1
        if c >= n:
            break
        if c + 1 < n and _before(st.jobs, i, h[i, c + 1], h[i, c]):
            c += 1
        if not _before(st.jobs, i, h[i, c], h[i, k]):
            break
        h[i, c], h[i, k] = h[i, k], h[i, c]
        k = c
    return top


@njit(cache=True, _nrt=False, error_model="numpy")
def _start(st, i, t, j, server, tick):
    ts = st.tier_state
    jobs = st.jobs
    d = jobs[i, j, JobField.DIR]
    active = TierState.ACTIVE_READ if d == READ else TierState.ACTIVE_WRITE
    svc = service_ticks(st, t, d, jobs[i, j, JobField.BYTES], ts[i, t, active] + 1)
    f = st.jitter[i, j]
    if f > 0.0:
        x = go_round(np.float64(svc) * f)
        if x >= np.float64(MAX_SERVICE_TICKS):
            svc = MAX_SERVICE_TICKS
        else:
            svc = np.int64(x)
    jobs[i, j, JobField.SERVER] = server
    jobs[i, j, JobField.COMPLETE_AT] = tick + svc
    ts[i, t, active] += 1
    if d == READ:
        ts[i, t, TierState.READS] += 1
        ts[i, t, TierState.BYTES_READ] += jobs[i, j, JobField.BYTES]
    else:
        ts[i, t, TierState.WRITES] += 1
        ts[i, t, TierState.BYTES_WRITTEN] += jobs[i, j, JobField.BYTES]
    ts[i, t, TierState.QUEUE_WAIT] += tick - jobs[i, j, JobField.SUBMIT]
    _heap_push(st, i, j)


@njit(cache=True, _nrt=False, error_model="numpy")
def _pop_queue(st, i, t, head, tail):
    ts = st.tier_state
    j = ts[i, t, head]
    ts[i, t, head] = st.jobs[i, j, JobField.NEXT]
    if ts[i, t, head] < 0:
        ts[i, t, tail] = -1
    st.jobs[i, j, JobField.NEXT] = -1
    return j


@njit(cache=True, _nrt=False, error_model="numpy")
def _assign(st, i, t, tick):
    """Start queued jobs on tier ``t``'s free servers (KVO-6.1): read servers take the read
    queue first, then writes; write servers the write queue first, then reads."""
    ts = st.tier_state
    while ts[i, t, TierState.FREE_READ] > 0 and (ts[i, t, TierState.RQ_HEAD] >= 0
                                                  or ts[i, t, TierState.WQ_HEAD] >= 0):
        if ts[i, t, TierState.RQ_HEAD] >= 0:
            j = _pop_queue(st, i, t, TierState.RQ_HEAD, TierState.RQ_TAIL)
        else:
            j = _pop_queue(st, i, t, TierState.WQ_HEAD, TierState.WQ_TAIL)
        _start(st, i, t, j, READ, tick)
        ts[i, t, TierState.FREE_READ] -= 1
    while ts[i, t, TierState.FREE_WRITE] > 0 and (ts[i, t, TierState.WQ_HEAD] >= 0
                                                   or ts[i, t, TierState.RQ_HEAD] >= 0):
        if ts[i, t, TierState.WQ_HEAD] >= 0:
            j = _pop_queue(st, i, t, TierState.WQ_HEAD, TierState.WQ_TAIL)
        else:
            j = _pop_queue(st, i, t, TierState.RQ_HEAD, TierState.RQ_TAIL)
        _start(st, i, t, j, WRITE, tick)
        ts[i, t, TierState.FREE_WRITE] -= 1


@njit(cache=True, _nrt=False, error_model="numpy")
def advance(st, i, target):
    """Complete, in heap order, every job of instance ``i`` due at or before ``target``; each
    freed server starts queued work at the completion's tick (KVO-6.7). A target not after
    the station's clock does nothing."""
    meta = st.meta
    if target <= meta[i, StationMeta.LAST_TICK]:
        return
    jobs = st.jobs
    ts = st.tier_state
    while meta[i, StationMeta.HEAP_LEN] > 0:
        top = st.heap[i, 0]
        if jobs[i, top, JobField.COMPLETE_AT] > target:
            break
        j = _heap_pop(st, i)
        t = jobs[i, j, JobField.TIER]
        if jobs[i, j, JobField.SERVER] == READ:
            ts[i, t, TierState.FREE_READ] += 1
        else:
            ts[i, t, TierState.FREE_WRITE] += 1
        if jobs[i, j, JobField.DIR] == READ:
            ts[i, t, TierState.ACTIVE_READ] -= 1
        else:
            ts[i, t, TierState.ACTIVE_WRITE] -= 1
        st.done[i, meta[i, StationMeta.DONE_LEN]] = j
        meta[i, StationMeta.DONE_LEN] += 1
        _assign(st, i, t, jobs[i, j, JobField.COMPLETE_AT])
    meta[i, StationMeta.LAST_TICK] = target


@njit(cache=True, _nrt=False, error_model="numpy")
def submit(st, i, t, direction, nbytes, tick, jitter, tag):
    """Queue a job on tier ``t`` of instance ``i`` at ``tick`` (the station first advances to
    it) and start it if a server is free; returns its row, or -1 when every row is taken
    (the caller sized the rows so that this cannot happen). Queues are unbounded (KVO-6.1)."""
    advance(st, i, tick)
    meta = st.meta
    j = meta[i, StationMeta.FREE_HEAD]
    if j < 0:
        return np.int64(-1)
    jobs = st.jobs
    meta[i, StationMeta.FREE_HEAD] = jobs[i, j, JobField.NEXT]
    meta[i, StationMeta.NEXT_ID] += 1
    jobs[i, j, JobField.ID] = meta[i, StationMeta.NEXT_ID]
    jobs[i, j, JobField.TIER] = t
    jobs[i, j, JobField.DIR] = direction
    jobs[i, j, JobField.BYTES] = nbytes
    jobs[i, j, JobField.SUBMIT] = tick
    jobs[i, j, JobField.COMPLETE_AT] = 0
    jobs[i, j, JobField.NEXT] = -1
    jobs[i, j, JobField.TAG] = tag
    st.jitter[i, j] = jitter
    ts = st.tier_state
    head = TierState.RQ_HEAD if direction == READ else TierState.WQ_HEAD
    tail = TierState.RQ_TAIL if direction == READ else TierState.WQ_TAIL
    if ts[i, t, tail] >= 0:
        jobs[i, ts[i, t, tail], JobField.NEXT] = j
    else:
        ts[i, t, head] = j
    ts[i, t, tail] = j
    start = max(tick, meta[i, StationMeta.LAST_TICK])
    _assign(st, i, t, start)
    return j


@njit(cache=True, _nrt=False, error_model="numpy")
def poll(st, i, now):
    """Advance instance ``i``'s station to ``now``; returns how many jobs completed since the
    last poll (submits advance it too): their rows are ``st.done[i, :n]``, in completion
    order. The caller applies them, frees each (:func:`free_job`) and clears the list
    (:func:`clear_done`)."""
    advance(st, i, now)
    return st.meta[i, StationMeta.DONE_LEN]


@njit(cache=True, _nrt=False, error_model="numpy")
def clear_done(st, i):
    """Forget the completions :func:`poll` handed over."""
    st.meta[i, StationMeta.DONE_LEN] = 0


@njit(cache=True, _nrt=False, error_model="numpy")
def free_job(st, i, j):
    """Return job row ``j`` to the free rows."""
    st.jobs[i, j, JobField.NEXT] = st.meta[i, StationMeta.FREE_HEAD]
    st.meta[i, StationMeta.FREE_HEAD] = j
