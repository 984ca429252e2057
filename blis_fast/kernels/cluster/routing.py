"""Cluster routing (CLU-3 with DELTA-30..37): instance snapshots, what user hooks observe, and
the choice of a target instance for an admitted request.

* :func:`take_snapshots` refreshes each instance's cached snapshot groups as the reference's
  provider does (CLU-3.7/3.8, DELTA-37); in-flight counts are always current;
  :func:`refresh_cache_signal` re-freezes the copies of the instance caches the router reads
  under a cache-signal delay (DELTA-33).
* :func:`route` runs the routing policy (``enums.Routing``) over a candidate list (the
  instances eligible for the decision, in index order: every routable instance, or a pool of
  them): round-robin, least-loaded, always-busiest, or weighted scoring over the configured
  scorers (``kernels/cluster/scorers.py``), ties broken by the router's Go-rand stream; and records the
  decision trace (CLU-6). Per-decision scratch (``scores``, ``dim``, ``tied``, ``order``, the
  hook view's rows) is indexed by candidate position, router state that outlives a decision
  (snapshots, prefix-affinity index, no-hit LRU) by instance.

All state is in ``RouterState`` (``kernels/cluster/router_state.py``); every function is compiled
without reference counting.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.cluster import hooks as hk
from blis_fast.kernels.cluster.router_state import (
    CandidateCount,
    RouterCfg,
    RouterVar,
    SnapField,
    SnapGroup,
    SnapRate,
)
from blis_fast.kernels.cluster.scorers import observe_routing, score_dimension
from blis_fast.kernels.engine.state import InstanceCounter, QueueField
from blis_fast.kernels.enums import Routing
from blis_fast.kernels.go.gorand import intn
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.kv.hashtable import leading_matches
from blis_fast.kernels.kv.kv_layout import CpuMeta, KVMeta

# ---------------------------------------------------------------- snapshots


@njit(cache=True, _nrt=False, error_model="numpy")
def refresh_cache_signal(rt, kv, clock):
    """Re-freeze every instance's cache hash map when the signal delay has elapsed (DELTA-33).

    The frozen copies are kept current incrementally from the KV cache's change log.
    """
    delay = rt.rcfg[RouterCfg.CACHE_DELAY]
    if rt.rcfg[RouterCfg.USES_CACHE_QUERY] == 0 or delay <= 0:
        return
    if clock - rt.st[RouterVar.CACHE_LAST] < delay:
        return
    for i in range(kv.ht.shape[0]):
        kvc.sync_frozen_copy(kv, i, rt.cq_table)
    rt.st[RouterVar.CACHE_LAST] = clock


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _refresh_kv_group(rt, kv, i):
    """The KV group of instance ``i``'s snapshot: utilisation, free blocks, capacity, hit
    rate."""
    total_blocks = kv.meta[i, KVMeta.TOTAL]
    rt.snap_i[i, SnapField.TOTAL] = total_blocks
    free = kv.meta[i, KVMeta.FREE]
    used = total_blocks - free
    rt.snap_f[i, SnapRate.KV_UTIL] = np.float64(used) / np.float64(total_blocks)
    rt.snap_i[i, SnapField.FREE] = free
    hits = kv.meta[i, KVMeta.HITS]
    total = hits + kv.meta[i, KVMeta.MISSES] + kv.cpu_meta[i, CpuMeta.MISSES]
    rt.snap_f[i, SnapRate.HIT_RATE] = np.float64(hits) / np.float64(total) if total > 0 else 0.0


@njit(cache=True, _nrt=False, error_model="numpy")
def take_snapshots(rt, ins, kv, clock, insts, n):
    """Refresh the cached snapshot groups of the instances ``insts[:n]`` as the provider would
    (CLU-3.7/3.8, DELTA-37); in-flight counts are always current. Instances not listed (not
    routable) keep their snapshots and refresh times."""
    period = rt.rcfg[RouterCfg.REFRESH]
    for k in range(n):
        i = insts[k]
        last = rt.snap_last
        if period <= 0 or clock - last[i, SnapGroup.PREEMPT] >= period:
            rt.snap_i[i, SnapField.PREEMPTIONS] = ins.cnt[i, InstanceCounter.PREEMPTIONS]
            last[i, SnapGroup.PREEMPT] = clock
        if period <= 0 or clock - last[i, SnapGroup.QUEUE] >= period:
            rt.snap_i[i, SnapField.QUEUE] = ins.wq[i, QueueField.LEN]
            last[i, SnapGroup.QUEUE] = clock
        if period <= 0 or clock - last[i, SnapGroup.BATCH] >= period:
            rt.snap_i[i, SnapField.BATCH] = ins.batch_len[i]
            last[i, SnapGroup.BATCH] = clock
        if period <= 0 or clock - last[i, SnapGroup.KV] >= period:
            _refresh_kv_group(rt, kv, i)
            last[i, SnapGroup.KV] = clock
        rt.inflight_view[i] = ins.cnt[i, InstanceCounter.IN_FLIGHT]


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def instance_load(rt, i):
    """An instance's effective load as the router sees it: queue + batch + in flight."""
    return rt.snap_i[i, SnapField.QUEUE] + rt.snap_i[i, SnapField.BATCH] + rt.inflight_view[i]


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def cached_prefix_blocks(rt, kv, r, i, n_blocks):
    """Leading input blocks of request ``r`` cached on instance ``i`` as the router sees them:
    in the frozen copy under a cache-signal delay, else in the live table."""
    table = rt.cq_table if rt.rcfg[RouterCfg.CACHE_DELAY] > 0 else kv.ht
    return leading_matches(table, i, kv.chunk_dig, kv.chunk_off[r], n_blocks, rt.found)


@njit(cache=True, _nrt=False, error_model="numpy")
def fill_hook_view(rt, kv, r, input_len, n_blocks, cand, n, clock, with_cache):
    """Fill rt.hook_snap (row k: candidate ``cand[k]``) and rt.hook_req with what a user hook
    observes (``kernels/cluster/hooks.py``)."""
    for k in range(n):
        i = cand[k]
        rt.hook_snap[k, hk.SNAP_QUEUE] = rt.snap_i[i, SnapField.QUEUE]
        rt.hook_snap[k, hk.SNAP_BATCH] = rt.snap_i[i, SnapField.BATCH]
        rt.hook_snap[k, hk.SNAP_IN_FLIGHT] = rt.inflight_view[i]
        rt.hook_snap[k, hk.SNAP_KV_UTIL] = rt.snap_f[i, SnapRate.KV_UTIL]
        rt.hook_snap[k, hk.SNAP_FREE_BLOCKS] = rt.snap_i[i, SnapField.FREE]
        rt.hook_snap[k, hk.SNAP_CACHED_BLOCKS] = (
            cached_prefix_blocks(rt, kv, r, i, n_blocks) if with_cache else 0.0)
        rt.hook_snap[k, hk.SNAP_PREEMPTIONS] = rt.snap_i[i, SnapField.PREEMPTIONS]
    rt.hook_req[hk.REQ_INPUT_LEN] = input_len
    rt.hook_req[hk.REQ_CLOCK] = clock
    rt.hook_req[hk.REQ_ARRIVAL] = 0.0
    rt.hook_req[hk.REQ_SLO_PRIORITY] = rt.req_priority[r]
    rt.hook_req[hk.REQ_INPUT_BLOCKS] = n_blocks
    rt.hook_req[hk.REQ_INDEX] = r


# ---------------------------------------------------------------- policies


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _pick_tied(rt, n_tied):
    """One of the ``n_tied`` candidate positions in ``rt.tied``: the router's Go-rand draw
    breaks ties."""
    if n_tied > 1:
        return rt.tied[intn(rt.rng, n_tied)]
    return rt.tied[0]


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _route_by_load(rt, code, cand, n):
    """least-loaded (ties broken at random) or always-busiest (first candidate). Returns (the
    chosen candidate's position, the extreme load)."""
    extreme = instance_load(rt, cand[0])
    for k in range(1, n):
        load = instance_load(rt, cand[k])
        if (code == Routing.LEAST_LOADED and load < extreme) or (
                code == Routing.ALWAYS_BUSIEST and load > extreme):
            extreme = load
    if code == Routing.ALWAYS_BUSIEST:
        for k in range(n):
            if instance_load(rt, cand[k]) == extreme:
                return k, np.float64(extreme)
    n_tied = 0
    for k in range(n):
        if instance_load(rt, cand[k]) == extreme:
            rt.tied[n_tied] = k
            n_tied += 1
    return _pick_tied(rt, n_tied), np.float64(extreme)


@njit(cache=True, _nrt=False, error_model="numpy")
def _route_weighted(rt, kv, r, input_len, clock, arrival, scorer_table, cand, n):
    """Weighted scoring (CLU-3.16, DELTA-31..36) over the candidates: each scorer's values
    clamped to [0, 1] and weighted into a composite; the best wins, ties broken at random.
    Returns (the chosen candidate's position, best)."""
    n_blocks = np.int64(0)
    if rt.rcfg[RouterCfg.USES_CACHE_QUERY] == 1 or rt.pa_hash.shape[1] > 1:
        n_blocks = input_len // rt.rcfg[RouterCfg.BLOCK_SIZE]
    fill_hook_view(rt, kv, r, input_len, n_blocks, cand, n, clock,
                   rt.rcfg[RouterCfg.USES_CACHE_QUERY] == 1)
    rt.hook_req[hk.REQ_ARRIVAL] = arrival
    for k in range(n):
        rt.scores[k] = 0.0
    for s in range(rt.rcfg[RouterCfg.N_SCORERS]):
        score_dimension(rt, kv, rt.scorer_codes[s], r, cand, n, n_blocks, scorer_table)
        w = rt.scorer_weights[s]
        for k in range(n):
            v = rt.dim[k]
            if v < 0:
                v = 0.0
            if v > 1:
                v = 1.0
            rt.scores[k] += v * w
    best = -1.0
    for k in range(n):
        if rt.scores[k] > best:
            best = rt.scores[k]
    n_tied = 0
    for k in range(n):
        if rt.scores[k] == best:
            rt.tied[n_tied] = k
            n_tied += 1
    chosen = _pick_tied(rt, n_tied)
    observe_routing(rt, kv, r, cand[chosen], n_blocks)
    return chosen, best


@njit(cache=True, _nrt=False, error_model="numpy")
def pick(rt, kv, r, input_len, clock, arrival, scorer_table, cand, n):
    """The routing policy's choice for request ``r`` among the ``n`` candidates ``cand[:n]``
    (instance ids in index order, n >= 1; CLU-3.11..3.16), without the trace record.
    Returns (the chosen candidate's position, the policy's best value)."""
    code = rt.rcfg[RouterCfg.ROUTING]
    if code == Routing.ROUND_ROBIN:
        chosen = rt.st[RouterVar.RR] % n
        best = np.float64(rt.st[RouterVar.RR])
        rt.st[RouterVar.RR] += 1
    elif code == Routing.WEIGHTED:
        chosen, best = _route_weighted(rt, kv, r, input_len, clock, arrival, scorer_table,
                                       cand, n)
    else:
        chosen, best = _route_by_load(rt, code, cand, n)
    return chosen, best


@njit(cache=True, _nrt=False, error_model="numpy")
def route(rt, kv, r, input_len, clock, inst_rank, arrival, scorer_table, cand, n):
    """Choose the target instance for request ``r`` among the ``n`` candidates ``cand[:n]``
    (:func:`pick`) and record the decision in the trace."""
    chosen, best = pick(rt, kv, r, input_len, clock, arrival, scorer_table, cand, n)
    if rt.rcfg[RouterCfg.TRACE] == 1:
        record_routing(rt, r, clock, chosen, best, inst_rank, cand, n,
                       rt.rcfg[RouterCfg.ROUTING] == Routing.WEIGHTED)
    return cand[chosen]


@njit(cache=True, _nrt=False, error_model="numpy")
def is_known_policy(code):
    """True for a routing code :func:`route` implements."""
    return Routing.ROUND_ROBIN <= code <= Routing.ALWAYS_BUSIEST


# ---------------------------------------------------------------- decision trace


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _rank_candidates(rt, weighted, inst_rank, cand, n):
    """Order the candidates for the counterfactual list: score descending (the composite for
    weighted routing, else minus the effective load), then instance id (string order).
    Leaves positions in ``rt.order`` and their values in ``rt.dim``."""
    for k in range(n):
        rt.dim[k] = rt.scores[k] if weighted else -np.float64(instance_load(rt, cand[k]))
        rt.order[k] = k
    for a in range(1, n):  # insertion sort
        x = rt.order[a]
        b = a - 1
        while b >= 0:
            y = rt.order[b]
            if rt.dim[y] > rt.dim[x] or (rt.dim[y] == rt.dim[x]
                                         and inst_rank[cand[y]] < inst_rank[cand[x]]):
                break
            rt.order[b + 1] = y
            b -= 1
        rt.order[b + 1] = x


@njit(cache=True, _nrt=False, error_model="numpy")
def record_routing(rt, r, clock, chosen, best, inst_rank, cand, n, weighted):
    """Append the routing decision (candidate ``chosen`` of ``cand[:n]``) to the trace, with
    the top-k counterfactual candidates and the regret of the choice (CLU-6); ``weighted``:
    the deciding policy was a weighted one (its scores are in ``rt.scores``), else the
    candidates rank by load. Scores are kept per instance; an instance that was not a
    candidate has NaN."""
    k = rt.st[RouterVar.N_ROUTING_RECORDS]
    rt.st[RouterVar.N_ROUTING_RECORDS] = k + 1
    rt.rt_req[k] = r
    rt.rt_clock[k] = clock
    rt.rt_target[k] = cand[chosen]
    rt.rt_best[k] = best
    if weighted:
        if n < rt.rt_scores.shape[1]:
            for i in range(rt.rt_scores.shape[1]):
                rt.rt_scores[k, i] = np.nan
        for j in range(n):
            rt.rt_scores[k, cand[j]] = rt.scores[j]
    kk = rt.rcfg[RouterCfg.COUNTERFACTUAL_K]
    if kk <= 0:
        return
    _rank_candidates(rt, weighted, inst_rank, cand, n)
    for j in range(min(kk, n)):
        i = cand[rt.order[j]]
        rt.cf_inst[k, j] = i
        rt.cf_score[k, j] = rt.dim[rt.order[j]]
        rt.cf_int[k, j, CandidateCount.QUEUE] = rt.snap_i[i, SnapField.QUEUE]
        rt.cf_int[k, j, CandidateCount.BATCH] = rt.snap_i[i, SnapField.BATCH]
        rt.cf_int[k, j, CandidateCount.IN_FLIGHT] = rt.inflight_view[i]
        rt.cf_int[k, j, CandidateCount.FREE] = rt.snap_i[i, SnapField.FREE]
        rt.cf_kv[k, j] = rt.snap_f[i, SnapRate.KV_UTIL]
    regret = rt.dim[rt.order[0]] - rt.dim[chosen]
    rt.rt_regret[k] = regret if regret > 0 else 0.0
