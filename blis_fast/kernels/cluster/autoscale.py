"""The autoscaler, node pools and instance lifecycle (AS-x, reference f90a1e3a).

* Instances have a lifecycle state (``enums.Lifecycle``): Loading (placed, not serving yet),
  Active (routable), Draining (takes no new requests, finishes its work), Terminated. Routing
  and admission see only Active instances, in index order (``RouterState.routable``).
* Node pools are a static inventory of nodes and GPUs; an instance is placed first-fit on the
  first node (pools in declaration order) of its GPU type with ``tp`` free GPUs (AS-2).
* The autoscaler ticks at t = 0 and every interval (AS-4): it collects the routable instances'
  KV capacity, KV tokens in use and queue depth, the saturation analyzer turns them into a
  scale-up or scale-down signal, the engine into a replica count for one variant (GPU type,
  TP), the stabilization windows gate it, and an actuation event applies it after the scrape
  delay: placements of new (Loading) instances, or drains of the byte-wise smallest ids.

All state is one :class:`AutoscaleState` (``None`` for a fixed fleet: the event loop then
compiles without any of this). Every function touches only preallocated arrays.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.cluster.autoscale_layout import (
    ACT_DELTA,
    ACT_LABEL,
    ACT_TP,
    NO_TIME,
    AsInst,
    AsParam,
    AsVar,
    AutoscaleState,
    Signal,
)
from blis_fast.kernels.cluster.router_state import RouterVar, SnapField
from blis_fast.kernels.cluster.routing import refresh_cache_signal, take_snapshots
from blis_fast.kernels.engine.heap import heap_push, make_tie
from blis_fast.kernels.engine.state import InstanceCounter, InstanceSlot, LoopSlot, QueueField
from blis_fast.kernels.enums import Event, EventPriority, InstanceKind, Lifecycle
from blis_fast.kernels.go.gomath import INT64_MAX, go_f2i
from blis_fast.kernels.go.gorand import norm_float64
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.kv.kv_layout import KVConfig, KVMeta

_ID_BASE = np.int64(11)
_ID_DIGITS = 17


@njit(cache=True, _nrt=False, error_model="numpy")
def id_key(kind, number):
    """An integer whose order is the byte order of the instance ids that can coexist:
    ``autoscale-<model>-<%06d>`` (all before ``instance_<n>``: 'a' < 'i'), then the digits as
    printed (shorter strings first only where they are a prefix)."""
    width = 6 if kind == InstanceKind.AUTOSCALED else 1
    digits = 1
    x = number
    while x >= 10:
        x //= 10
        digits += 1
    if digits < width:
        digits = width
    key = np.int64(0)
    for k in range(_ID_DIGITS):
        key *= _ID_BASE
        if k < digits:
            p = np.int64(1)
            for _ in range(digits - 1 - k):
                p *= 10
            key += (number // p) % 10 + 1
    if kind == InstanceKind.STARTUP:
        p = np.int64(1)
        for _ in range(_ID_DIGITS):
            p *= _ID_BASE
        key += p
    return key


@njit(cache=True, _nrt=False, error_model="numpy")
def sample_delay_us(mean, std, rng):
    """A delay in seconds drawn as the reference does (AS-3.3): ``mean`` when ``std`` <= 0
    (no draw), else mean + std * N(0,1) floored at 0; NaN/Inf give 0; µs truncated as Go's
    int64 conversion."""
    secs = mean
    if std > 0:
        secs = norm_float64(rng) * std + mean
        if secs < 0:
            secs = 0.0
    if secs != secs or secs == np.inf or secs == -np.inf:
        secs = 0.0
    return go_f2i(secs * 1e6)


# ------------------------------------------------------------------ placement (AS-2)


@njit(cache=True, _nrt=False, error_model="numpy")
def place(asc, label, tp):
    """First-fit node for ``tp`` GPUs of label ``label`` (-1: any label), or -1. Nothing
    changes here (``allocate`` takes the GPUs)."""
    for node in range(asc.node_label.shape[0]):
        if (label < 0 or asc.node_label[node] == label) and asc.node_free[node] >= tp:
            return node
    return -1


@njit(cache=True, _nrt=False, error_model="numpy")
def placeable(asc, label, tp):
    """How many instances of ``tp`` GPUs of ``label`` fit now (a bound for room checks)."""
    n = 0
    for node in range(asc.node_label.shape[0]):
        if asc.node_label[node] == label:
            n += asc.node_free[node] // max(tp, 1)
    return n


@njit(cache=True, _nrt=False, error_model="numpy")
def allocate(asc, node, tp, i):
    """Give instance ``i`` the first ``tp`` free GPUs of ``node`` (by GPU index)."""
    left = tp
    for g in range(asc.node_gpu0[node], asc.node_gpu0[node + 1]):
        if left == 0:
            break
        if asc.gpu_owner[g] < 0:
            asc.gpu_owner[g] = i
            left -= 1
    asc.node_free[node] -= tp


@njit(cache=True, _nrt=False, error_model="numpy")
def release(asc, i):
    """Free instance ``i``'s GPUs (all on its node)."""
    node = asc.inst[i, AsInst.NODE]
    if node < 0:
        return
    for g in range(asc.node_gpu0[node], asc.node_gpu0[node + 1]):
        if asc.gpu_owner[g] == i:
            asc.gpu_owner[g] = -1
            asc.node_free[node] += 1


# ------------------------------------------------------------------ lifecycle (AS-3)


@njit(cache=True, _nrt=False, error_model="numpy")
def rebuild_routable(asc, rt):
    """``rt.routable``: the Active instances in index order (CLU-3.7 over lifecycle states)."""
    n = 0
    for i in range(asc.var[AsVar.COUNT]):
        if asc.inst[i, AsInst.STATE] == Lifecycle.ACTIVE:
            rt.routable[n] = i
            n += 1
    rt.st[RouterVar.N_ROUTABLE] = n


@njit(cache=True, _nrt=False, error_model="numpy")
def build_instance(asc, kv, inst_cfg, inst_rank, kind, number, node, label, tp, t):
    """A new instance at the next row, placed (GPUs taken when ``node`` >= 0), with its GPU
    label's KV capacity and max-model-len; state Loading. Returns its index."""
    i = asc.var[AsVar.COUNT]
    asc.var[AsVar.COUNT] = i + 1
    row = asc.inst[i]
    row[AsInst.STATE] = Lifecycle.LOADING
    row[AsInst.KIND] = kind
    row[AsInst.NUMBER] = number
    row[AsInst.ID_KEY] = id_key(kind, number)
    row[AsInst.NODE] = node
    row[AsInst.LABEL] = label
    row[AsInst.TP] = tp
    row[AsInst.PLACED] = t
    row[AsInst.READY] = -1
    row[AsInst.DRAINED] = -1
    row[AsInst.TERMINATED] = -1
    asc.cost[i] = asc.label_cost[label]
    inst_rank[i] = row[AsInst.ID_KEY]
    if node >= 0:
        allocate(asc, node, tp, i)
    blocks = asc.label_blocks[label]
    if kv.meta[i, KVMeta.TOTAL] != blocks:
        kvc.reset_instance_blocks(kv, i, blocks)
    inst_cfg[i, InstanceSlot.MAX_MODEL_LEN] = asc.label_max_len[label]
    return i


@njit(cache=True, _nrt=False, error_model="numpy")
def activate(asc, rt, i, t):
    """Loading -> Active: the instance becomes routable."""
    asc.inst[i, AsInst.STATE] = Lifecycle.ACTIVE
    asc.inst[i, AsInst.READY] = t
    rebuild_routable(asc, rt)


@njit(cache=True, _nrt=False, error_model="numpy")
def on_instance_loaded(asc, rt, t, i):
    """InstanceLoadedEvent: the loading delay is over."""
    if asc.inst[i, AsInst.STATE] == Lifecycle.LOADING:
        activate(asc, rt, i, t)


@njit(cache=True, _nrt=False, error_model="numpy")
def after_instance_event(asc, ins, i, t):
    """The reference's termination check after every event of instance ``i``: a draining
    instance with an empty wait queue and batch terminates and frees its GPUs (AS-3.9)."""
    if (asc.inst[i, AsInst.STATE] == Lifecycle.DRAINING and ins.wq[i, QueueField.LEN] == 0
            and ins.batch_len[i] == 0):
        asc.inst[i, AsInst.STATE] = Lifecycle.TERMINATED
        asc.inst[i, AsInst.TERMINATED] = t
        release(asc, i)


@njit(cache=True, _nrt=False, error_model="numpy")
def push_cluster_event(heap, t, priority, kind, payload):
    """Schedule a cluster event with the next sequence number (room checked by the loop)."""
    seq = heap.loop[LoopSlot.NEXT_SEQ]
    heap.loop[LoopSlot.NEXT_SEQ] = seq + 1
    heap.loop[LoopSlot.HEAP_SIZE] = heap_push(
        heap.times, heap.ties, heap.kinds, heap.payloads, heap.loop[LoopSlot.HEAP_SIZE], t,
        make_tie(False, 0, priority, seq), kind, payload)


@njit(cache=True, _nrt=False, error_model="numpy")
def start_instance(asc, rt, heap, i, t, warm):
    """A placed instance starts: Active at once when warm-started or its loading delay is 0,
    else an InstanceLoaded event after the delay (drawn from the instance-loading stream)."""
    if not warm:
        delay = sample_delay_us(asc.par[AsParam.LOAD_MEAN], asc.par[AsParam.LOAD_STD],
                                asc.rng_loading)
        if delay != 0:
            push_cluster_event(heap, t + delay, EventPriority.INSTANCE_LIFECYCLE,
                               Event.INSTANCE_LOADED, i)
            return
    activate(asc, rt, i, t)


# ------------------------------------------------------------------ the tick (AS-4)


@njit(cache=True, _nrt=False, error_model="numpy")
def _variant(asc, nv, label, tp):
    for v in range(nv):
        if asc.v_label[v] == label and asc.v_tp[v] == tp:
            return v
    return -1


@njit(cache=True, _nrt=False, error_model="numpy")
def _sort_variants(asc, nv, descending_cost):
    """``v_order``: variants by cost (ascending or descending), then label, then TP."""
    for v in range(nv):
        asc.v_order[v] = v
    for a in range(1, nv):
        x = asc.v_order[a]
        b = a - 1
        while b >= 0:
            y = asc.v_order[b]
            cx, cy = asc.v_cost[x], asc.v_cost[y]
            if descending_cost:
                before = cx > cy
                same = cx == cy
            else:
                before = cx < cy
                same = cx == cy
            if not (before or (same and (asc.v_label[x] < asc.v_label[y] or (
                    asc.v_label[x] == asc.v_label[y] and asc.v_tp[x] < asc.v_tp[y])))):
                break
            asc.v_order[b + 1] = y
            b -= 1
        asc.v_order[b + 1] = x


@njit(cache=True, _nrt=False, error_model="numpy")
def _collect(asc, rt, kv):
    """Aggregate the routable replicas per variant (AS-4.5..4.8): supply = capacity tokens x
    KV threshold, demand = tokens in use + queue depth x average input, all as the snapshots
    show them. With periodic snapshots a replica whose KV group was never refreshed shows no
    capacity (its snapshot starts empty) and is left out, as the reference's analyzer skips
    it, instead of counting as a full cache. Returns the number of variants."""
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    kvth = asc.par[AsParam.KV_THRESHOLD]
    avg = asc.par[AsParam.AVG_INPUT]
    nv = 0
    for k in range(rt.st[RouterVar.N_ROUTABLE]):
        i = rt.routable[k]
        total = rt.snap_i[i, SnapField.TOTAL]
        cap = total * bs
        if cap <= 0:
            asc.var[AsVar.SKIPPED_UNREFRESHED] += 1
            continue
        used = (total - rt.snap_i[i, SnapField.FREE]) * bs
        label = asc.inst[i, AsInst.LABEL]
        tp = max(asc.inst[i, AsInst.TP], 1)
        v = _variant(asc, nv, label, tp)
        if v < 0:
            v = nv
            nv += 1
            asc.v_label[v] = label
            asc.v_tp[v] = tp
            asc.v_count[v] = 0
            asc.v_supply[v] = 0.0
            asc.v_demand[v] = 0.0
            asc.v_cost[v] = asc.cost[i]
        asc.v_supply[v] += np.float64(cap) * kvth
        asc.v_demand[v] += np.float64(used) + np.float64(rt.snap_i[i, SnapField.QUEUE]) * avg
        asc.v_count[v] += 1
    return nv


@njit(cache=True, _nrt=False, error_model="numpy")
def _decide(asc, rt, kv):
    """Analyzer and engine (AS-6): returns (delta, label, tp); delta 0 = no decision."""
    nv = _collect(asc, rt, kv)
    if nv == 0:
        return np.int64(0), np.int64(-1), np.int64(0)
    _sort_variants(asc, nv, False)
    supply = 0.0
    demand = 0.0
    replicas = 0
    for j in range(nv):
        v = asc.v_order[j]
        supply += asc.v_supply[v]
        demand += asc.v_demand[v]
        replicas += asc.v_count[v]
    pending_cap = np.int64(0)
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    for i in range(asc.var[AsVar.COUNT]):
        if asc.inst[i, AsInst.STATE] == Lifecycle.LOADING:
            cap = kv.meta[i, KVMeta.TOTAL] * bs
            if cap > 0:
                pending_cap += cap
    kvth = asc.par[AsParam.KV_THRESHOLD]
    pending = np.float64(pending_cap) * kvth if pending_cap > 0 else 0.0
    required = demand / asc.par[AsParam.UP_THRESHOLD] - (supply + pending)
    asc.sig[Signal.SUPPLY] = supply
    asc.sig[Signal.DEMAND] = demand
    asc.sig[Signal.PENDING] = pending
    asc.sig[Signal.AMOUNT] = required
    if required > 0:
        v = asc.v_order[0]
        prc = 0.0
        if asc.v_count[v] > 0 and asc.v_supply[v] > 0:
            prc = asc.v_supply[v] / np.float64(asc.v_count[v])
        n = np.int64(1)
        if prc > 0:
            n = max(np.int64(1), go_f2i(np.ceil(required / prc)))
        return n, asc.v_label[v], asc.v_tp[v]
    if replicas < 2:
        return np.int64(0), np.int64(-1), np.int64(0)
    low = demand / asc.par[AsParam.DOWN_BOUNDARY]
    spare = supply - low
    asc.sig[Signal.AMOUNT] = spare
    if not spare > 0:
        return np.int64(0), np.int64(-1), np.int64(0)
    top = 0.0
    for j in range(nv):
        v = asc.v_order[j]
        if asc.v_count[v] > 0:
            per = asc.v_supply[v] / np.float64(asc.v_count[v])
            if per > top:
                top = per
    if not supply - top > low:
        return np.int64(0), np.int64(-1), np.int64(0)
    _sort_variants(asc, nv, True)
    for j in range(nv):
        v = asc.v_order[j]
        if asc.v_count[v] <= 0:
            continue
        n = np.int64(1)
        if asc.v_supply[v] > 0:
            prc = asc.v_supply[v] / np.float64(asc.v_count[v])
            if prc > 0:
                n = go_f2i(np.floor(spare / prc))
            n = min(max(n, np.int64(1)), asc.v_count[v])
        return -n, asc.v_label[v], asc.v_tp[v]
    return np.int64(0), np.int64(-1), np.int64(0)


@njit(cache=True, _nrt=False, error_model="numpy")
def _bounded(asc, delta):
    """Our min/max replicas (only when given): the delta clamped so Active + Loading stays
    within them (0 = no decision)."""
    lo = asc.var[AsVar.MIN_REPLICAS]
    hi = asc.var[AsVar.MAX_REPLICAS]
    if lo < 0 and hi < 0:
        return delta
    count = 0
    active = 0
    for i in range(asc.var[AsVar.COUNT]):
        s = asc.inst[i, AsInst.STATE]
        if s == Lifecycle.ACTIVE:
            active += 1
            count += 1
        elif s == Lifecycle.LOADING:
            count += 1
    if delta > 0 and hi >= 0:
        delta = max(np.int64(0), min(delta, hi - count))
    if delta < 0 and lo >= 0:
        room = count - lo
        if lo >= 1:
            room = min(room, active - 1)
        delta = -max(np.int64(0), min(-delta, room))
    return delta


@njit(cache=True, _nrt=False, error_model="numpy")
def _gate(asc, t, delta):
    """The stabilization windows (AS-4.5): True when the decision passes this tick."""
    up = delta > 0
    if not up:
        asc.var[AsVar.UP_FIRST] = NO_TIME
    if delta >= 0:
        asc.var[AsVar.DOWN_FIRST] = NO_TIME
    if delta == 0:
        return False
    slot = AsVar.UP_FIRST if up else AsVar.DOWN_FIRST
    window = asc.par[AsParam.UP_WINDOW] if up else asc.par[AsParam.DOWN_WINDOW]
    first = asc.var[slot]
    if first == NO_TIME:
        asc.var[slot] = t
        if window > 0:
            return False
        first = t
    if t - first < go_f2i(window):
        return False
    asc.var[slot] = NO_TIME
    asc.sig[Signal.SINCE] = first
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def on_scaling_tick(asc, ins, rt, kv, heap, t):
    """ScalingTickEvent: collect (the routable instances' snapshots, refreshed as for a routing
    decision), analyze, optimize, gate, schedule the actuation after the scrape delay, then
    the next tick unless nothing can happen any more (AS-4.2)."""
    refresh_cache_signal(rt, kv, t)
    take_snapshots(rt, ins, kv, t, rt.routable, rt.st[RouterVar.N_ROUTABLE])
    skipped = asc.var[AsVar.SKIPPED_UNREFRESHED]
    delta, label, tp = _decide(asc, rt, kv)
    if asc.var[AsVar.SKIPPED_UNREFRESHED] > skipped:
        asc.var[AsVar.LAST_SKIP_AT] = t
    if delta != 0:
        delta = _bounded(asc, delta)
    if _gate(asc, t, delta):
        row = asc.var[AsVar.N_ACTUATIONS] % asc.act.shape[0]
        asc.var[AsVar.N_ACTUATIONS] += 1
        asc.act[row, ACT_DELTA] = delta
        asc.act[row, ACT_LABEL] = label
        asc.act[row, ACT_TP] = tp
        asc.sig[Signal.TICK] = t
        asc.sig[Signal.DELTA] = delta
        for k in range(Signal.SIZE):
            asc.act_sig[row, k] = asc.sig[k]
        delay = sample_delay_us(asc.par[AsParam.SCRAPE_MEAN], asc.par[AsParam.SCRAPE_STD],
                                asc.rng_scrape)
        push_cluster_event(heap, t + delay, EventPriority.SCALE_ACTUATION,
                           Event.SCALE_ACTUATION, row)
    in_flight = 0
    for i in range(asc.var[AsVar.COUNT]):
        in_flight += ins.cnt[i, InstanceCounter.IN_FLIGHT]
    if (asc.var[AsVar.HORIZON_INF] == 1 and asc.var[AsVar.PENDING_ARRIVALS] <= 0
            and in_flight == 0):
        asc.var[AsVar.TICKING] = 0
        asc.var[AsVar.TICKING_STOPPED_AT] = t
        return
    push_cluster_event(heap, t + go_f2i(asc.par[AsParam.INTERVAL]),
                       EventPriority.SCALING_TICK, Event.SCALING_TICK, 0)


# ------------------------------------------------------------------ actuation (AS-4.6)


@njit(cache=True, _nrt=False, error_model="numpy")
def on_scale_actuation(asc, kv, inst_cfg, inst_rank, rt, heap, t, row):
    """ScaleActuationEvent: place ``delta`` new instances (Loading, then Active after the
    loading delay) or drain ``-delta`` Active instances of the variant, smallest id first."""
    # our replica bounds again, against the fleet now (other actuations may have landed)
    delta = _bounded(asc, asc.act[row, ACT_DELTA])
    label = asc.act[row, ACT_LABEL]
    tp = asc.act[row, ACT_TP]
    if delta > 0:
        if asc.var[AsVar.HAS_POOLS] == 0:
            asc.var[AsVar.NO_POOL_SCALE_UPS] += 1
            return
        for k in range(delta):
            asc.var[AsVar.SEQ] += 1
            seq = asc.var[AsVar.SEQ]
            node = place(asc, label, tp)
            if node < 0:
                # the inventory only shrinks within one decision: every later placement of it
                # fails too, and each still uses up an id
                failed = delta - k
                if asc.var[AsVar.FAILED_PLACEMENTS] == 0:
                    asc.var[AsVar.FIRST_FAILED_SEQ] = seq
                asc.var[AsVar.FAILED_PLACEMENTS] += failed
                asc.var[AsVar.SEQ] += failed - 1
                asc.var[AsVar.LAST_FAILED_SEQ] = asc.var[AsVar.SEQ]
                return
            i = build_instance(asc, kv, inst_cfg, inst_rank, InstanceKind.AUTOSCALED, seq, node,
                               label, tp, t)
            asc.var[AsVar.SCALE_UPS] += 1
            for j in range(Signal.SIZE):
                asc.inst_sig[i, 0, j] = asc.act_sig[row, j]
            start_instance(asc, rt, heap, i, t, False)
        return
    for _ in range(-delta):
        best = -1
        for i in range(asc.var[AsVar.COUNT]):
            if (asc.inst[i, AsInst.STATE] == Lifecycle.ACTIVE
                    and asc.inst[i, AsInst.LABEL] == label
                    and max(asc.inst[i, AsInst.TP], 1) == tp
                    and (best < 0 or asc.inst[i, AsInst.ID_KEY] < asc.inst[best, AsInst.ID_KEY])):
                best = i
        if best < 0:
            asc.var[AsVar.DRAIN_NOT_FOUND] += 1
            continue
        asc.inst[best, AsInst.STATE] = Lifecycle.DRAINING
        asc.inst[best, AsInst.DRAINED] = t
        asc.var[AsVar.SCALE_DOWNS] += 1
        for j in range(Signal.SIZE):
            asc.inst_sig[best, 1, j] = asc.act_sig[row, j]
        rebuild_routable(asc, rt)
        if rt.st[RouterVar.N_ROUTABLE] == 0 and asc.var[AsVar.LAST_SERVING_DRAINED_AT] < 0:
            asc.var[AsVar.LAST_SERVING_DRAINED_AT] = t
            asc.var[AsVar.LAST_SERVING_DRAINED] = best


@njit(cache=True, _nrt=False, error_model="numpy")
def room_needed(asc, heap):
    """Instance rows and heap entries the next event needs beyond what is free (> 0: grow)
    when it is a scale-up actuation; 0 otherwise."""
    if heap.kinds[0] != Event.SCALE_ACTUATION:
        return np.int64(0), np.int64(0)
    row = heap.payloads[0]
    delta = asc.act[row, ACT_DELTA]
    if delta <= 0:
        return np.int64(0), np.int64(0)
    n = min(delta, placeable(asc, asc.act[row, ACT_LABEL], asc.act[row, ACT_TP]))
    rows = asc.var[AsVar.COUNT] + n - asc.inst.shape[0]
    return rows, n


__all__ = ["ACT_DELTA", "AsInst", "AsParam", "AsVar", "AutoscaleState", "INT64_MAX", "Signal",
           "after_instance_event", "build_instance", "id_key", "on_instance_loaded",
           "on_scale_actuation", "on_scaling_tick", "place", "rebuild_routable",
           "room_needed", "sample_delay_us", "start_instance"]
