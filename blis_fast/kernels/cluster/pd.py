"""Prefill/decode disaggregation in the cluster loop (PD-3, the reference at ``f90a1e3a``:
``sim/cluster/cluster.go``, ``pd_events.go``, ``sim/disaggregation.go``).

Row layout: rows ``[0, cap)`` are the workload's requests; a disaggregated request's row ``r``
becomes its decode sub-request when its KV transfer starts, and row ``r + cap`` is its prefill
sub-request (same prompt, no outputs). Everything a sub-request does on its instance is the
ordinary engine (arrival, enqueue guards, steps, preemption, timeout); this module adds:

* :func:`route_decode_first` - the routing event in P/D mode: the policy picks a decode-pool
  instance, the decider splits the request or runs it there whole;
* :func:`on_prefill_routing` - the prefill sub-request's routing event (cluster priority 4);
* :func:`note_completion` / :func:`detect` - after a step, prefill completions start transfers
  (at the step's start, PD-3.8) and decode completions complete their parents, in the byte-wise
  order of the sub-request ids;
* :func:`on_transfer_start` / :func:`on_transfer_done` - the decode side reserves the prompt's
  KV (or the parent is dropped), the transfer takes ``ceil(base + bytes / bandwidth)``, then the
  decode sub-request joins the decode instance's wait queue (no arrival, no guards);
* :func:`on_decode_timeout` - a decode sub-request's timeout ends its parent.

All P/D state is one ``PDState``; a run without P/D passes None instead, and the event loop
then compiles without these handlers (``kernels/engine/event_loop.py: run_events``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.cluster import admission as adm
from blis_fast.kernels.cluster import routing as rtk
from blis_fast.kernels.cluster.router_state import RouterCfg, RouterState, RouterVar
from blis_fast.kernels.engine.batch import wq_push_back
from blis_fast.kernels.engine.events import CLUSTER, INSTANCE, push_event, schedule_step
from blis_fast.kernels.engine.state import (
    ConfigSlot,
    HotField,
    InstanceCounter,
    InstanceSlot,
    Rejection,
)
from blis_fast.kernels.enums import (
    Decider,
    Event,
    EventPriority,
    Registration,
    RequestState,
    Routing,
)
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc


class PDConfT(NamedTuple):
    """Slots of ``PDState.conf`` (int64). A run without P/D has no state (None)."""

    CAP: int = 0  # rows of the workload's requests; the prefill row of r is r + CAP
    DECIDER: int = 1  # enums.Decider
    THRESHOLD: int = 2  # prefix-threshold decider: tokens
    CONTENTION: int = 3  # 1: active transfers share the bandwidth
    N_PREFILL: int = 4  # prefill-pool candidates (cand_prefill[:n])
    N_DECODE: int = 5  # decode-pool candidates (cand_decode[:n])
    BLOCK_SIZE: int = 6
    RANKED: int = 7  # 1: the scheduler reads id ranks (decode subs take their own)
    SIZE: int = 8


PDConf = PDConfT()


class PDRateT(NamedTuple):
    """Slots of ``PDState.rate`` (float64)."""

    BANDWIDTH: int = 0  # bytes per µs (GB/s x 1000)
    BASE: int = 1  # µs per transfer
    BLOCK_BYTES: int = 2  # KV bytes of one block at the prefill TP
    SIZE: int = 3


PDRate = PDRateT()


class ParentFieldT(NamedTuple):
    """Columns of ``PDState.par`` (one row per workload request; times in µs, 0 = unset as in
    the reference)."""

    FLAG: int = 0  # 1: disaggregated
    DECODE: int = 1  # decode instance (chosen at routing), -1 = none
    PREFILL: int = 2  # prefill instance, -1 = none
    T_PREFILL_ENQUEUE: int = 3
    T_PREFILL_DONE: int = 4  # = transfer start: the start of the last prefill step
    T_XFER_START: int = 5
    T_XFER_DONE: int = 6
    T_DECODE_ENQUEUE: int = 7
    T_DONE: int = 8  # parent completion (decode done + PDFO, timeout, drop at start)
    BLOCKS: int = 9  # prompt blocks moved
    XFER_ACTIVE: int = 10  # active transfers when it started (the contention divisor)
    ATTACHED: int = 11  # 1: the decode sub-request holds its reservation
    PAST_DEADLINE: int = 12  # 1: enqueued on its decode instance after its deadline
    SIZE: int = 13


ParentField = ParentFieldT()


class PDCounterT(NamedTuple):
    """Slots of ``PDState.cnt``."""

    PARENTS: int = 0  # disaggregated decisions
    PREFILL_COMPLETED: int = 1
    DECODE_COMPLETED: int = 2
    DECODE_TIMED_OUT: int = 3
    DROPPED_AT_DECODE_KV: int = 4
    XFER_INITIATED: int = 5
    XFER_COMPLETED: int = 6
    ACTIVE: int = 7  # transfers in flight (contention)
    PEAK: int = 8
    DEPTH_SUM: int = 9
    STARTS: int = 10
    CORRUPTED: int = 11
    PAST_DEADLINE: int = 12
    NOTED_PREFILL: int = 13  # completions of the step at hand noted in buf[0]
    NOTED_DECODE: int = 14  # ... in buf[1]
    SIZE: int = 15


PDCounter = PDCounterT()


class PDState(NamedTuple):
    """P/D configuration and state (``kernels/cluster/pd.py``)."""

    conf: np.ndarray  # int64 [PDConf.SIZE]
    rate: np.ndarray  # float64 [PDRate.SIZE]
    cand_prefill: np.ndarray  # int64 [N] prefill-bit instances in index order
    cand_decode: np.ndarray  # int64 [N] decode-bit instances in index order
    par: np.ndarray  # int64 [cap, ParentField.SIZE]
    pfx_rank: np.ndarray  # int64 [cap] rank of "<id>_prefill" in byte order
    dec_rank: np.ndarray  # int64 [cap] rank of "<id>_decode" in byte order
    dec_id_rank: np.ndarray  # int64 [cap] scheduler id rank of "<id>_decode" (RANKED)
    cnt: np.ndarray  # int64 [PDCounter.SIZE]
    buf: np.ndarray  # int64 [2, max_batch] completions of the step at hand
    # the policies that pick a prefill / a decode instance (PD-2.3, PD-2.9): a pool's own
    # weighted policy (router_state.pool_router) or the main router state itself
    rt_prefill: RouterState
    rt_decode: RouterState


def new_pd_state(cap: int, max_batch: int, cand_prefill: np.ndarray, cand_decode: np.ndarray,
                 decider: int, threshold: int, contention: bool, block_size: int,
                 bandwidth: float, base: float, block_bytes: float, pfx_rank: np.ndarray,
                 dec_rank: np.ndarray, dec_id_rank: np.ndarray | None,
                 rt_prefill: RouterState, rt_decode: RouterState) -> PDState:
    """The P/D state of a run (``cap`` workload rows, prefill rows after them) whose pools
    are routed by ``rt_prefill`` and ``rt_decode``."""
    n_inst = max(len(cand_prefill), len(cand_decode), 1)
    conf = np.zeros(PDConf.SIZE, np.int64)
    conf[PDConf.CAP] = cap
    conf[PDConf.DECIDER] = decider
    conf[PDConf.THRESHOLD] = threshold
    conf[PDConf.CONTENTION] = 1 if contention else 0
    conf[PDConf.N_PREFILL] = len(cand_prefill)
    conf[PDConf.N_DECODE] = len(cand_decode)
    conf[PDConf.BLOCK_SIZE] = block_size
    conf[PDConf.RANKED] = 1 if dec_id_rank is not None else 0
    rate = np.zeros(PDRate.SIZE, np.float64)
    rate[PDRate.BANDWIDTH] = bandwidth
    rate[PDRate.BASE] = base
    rate[PDRate.BLOCK_BYTES] = block_bytes
    par = np.zeros((cap, ParentField.SIZE), np.int64)
    par[:, ParentField.DECODE] = -1
    par[:, ParentField.PREFILL] = -1

    def padded(a):
        out = np.zeros(n_inst, np.int64)
        out[: len(a)] = a
        return out

    return PDState(conf=conf, rate=rate, cand_prefill=padded(cand_prefill),
                   cand_decode=padded(cand_decode), par=par,
                   pfx_rank=np.ascontiguousarray(pfx_rank, np.int64),
                   dec_rank=np.ascontiguousarray(dec_rank, np.int64),
                   dec_id_rank=np.ascontiguousarray(
                       dec_id_rank if dec_id_rank is not None else np.zeros(cap), np.int64),
                   cnt=np.zeros(PDCounter.SIZE, np.int64),
                   buf=np.zeros((2, max_batch + 1), np.int64),
                   rt_prefill=rt_prefill, rt_decode=rt_decode)


# ------------------------------------------------------------------ routing


@njit(cache=True, _nrt=False, error_model="numpy")
def _disaggregate(pd, rt, kv, r, input_len, target):
    """The decider's verdict for request ``r`` on its decode pick ``target`` (PD-3.3)."""
    code = pd.conf[PDConf.DECIDER]
    if code == Decider.ALWAYS:
        return True
    if code == Decider.PREFIX_THRESHOLD:
        if input_len == 0:
            return False
        bs = pd.conf[PDConf.BLOCK_SIZE]
        cached = rtk.cached_prefix_blocks(rt, kv, r, target, input_len // bs)
        return input_len - cached * bs > pd.conf[PDConf.THRESHOLD]
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def route_decode_first(cfg, inp, rs, ins, kv, rt, heap, hooks, pd, t, r):
    """The routing event in P/D mode (PD-3.1): snapshots of every routable instance, the
    decode pool's policy (``pd.rt_decode``) over the decode pool (no model filter), then the
    decider. A local request is recorded and arrives at its instance as usual; a
    disaggregated one schedules its prefill routing."""
    n_dec = pd.conf[PDConf.N_DECODE]
    if n_dec == 0:
        ins.rejected[Rejection.ROUTING] += 1
        rs.registered[r] = Registration.REJECTED_ROUTING
        return
    rtk.take_snapshots(rt, ins, kv, t, rt.routable, rt.st[RouterVar.N_ROUTABLE])
    n_in = inp.input_len[r]
    policy = pd.rt_decode
    chosen, best = rtk.pick(policy, kv, r, n_in, t, inp.arrival[r], hooks.scorer_table,
                            pd.cand_decode, n_dec)
    target = pd.cand_decode[chosen]
    if not _disaggregate(pd, rt, kv, r, n_in, target):
        if rt.rcfg[RouterCfg.TRACE] == 1:
            rtk.record_routing(rt, r, t, chosen, best, cfg.instance_rank, pd.cand_decode, n_dec,
                               policy.rcfg[RouterCfg.ROUTING] == Routing.WEIGHTED)
        ins.cnt[target, InstanceCounter.IN_FLIGHT] += 1
        adm.on_routed(rt, r)
        rs.inst[r] = target
        rs.registered[r] = Registration.ROUTED
        push_event(heap, t, INSTANCE, target, EventPriority.ARRIVAL, Event.ARRIVAL, r)
        return
    bs = pd.conf[PDConf.BLOCK_SIZE]
    pd.par[r, ParentField.FLAG] = 1
    pd.par[r, ParentField.DECODE] = target
    pd.par[r, ParentField.BLOCKS] = (n_in + bs - 1) // bs
    pd.cnt[PDCounter.PARENTS] += 1
    push_event(heap, t, CLUSTER, 0, EventPriority.PREFILL_ROUTING, Event.PREFILL_ROUTING, r)


@njit(cache=True, _nrt=False, error_model="numpy")
def on_prefill_routing(inp, rs, ins, kv, rt, heap, hooks, pd, t, r):
    """PrefillRoutingEvent (PD-3.6): the prefill pool's policy (``pd.rt_prefill``) picks a
    prefill-pool instance for the prefill sub-request, which arrives there at once."""
    rtk.refresh_cache_signal(rt, kv, t)
    rtk.take_snapshots(rt, ins, kv, t, rt.routable, rt.st[RouterVar.N_ROUTABLE])
    n_pre = pd.conf[PDConf.N_PREFILL]
    p = r + pd.conf[PDConf.CAP]
    chosen, _best = rtk.pick(pd.rt_prefill, kv, p, inp.input_len[p], t, inp.arrival[p],
                             hooks.scorer_table, pd.cand_prefill, n_pre)
    target = pd.cand_prefill[chosen]
    pd.par[r, ParentField.PREFILL] = target
    pd.par[r, ParentField.T_PREFILL_ENQUEUE] = t
    ins.cnt[target, InstanceCounter.IN_FLIGHT] += 1
    adm.on_routed(rt, p)
    rs.inst[p] = target
    rs.registered[p] = Registration.ROUTED
    push_event(heap, t, INSTANCE, target, EventPriority.ARRIVAL, Event.ARRIVAL, p)


# ------------------------------------------------------------------ completions


@njit(cache=True, _nrt=False, error_model="numpy")
def note_completion(pd, rs, r):
    """Remember a sub-request that completed in the step at hand."""
    if r >= pd.conf[PDConf.CAP]:
        pd.buf[0, pd.cnt[PDCounter.NOTED_PREFILL]] = r
        pd.cnt[PDCounter.NOTED_PREFILL] += 1
    elif rs.pd_sub[r] == 1:
        pd.buf[1, pd.cnt[PDCounter.NOTED_DECODE]] = r
        pd.cnt[PDCounter.NOTED_DECODE] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _sort_by_rank(rows, n, rank, offset):
    """Insertion sort of ``rows[:n]`` by ``rank[row - offset]``."""
    for a in range(1, n):
        x = rows[a]
        b = a - 1
        while b >= 0 and rank[rows[b] - offset] > rank[x - offset]:
            rows[b + 1] = rows[b]
            b -= 1
        rows[b + 1] = x


@njit(cache=True, _nrt=False, error_model="numpy")
def detect(cfg, pd, heap, t):
    """detectPrefillCompletions then detectDecodeCompletions (PD-3.8, PD-3.12) after a step
    that started at ``t``: each finished prefill starts its transfer at ``t``; each finished
    decode completes its parent at ``t`` + the post-decode overhead; byte-wise id order."""
    cap = pd.conf[PDConf.CAP]
    n_pf = pd.cnt[PDCounter.NOTED_PREFILL]
    _sort_by_rank(pd.buf[0], n_pf, pd.pfx_rank, cap)
    for k in range(n_pf):
        r = pd.buf[0, k] - cap
        pd.par[r, ParentField.T_PREFILL_DONE] = t
        pd.cnt[PDCounter.PREFILL_COMPLETED] += 1
        push_event(heap, t, CLUSTER, 0, EventPriority.KV_TRANSFER_START, Event.KV_TRANSFER_START,
                   r)
    n_dec = pd.cnt[PDCounter.NOTED_DECODE]
    _sort_by_rank(pd.buf[1], n_dec, pd.dec_rank, 0)
    for k in range(n_dec):
        r = pd.buf[1, k]
        pd.par[r, ParentField.T_DONE] = t + cfg.inst[pd.par[r, ParentField.DECODE],
                                                     InstanceSlot.POST_DECODE]
        pd.cnt[PDCounter.DECODE_COMPLETED] += 1
    pd.cnt[PDCounter.NOTED_PREFILL] = 0
    pd.cnt[PDCounter.NOTED_DECODE] = 0


@njit(cache=True, _nrt=False, error_model="numpy")
def on_decode_timeout(pd, r, t):
    """A decode sub-request timed out: its parent ends at the timeout's time (PD-3.12)."""
    pd.par[r, ParentField.T_DONE] = t
    pd.cnt[PDCounter.DECODE_TIMED_OUT] += 1


# ------------------------------------------------------------------ the KV transfer


@njit(cache=True, _nrt=False, error_model="numpy")
def transfer_duration(pd, blocks, active):
    """ceil(base + bytes / bandwidth) µs, at least 1, with ``active`` transfers sharing the
    link under contention; float64 operations in the reference's order, and its amd64
    float-to-int conversion (NaN, infinities and >= 2^63 become 1 µs) (PD-3.9)."""
    bw = pd.rate[PDRate.BANDWIDTH]
    if pd.conf[PDConf.CONTENTION] == 1 and active > 1:
        bw = bw / np.float64(active)
    nbytes = np.float64(blocks) * pd.rate[PDRate.BLOCK_BYTES]
    if bw > 0:
        x = np.ceil(pd.rate[PDRate.BASE] + nbytes / bw)
    else:
        x = np.ceil(pd.rate[PDRate.BASE])
    if not (x < 9.223372036854775807e18) or not (x > -9.223372036854775807e18):
        return np.int64(1)
    d = np.int64(x)
    return d if d >= 1 else np.int64(1)


@njit(cache=True, _nrt=False, error_model="numpy")
def on_transfer_start(inp, rs, kv, heap, work, pd, t, r):
    """KVTransferStartedEvent (PD-3.9): the decode sub-request (row ``r``) reserves its whole
    prompt on the decode instance - no cached blocks, no preemption - or its parent is dropped;
    the transfer's completion is scheduled."""
    d = pd.par[r, ParentField.DECODE]
    n_in = inp.input_len[r]
    rs.pd_sub[r] = 1
    rs.inst[r] = d
    pd.cnt[PDCounter.XFER_INITIATED] += 1
    pd.par[r, ParentField.T_XFER_START] = t
    ok = n_in == 0 or kvc.allocate(kv, d, r, np.int64(0), n_in, np.int64(1) > 0, n_in,
                                   work.cached, np.int64(0), work.scratch, work.chain)
    if not ok:
        pd.cnt[PDCounter.DROPPED_AT_DECODE_KV] += 1
        pd.par[r, ParentField.T_DONE] = t
        push_event(heap, t, CLUSTER, 0, EventPriority.KV_TRANSFER_DONE, Event.KV_TRANSFER_DONE, r)
        return
    rs.hot[r, HotField.PROGRESS] = n_in
    pd.par[r, ParentField.ATTACHED] = 1
    active = np.int64(0)
    if pd.conf[PDConf.CONTENTION] == 1:
        pd.cnt[PDCounter.ACTIVE] += 1
        active = pd.cnt[PDCounter.ACTIVE]
        pd.cnt[PDCounter.PEAK] = max(pd.cnt[PDCounter.PEAK], active)
        pd.cnt[PDCounter.DEPTH_SUM] += active
        pd.cnt[PDCounter.STARTS] += 1
    pd.par[r, ParentField.XFER_ACTIVE] = active
    dur = transfer_duration(pd, pd.par[r, ParentField.BLOCKS], active)
    push_event(heap, t + dur, CLUSTER, 0, EventPriority.KV_TRANSFER_DONE,
               Event.KV_TRANSFER_DONE, r)


@njit(cache=True, _nrt=False, error_model="numpy")
def on_transfer_done(cfg, inp, rs, ins, rt, heap, pd, t, r):
    """KVTransferCompletedEvent (PD-3.10): the decode sub-request is queued on its decode
    instance at once - no arrival, no queueing delay, no enqueue guards, input tokens not
    counted - with a timeout at its deadline (possibly in the past, OPEN-PD-4)."""
    pd.cnt[PDCounter.XFER_COMPLETED] += 1
    if pd.par[r, ParentField.ATTACHED] == 0:
        return
    pd.par[r, ParentField.T_XFER_DONE] = t
    if pd.conf[PDConf.CONTENTION] == 1:
        pd.cnt[PDCounter.ACTIVE] -= 1
        if pd.cnt[PDCounter.ACTIVE] < 0:
            pd.cnt[PDCounter.ACTIVE] = 0
            pd.cnt[PDCounter.CORRUPTED] = 1
    d = pd.par[r, ParentField.DECODE]
    pd.par[r, ParentField.T_DECODE_ENQUEUE] = t
    if pd.conf[PDConf.RANKED] == 1:
        inp.id_rank[r] = pd.dec_id_rank[r]
    ins.cnt[d, InstanceCounter.IN_FLIGHT] += 1
    adm.on_routed(rt, r)
    rs.registered[r] = Registration.ROUTED
    rs.state[r] = RequestState.QUEUED
    wq_push_back(ins, rs, d, r)
    deadline = inp.deadline[r]
    if deadline > 0 and deadline <= cfg.ints[ConfigSlot.HORIZON]:
        if deadline <= t:
            pd.par[r, ParentField.PAST_DEADLINE] = 1
            pd.cnt[PDCounter.PAST_DEADLINE] += 1
        push_event(heap, deadline, INSTANCE, d, EventPriority.TIMEOUT, Event.TIMEOUT, r)
    if ins.cnt[d, InstanceCounter.STEP_PENDING] == 0:
        schedule_step(heap, ins, d, max(ins.cnt[d, InstanceCounter.CLOCK], t))
