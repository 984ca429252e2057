"""LoRA multi-adapter serving in the engine (spec lora.md, LORA-3..LORA-5, LORA-7.2): each
instance's resident-adapter set with pins and LRU order, the cold-load trigger and gate, the
load completion, the per-step overhead factor and the routing snapshot of the resident sets.

The state is one :class:`LoraState` of arrays, passed to the event loop as ``lora``; a run
without active LoRA passes None and compiles none of this (byte-identical outputs, LORA-0.3).
Adapters are the indices of ``RequestTable.adapter_names`` (``RequestInputs.adapter``, -1 =
base model); each has its declared rank (0 = not in the registry, LORA-4.8) and its load time
in ticks. A resident set is a row of ``res`` (adapter indices, least recently used first) with
``resident``/``pins`` per (instance, adapter) for O(1) membership and pin counts. Nothing here
allocates.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.engine.latency import Backend, clamp_to_int64
from blis_fast.kernels.engine.state import HotField, QueueField
from blis_fast.kernels.jit import njit


class LoraVarT(NamedTuple):
    """Slots of ``LoraState.var``."""

    CAPACITY: int = 0  # resident adapter slots per instance (> 0)
    STAMP: int = 1  # the step factor's distinct-adapter stamp counter
    STALL_STEPS: int = 2  # steps that formed an empty batch behind a cold head whose load
    # could not start (every slot pinned): the LORA-D1 stall
    FIRST_STALL: int = 3  # tick of the first such step (-1 = none)
    STALL_INST: int = 4  # its instance
    LOG_LEN: int = 5  # entries of LoraState.log used
    LOG_LOST: int = 6  # entries that did not fit
    SIZE: int = 7


LoraVar = LoraVarT()


class LoraLogT(NamedTuple):
    """Columns of ``LoraState.log`` (one row per eviction or completed load, in event order)."""

    TICK: int = 0
    INSTANCE: int = 1
    ADAPTER: int = 2
    KIND: int = 3  # LoraEvent
    SIZE: int = 4


LoraLog = LoraLogT()


class LoraEventT(NamedTuple):
    """Kinds of ``LoraState.log`` rows."""

    EVICTED: int = 0  # at a load start, to free its slot (LORA-4.2)
    LOADED: int = 1  # a load completed (LORA-4.4)


LoraEvent = LoraEventT()


class LoraState(NamedTuple):
    """Per-adapter configuration and per-instance adapter state (``blis_fast/engine/packing.py:
    lora_state`` builds it)."""

    var: np.ndarray  # int64 [LoraVar.SIZE]
    rank: np.ndarray  # int64 [A] declared rank, 0 = unregistered (no overhead, LORA-5.1)
    ticks: np.ndarray  # int64 [A] load duration, max(1, ceil(L)) (LORA-4.3)
    tier_key: np.ndarray  # int64 [T] step-overhead tier ranks, ascending
    tier_k6: np.ndarray  # float64 [T]
    tier_k7: np.ndarray  # float64 [T]
    res: np.ndarray  # int64 [N, C] resident adapters, least recently used first
    res_len: np.ndarray  # int64 [N]
    resident: np.ndarray  # int8 [N, A]
    pins: np.ndarray  # int64 [N, A] pin counts of resident adapters
    loading: np.ndarray  # int64 [N] adapter whose load is in flight (-1 = none)
    load_at: np.ndarray  # int64 [N] its completion tick
    load_new: np.ndarray  # int8 [N] 1 = started this step, its event not pushed yet
    blocked: np.ndarray  # int8 [N] 1 = this step's load could not start (every slot pinned)
    loads: np.ndarray  # int64 [N, A] completed loads (LORA-8.2 load_count)
    evictions: np.ndarray  # int64 [N, A] evictions (eviction_count)
    pinned: np.ndarray  # int8 [rows] the request holds a pin on its adapter
    snap: np.ndarray  # int8 [N, A] the routing snapshot of the resident sets (LORA-7.2)
    snap_last: np.ndarray  # int64 [N] its last refresh tick
    stamp: np.ndarray  # int64 [A] scratch of the step factor
    log: np.ndarray  # int64 [K, LoraLog.SIZE] evictions and completed loads (the first K)


def new_lora_state(n_inst: int, n_rows: int, capacity: int, rank: np.ndarray,
                   ticks: np.ndarray, tiers: tuple, log_rows: int = 0) -> LoraState:
    """A fresh state: every resident set empty, no load in flight; room for ``log_rows``
    log entries (default: four per request row)."""
    a = rank.shape[0]
    var = np.zeros(LoraVar.SIZE, np.int64)
    var[LoraVar.CAPACITY] = capacity
    var[LoraVar.FIRST_STALL] = -1
    var[LoraVar.STALL_INST] = -1
    return LoraState(
        var=var, rank=np.ascontiguousarray(rank, np.int64),
        ticks=np.ascontiguousarray(ticks, np.int64),
        tier_key=np.array([t[0] for t in tiers], np.int64),
        tier_k6=np.array([t[1] for t in tiers], np.float64),
        tier_k7=np.array([t[2] for t in tiers], np.float64),
        res=np.full((n_inst, capacity), -1, np.int64), res_len=np.zeros(n_inst, np.int64),
        resident=np.zeros((n_inst, a), np.int8), pins=np.zeros((n_inst, a), np.int64),
        loading=np.full(n_inst, -1, np.int64), load_at=np.zeros(n_inst, np.int64),
        load_new=np.zeros(n_inst, np.int8), blocked=np.zeros(n_inst, np.int8),
        loads=np.zeros((n_inst, a), np.int64), evictions=np.zeros((n_inst, a), np.int64),
        pinned=np.zeros(n_rows, np.int8), snap=np.zeros((n_inst, a), np.int8),
        snap_last=np.zeros(n_inst, np.int64), stamp=np.zeros(a, np.int64),
        log=np.zeros((log_rows or 4 * n_rows + 64, LoraLog.SIZE), np.int64))


@njit(cache=True, _nrt=False, error_model="numpy")
def _log(lora, tick, i, a, kind):
    """Append an eviction or a completed load to the log (counted as lost when it is full)."""
    k = lora.var[LoraVar.LOG_LEN]
    if k >= lora.log.shape[0]:
        lora.var[LoraVar.LOG_LOST] += 1
        return
    lora.log[k, LoraLog.TICK] = tick
    lora.log[k, LoraLog.INSTANCE] = i
    lora.log[k, LoraLog.ADAPTER] = a
    lora.log[k, LoraLog.KIND] = kind
    lora.var[LoraVar.LOG_LEN] = k + 1


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def adapter_of(inp, rs, r):
    """Request ``r``'s adapter as the instance sees it: a P/D decode sub-request carries none
    (LORA-2.4)."""
    if rs.pd_sub[r] == 1:
        return np.int64(-1)
    return np.int64(inp.adapter[r])


# ------------------------------------------------------------------ the resident set (LORA-3)


@njit(cache=True, _nrt=False, error_model="numpy")
def _remove_at(lora, i, k):
    """Take the ``k``-th entry out of instance ``i``'s LRU row (the later ones move up)."""
    n = lora.res_len[i]
    for j in range(k, n - 1):
        lora.res[i, j] = lora.res[i, j + 1]
    lora.res[i, n - 1] = -1
    lora.res_len[i] = n - 1


@njit(cache=True, _nrt=False, error_model="numpy")
def touch(lora, i, a):
    """Move resident adapter ``a`` to the most recently used end (no-op when not resident)."""
    if lora.resident[i, a] == 0:
        return
    n = lora.res_len[i]
    for k in range(n):
        if lora.res[i, k] == a:
            _remove_at(lora, i, k)
            lora.res[i, n - 1] = a
            lora.res_len[i] = n
            return


@njit(cache=True, _nrt=False, error_model="numpy")
def evict_lru(lora, i):
    """EvictLRU (LORA-3.5): remove the least recently used unpinned adapter; -1 when every
    resident adapter is pinned."""
    for k in range(lora.res_len[i]):
        a = lora.res[i, k]
        if lora.pins[i, a] == 0:
            _remove_at(lora, i, k)
            lora.resident[i, a] = 0
            return a
    return np.int64(-1)


@njit(cache=True, _nrt=False, error_model="numpy")
def _store(lora, i, a):
    """Store (LORA-3.5): touch a resident adapter, else append it (evicting when full: never
    after a load start's eviction). False when full and every adapter pinned."""
    if lora.resident[i, a] == 1:
        touch(lora, i, a)
        return True
    if lora.res_len[i] >= lora.var[LoraVar.CAPACITY]:
        if evict_lru(lora, i) < 0:
            return False
    lora.res[i, lora.res_len[i]] = a
    lora.res_len[i] += 1
    lora.resident[i, a] = 1
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def on_admitted(lora, inp, rs, i, r):
    """Admission touch (LORA-3.2): the admitted request's adapter becomes the most recently
    used, and the request pins it once (a re-admitted preempted request keeps its pin)."""
    a = adapter_of(inp, rs, r)
    if a < 0:
        return
    touch(lora, i, a)
    if lora.pinned[r] == 0:
        if lora.resident[i, a] == 1:
            lora.pins[i, a] += 1
        lora.pinned[r] = 1


@njit(cache=True, _nrt=False, error_model="numpy")
def unpin(lora, inp, rs, i, r):
    """Release request ``r``'s pin (LORA-3.3: completion, timeout), idempotently."""
    if lora.pinned[r] == 0:
        return
    lora.pinned[r] = 0
    a = adapter_of(inp, rs, r)
    if a >= 0 and lora.resident[i, a] == 1 and lora.pins[i, a] > 0:
        lora.pins[i, a] -= 1


# ------------------------------------------------------------------ the cold-load gate (LORA-4)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def is_cold(lora, inp, rs, i, r):
    """True when request ``r`` waits for an adapter not resident on instance ``i`` (the gate
    stops batch formation at it, LORA-4.5)."""
    a = adapter_of(inp, rs, r)
    return a >= 0 and lora.resident[i, a] == 0


@njit(cache=True, _nrt=False, error_model="numpy")
def maybe_start_load(lora, ins, inp, rs, i, now):
    """The trigger (LORA-4.1/4.2/4.3), after the queue's reorder and before batch formation:
    with no load in flight and a cold head, free a slot (evicting the LRU unpinned adapter
    when full; when every adapter is pinned nothing starts: ``blocked``) and start the head's
    load, its completion event pushed by the loop (``load_new``)."""
    lora.blocked[i] = 0
    if lora.loading[i] >= 0:
        return
    head = ins.wq[i, QueueField.HEAD]
    if head < 0 or not is_cold(lora, inp, rs, i, head):
        return
    a = adapter_of(inp, rs, head)
    if lora.res_len[i] >= lora.var[LoraVar.CAPACITY]:
        victim = evict_lru(lora, i)
        if victim < 0:
            lora.blocked[i] = 1
            return
        lora.evictions[i, victim] += 1
        _log(lora, now, i, victim, LoraEvent.EVICTED)
    lora.loading[i] = a
    lora.load_at[i] = now + lora.ticks[a]
    lora.load_new[i] = 1


@njit(cache=True, _nrt=False, error_model="numpy")
def note_stall(lora, ins, i, now):
    """Count a step whose load could not start and that left the batch empty (LORA-D1: the
    instance spins empty steps until a timeout, an admissible arrival or the horizon)."""
    if lora.blocked[i] == 1 and ins.batch_len[i] == 0:
        if lora.var[LoraVar.STALL_STEPS] == 0:
            lora.var[LoraVar.FIRST_STALL] = now
            lora.var[LoraVar.STALL_INST] = i
        lora.var[LoraVar.STALL_STEPS] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def complete_load(lora, i, a, now):
    """Load completion (LORA-4.4): the adapter becomes resident (most recently used), its load
    counts, and the instance may start the next one."""
    if _store(lora, i, a):
        lora.loads[i, a] += 1
        _log(lora, now, i, a, LoraEvent.LOADED)
    lora.loading[i] = -1


# ------------------------------------------------------------------ step overhead (LORA-5)


@njit(cache=True, _nrt=False, error_model="numpy")
def _tier(lora, rank):
    """The tier of ``rank`` (LORA-5.2): the exact key, else the nearest, ties to the lower."""
    keys = lora.tier_key
    for t in range(keys.shape[0]):
        if keys[t] == rank:
            return t
    best = 0
    dist = abs(rank - keys[0])
    for t in range(1, keys.shape[0]):
        d = abs(rank - keys[t])
        if d < dist:
            best = t
            dist = d
    return best


@njit(cache=True, _nrt=False, error_model="numpy")
def overhead_factor(lora, ins, rs, inp, i):
    """The step's overhead factor (LORA-5.1) over the requests granted tokens: 1 + k6/k7 x the
    distinct registered adapters, the tier of their largest rank; 1 with none or no tiers."""
    stamp = lora.var[LoraVar.STAMP] + 1
    lora.var[LoraVar.STAMP] = stamp
    count = 0
    max_rank = np.int64(0)
    for q in range(ins.batch_len[i]):
        r = ins.batch[i, q]
        if rs.hot[r, HotField.NEW_TOKENS] <= 0:
            continue
        a = adapter_of(inp, rs, r)
        if a < 0 or lora.rank[a] <= 0 or lora.stamp[a] == stamp:
            continue
        lora.stamp[a] = stamp
        count += 1
        if lora.rank[a] > max_rank:
            max_rank = lora.rank[a]
    if count == 0 or lora.tier_key.shape[0] == 0:
        return 1.0
    t = _tier(lora, max_rank)
    return 1.0 + (lora.tier_k6[t] / lora.tier_k7[t]) * np.float64(count)


@njit(cache=True, _nrt=False, error_model="numpy")
def with_overhead(lora, ins, rs, inp, i, backend, base):
    """The backend's step time ``base`` (>= 1) times the factor, for the roofline and
    trained-physics backends only (LORA-5.3: truncated, at least 1)."""
    if backend != Backend.ROOFLINE and backend != Backend.TRAINED_PHYSICS:
        return base
    f = overhead_factor(lora, ins, rs, inp, i)
    if not (f > 1.0) or np.isinf(f):
        return base
    return max(np.int64(1), clamp_to_int64(np.float64(base) * f))


# ------------------------------------------------------------------ routing (LORA-7)


@njit(cache=True, _nrt=False, error_model="numpy")
def refresh_snapshots(lora, period, group_last, group, clock, insts, n):
    """Refresh the resident-set snapshots of ``insts[:n]`` with the queue-depth group's mode
    (LORA-7.2): always when ``period`` <= 0, else when that group was refreshed at ``clock``
    (``group_last[:, group]``: its refresh ticks, just updated by ``routing.take_snapshots``)."""
    for k in range(n):
        i = insts[k]
        if period <= 0 or (group_last[i, group] == clock and lora.snap_last[i] < clock):
            for a in range(lora.resident.shape[1]):
                lora.snap[i, a] = lora.resident[i, a]
            lora.snap_last[i] = clock


@njit(cache=True, _nrt=False, error_model="numpy")
def fill_affinity(lora, warm, adapter, cand, n):
    """The lora-affinity scorer's values (LORA-7.1) into ``warm[:n]``: 1 everywhere for a
    base-model request or when all candidates agree, else 1 where the adapter is in the
    snapshot and 0 where it is not."""
    for k in range(n):
        warm[k] = 1.0
    if adapter < 0 or n < 2:
        return
    first = lora.snap[cand[0], adapter]
    same = True
    for k in range(1, n):
        if lora.snap[cand[k], adapter] != first:
            same = False
            break
    if same:
        return
    for k in range(n):
        warm[k] = np.float64(lora.snap[cand[k], adapter])
