"""Cluster control plane kernels: routing snapshots, admission, routing policies and scorers.

Implements CLU-2, CLU-3 and CLU-6 with DELTA-30..40: the snapshot provider with periodic
refresh, in-flight accounting (read from the engine's instance counters), admission policies
(always-admit, reject-all, token-bucket, tier-shed, gaie-legacy, tenant budgets), routing
policies (round-robin, least-loaded, always-busiest, weighted) with every scorer, the
router-side prefix-affinity LRU index, the precise cache query with its signal delay, the
no-hit LRU, the router's Go-rand stream for tie-breaking, and decision-trace records.

All state is in :data:`RouterState`; every function is compiled without reference counting.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from blis_fast.kernels import hooks as hk
from blis_fast.kernels import kvcache as kvc
from blis_fast.kernels.enums import Admission, AdmissionReason, Routing, StatefulScorer
from blis_fast.kernels.gorand import intn
from blis_fast.kernels.hashing import chain_hash
from blis_fast.kernels.kvcache import C_MISS, M_FREE, M_HITS, M_MISSES

PREFIX_LRU_CAPACITY = 10000  # sim/routing_prefix_scorer.go defaultLRUCapacity

# rcfg slots
(RC_ROUTING, RC_ADMISSION, RC_REFRESH, RC_CACHE_DELAY, RC_N_SCORERS, RC_TRACE, RC_CF_K,
 RC_TIER_THRESHOLD, RC_TIER_MIN_PRIORITY, RC_HAS_TENANT_BUDGETS, RC_USES_CACHE_QUERY,
 RC_BLOCK_SIZE, RC_SIZE) = range(13)
# rfl slots
RF_TB_CAPACITY, RF_TB_REFILL, RF_GAIE_QD, RF_GAIE_KV, RF_SIZE = range(5)
# st slots
(ST_RR, ST_TB_LAST, ST_CACHE_LAST, ST_NH_LEN, ST_NH_LAST_REQ, ST_NH_LAST_WARM, ST_N_ADM,
 ST_N_ROUTE, ST_SIZE) = range(9)
# snapshot integer fields
SN_QUEUE, SN_BATCH, SN_FREE, SN_PREEMPT, SN_SIZE = range(5)
# snapshot refresh groups
G_QUEUE, G_BATCH, G_KV, G_PREEMPT = range(4)

RouterState = namedtuple("RouterState", [
    "rcfg", "rfl", "st", "tb_tokens", "scorer_codes", "scorer_weights", "rng",
    "snap_i", "snap_f", "snap_last", "inflight_view",
    "scores", "dim", "tied", "raw", "hashes", "order",
    # prefix-affinity router index, per instance: LRU nodes and a hash -> node table
    "pa_hash", "pa_prev", "pa_next", "pa_table", "pa_meta",
    # frozen copy of every instance's hash table for the delayed cache signal
    "cq_table",
    # no-hit LRU: instance ids, most recent first, and membership
    "nh_order", "nh_set",
    # per-request inputs: slo priority (tier), sheddable flag, tenant code, model mismatch flag
    "req_priority", "req_sheddable", "req_tenant", "req_model_bad",
    # tenants: in-flight count and budget (negative = none)
    "tenant_inflight", "tenant_budget",
    # decision trace
    "adm_req", "adm_clock", "adm_ok", "adm_reason",
    "rt_req", "rt_clock", "rt_target", "rt_regret", "rt_best", "rt_scores",
    "cf_inst", "cf_score", "cf_int", "cf_kv",
    # what user hooks observe (blis_fast.kernels.hooks): per-instance rows and the request
    "hook_snap", "hook_req",
])


def new_router_state(
    n_instances: int,
    n_requests: int,
    *,
    routing: int,
    admission: int,
    scorer_codes: np.ndarray,
    scorer_weights: np.ndarray,
    rng_state: np.ndarray,
    block_size: int,
    refresh_interval: int = 0,
    cache_delay: int = 0,
    trace: bool = False,
    counterfactual_k: int = 0,
    token_bucket: tuple[float, float] = (0.0, 0.0),
    tier_shed: tuple[int, int] = (0, 0),
    gaie: tuple[float, float] = (5.0, 0.8),
    req_priority: np.ndarray | None = None,
    req_sheddable: np.ndarray | None = None,
    req_tenant: np.ndarray | None = None,
    req_model_bad: np.ndarray | None = None,
    tenant_budget: np.ndarray | None = None,
    max_chunks: int = 1,
    table_size: int = 16,
    uses_cache_query: bool = False,
) -> RouterState:
    """Allocate the router state (trace buffers only when tracing is on)."""
    n = n_instances
    rcfg = np.zeros(RC_SIZE, np.int64)
    rcfg[RC_ROUTING] = routing
    rcfg[RC_ADMISSION] = admission
    rcfg[RC_REFRESH] = refresh_interval
    rcfg[RC_CACHE_DELAY] = cache_delay
    rcfg[RC_N_SCORERS] = len(scorer_codes)
    rcfg[RC_TRACE] = 1 if trace else 0
    rcfg[RC_CF_K] = counterfactual_k
    rcfg[RC_TIER_THRESHOLD], rcfg[RC_TIER_MIN_PRIORITY] = tier_shed
    rcfg[RC_HAS_TENANT_BUDGETS] = 1 if tenant_budget is not None and len(tenant_budget) else 0
    codes = [int(c) for c in scorer_codes]
    uses_pa = routing == Routing.WEIGHTED and StatefulScorer.PREFIX_AFFINITY in codes
    uses_cq = routing == Routing.WEIGHTED and uses_cache_query
    rcfg[RC_USES_CACHE_QUERY] = 1 if uses_cq else 0
    rcfg[RC_BLOCK_SIZE] = block_size
    rfl = np.zeros(RF_SIZE, np.float64)
    rfl[RF_TB_CAPACITY], rfl[RF_TB_REFILL] = token_bucket
    rfl[RF_GAIE_QD], rfl[RF_GAIE_KV] = gaie
    st = np.zeros(ST_SIZE, np.int64)
    st[ST_NH_LAST_REQ] = -1
    pa_cap = PREFIX_LRU_CAPACITY if uses_pa else 1
    pa_tbl = 16
    while uses_pa and pa_tbl < 2 * pa_cap:
        pa_tbl *= 2
    pa_meta = np.zeros((n, 4), np.int64)
    pa_meta[:, 0] = -1  # head (most recent)
    pa_meta[:, 1] = -1  # tail (least recent)
    cq_size = table_size if (uses_cq and cache_delay > 0) else 1
    rec = n_requests if trace else 1
    k = max(counterfactual_k, 1) if trace else 1
    none_i8 = np.zeros(max(n_requests, 1), np.int8)
    return RouterState(
        rcfg=rcfg, rfl=rfl, st=st, tb_tokens=np.array([token_bucket[0]], np.float64),
        scorer_codes=np.ascontiguousarray(scorer_codes, np.int64),
        scorer_weights=np.ascontiguousarray(scorer_weights, np.float64),
        rng=rng_state,
        snap_i=np.zeros((n, SN_SIZE), np.int64), snap_f=np.zeros((n, 2), np.float64),
        snap_last=np.zeros((n, 4), np.int64), inflight_view=np.zeros(n, np.int64),
        scores=np.zeros(n, np.float64), dim=np.zeros(n, np.float64),
        tied=np.zeros(n, np.int64), raw=np.zeros(n, np.int64),
        hashes=np.zeros(max_chunks + 1, np.uint64), order=np.zeros(n, np.int64),
        pa_hash=np.zeros((n, pa_cap), np.uint64), pa_prev=np.full((n, pa_cap), -1, np.int64),
        pa_next=np.full((n, pa_cap), -1, np.int64),
        pa_table=np.zeros((n, pa_tbl, 2), np.uint64), pa_meta=pa_meta,
        cq_table=np.zeros((n, cq_size, 2), np.uint64),
        nh_order=np.zeros(n, np.int64), nh_set=np.zeros(n, np.int8),
        req_priority=(req_priority if req_priority is not None
                      else np.full(max(n_requests, 1), 3, np.int64)),
        req_sheddable=req_sheddable if req_sheddable is not None else none_i8,
        req_tenant=(req_tenant if req_tenant is not None
                    else np.full(max(n_requests, 1), -1, np.int64)),
        req_model_bad=req_model_bad if req_model_bad is not None else none_i8.copy(),
        tenant_inflight=np.zeros(max(len(tenant_budget) if tenant_budget is not None else 0, 1),
                                 np.int64),
        tenant_budget=(tenant_budget if tenant_budget is not None and len(tenant_budget)
                       else np.full(1, -1.0)),
        adm_req=np.zeros(rec, np.int64), adm_clock=np.zeros(rec, np.int64),
        adm_ok=np.zeros(rec, np.int8), adm_reason=np.zeros(rec, np.int8),
        rt_req=np.zeros(rec, np.int64), rt_clock=np.zeros(rec, np.int64),
        rt_target=np.zeros(rec, np.int64), rt_regret=np.zeros(rec, np.float64),
        rt_best=np.zeros(rec, np.float64),
        rt_scores=np.zeros((rec if trace and routing == Routing.WEIGHTED else 1, n), np.float64),
        cf_inst=np.full((rec, k), -1, np.int64), cf_score=np.zeros((rec, k), np.float64),
        cf_int=np.zeros((rec, k, 4), np.int64), cf_kv=np.zeros((rec, k), np.float64),
        hook_snap=np.zeros((n, hk.SNAP_COLS), np.float64),
        hook_req=np.zeros(hk.REQ_COLS, np.float64),
    )


# hash tables: the KV cache's open-addressing helpers (key 0 = empty)
_tget = kvc._table_get
_tput = kvc._table_put
_tdel = kvc._table_del


# ---------------------------------------------------------------- request hashes


@njit(cache=True, _nrt=False, error_model="numpy")
def input_hashes(rt, chunk_off, chunk_dig, r, input_len):
    """Chain hashes of request ``r``'s full input blocks into ``rt.hashes``; returns the count."""
    bs = rt.rcfg[RC_BLOCK_SIZE]
    n = input_len // bs
    base = chunk_off[r]
    prev = np.uint64(0)
    for k in range(n):
        prev = chain_hash(prev, chunk_dig[base + k])
        rt.hashes[k] = prev
    return n


@njit(cache=True, _nrt=False, error_model="numpy")
def _leading_hits(table, i, hashes, n):
    count = 0
    for k in range(n):
        if _tget(table, i, hashes[k]) < 0:
            break
        count += 1
    return count


# ---------------------------------------------------------------- snapshots


@njit(cache=True, _nrt=False, error_model="numpy")
def refresh_cache_signal(rt, kv, clock):
    """Re-freeze every instance's cache hash map when the signal delay has elapsed (DELTA-33).

    The frozen copies are kept current incrementally from the KV cache's change log.
    """
    delay = rt.rcfg[RC_CACHE_DELAY]
    if rt.rcfg[RC_USES_CACHE_QUERY] == 0 or delay <= 0:
        return
    if clock - rt.st[ST_CACHE_LAST] < delay:
        return
    for i in range(kv.ht.shape[0]):
        kvc.sync_frozen_copy(kv, i, rt.cq_table)
    rt.st[ST_CACHE_LAST] = clock


@njit(cache=True, _nrt=False, error_model="numpy")
def take_snapshots(rt, wq, batch_len, kv_meta, cpu_meta, cnt, k_preempt, k_inflight,
                   total_blocks, clock):
    """Refresh each instance's cached snapshot groups as the provider would (CLU-3.7/3.8,
    DELTA-37); in-flight counts are always current."""
    period = rt.rcfg[RC_REFRESH]
    n = rt.snap_i.shape[0]
    for i in range(n):
        if period <= 0 or clock - rt.snap_last[i, G_PREEMPT] >= period:
            rt.snap_i[i, SN_PREEMPT] = cnt[i, k_preempt]
            rt.snap_last[i, G_PREEMPT] = clock
        if period <= 0 or clock - rt.snap_last[i, G_QUEUE] >= period:
            rt.snap_i[i, SN_QUEUE] = wq[i, 2]
            rt.snap_last[i, G_QUEUE] = clock
        if period <= 0 or clock - rt.snap_last[i, G_BATCH] >= period:
            rt.snap_i[i, SN_BATCH] = batch_len[i]
            rt.snap_last[i, G_BATCH] = clock
        if period <= 0 or clock - rt.snap_last[i, G_KV] >= period:
            free = kv_meta[i, M_FREE]
            used = total_blocks - free
            rt.snap_f[i, 0] = np.float64(used) / np.float64(total_blocks)
            rt.snap_i[i, SN_FREE] = free
            hits = kv_meta[i, M_HITS]
            total = hits + kv_meta[i, M_MISSES] + cpu_meta[i, C_MISS]
            rt.snap_f[i, 1] = np.float64(hits) / np.float64(total) if total > 0 else 0.0
            rt.snap_last[i, G_KV] = clock
        rt.inflight_view[i] = cnt[i, k_inflight]


@njit(cache=True, _nrt=False, error_model="numpy")
def on_routed(rt, r):
    """Tenant in-flight accounting when a request is dispatched (DELTA-40)."""
    t = rt.req_tenant[r]
    if rt.rcfg[RC_HAS_TENANT_BUDGETS] == 1 and t >= 0:
        rt.tenant_inflight[t] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def on_done(rt, r):
    """Tenant in-flight accounting when an instance finishes with a request (DELTA-40)."""
    t = rt.req_tenant[r]
    if rt.rcfg[RC_HAS_TENANT_BUDGETS] == 1 and t >= 0 and rt.tenant_inflight[t] > 0:
        rt.tenant_inflight[t] -= 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _load(rt, i):
    return rt.snap_i[i, SN_QUEUE] + rt.snap_i[i, SN_BATCH] + rt.inflight_view[i]


@njit(cache=True, _nrt=False, error_model="numpy")
def _fill_hook_view(rt, kv_ht, r, input_len, n_hashes, n, clock, with_cache):
    """Fill rt.hook_snap / rt.hook_req with what a user hook observes."""
    for i in range(n):
        rt.hook_snap[i, hk.SNAP_QUEUE] = rt.snap_i[i, SN_QUEUE]
        rt.hook_snap[i, hk.SNAP_BATCH] = rt.snap_i[i, SN_BATCH]
        rt.hook_snap[i, hk.SNAP_IN_FLIGHT] = rt.inflight_view[i]
        rt.hook_snap[i, hk.SNAP_KV_UTIL] = rt.snap_f[i, 0]
        rt.hook_snap[i, hk.SNAP_FREE_BLOCKS] = rt.snap_i[i, SN_FREE]
        rt.hook_snap[i, hk.SNAP_CACHED_BLOCKS] = (
            _cache_query(rt, kv_ht, i, n_hashes) if with_cache else 0.0)
        rt.hook_snap[i, hk.SNAP_PREEMPTIONS] = rt.snap_i[i, SN_PREEMPT]
    rt.hook_req[hk.REQ_INPUT_LEN] = input_len
    rt.hook_req[hk.REQ_CLOCK] = clock
    rt.hook_req[hk.REQ_ARRIVAL] = 0.0
    rt.hook_req[hk.REQ_SLO_PRIORITY] = rt.req_priority[r]
    rt.hook_req[hk.REQ_INPUT_BLOCKS] = n_hashes
    rt.hook_req[hk.REQ_INDEX] = r


# ---------------------------------------------------------------- admission


@njit(cache=True, _nrt=False, error_model="numpy")
def admit(rt, r, input_len, n, clock, arrival, admit_fn, kv_ht):
    """Admission decision for request ``r`` over ``n`` candidate snapshots (CLU-2,
    DELTA-38..40); ``admit_fn`` is the user rule of the ``custom`` policy.
    Returns (admitted, reason)."""
    code = rt.rcfg[RC_ADMISSION]
    ok = True
    reason = AdmissionReason.NONE
    if code == Admission.REJECT_ALL:
        ok = False
        reason = AdmissionReason.REJECT_ALL
    elif code == Admission.TOKEN_BUCKET:
        elapsed = clock - rt.st[ST_TB_LAST]
        if elapsed > 0:
            refill = np.float64(elapsed) * rt.rfl[RF_TB_REFILL] / 1e6
            rt.tb_tokens[0] = min(rt.rfl[RF_TB_CAPACITY], rt.tb_tokens[0] + refill)
            rt.st[ST_TB_LAST] = clock
        cost = np.float64(input_len)
        if rt.tb_tokens[0] >= cost:
            rt.tb_tokens[0] -= cost
        else:
            ok = False
            reason = AdmissionReason.NO_TOKENS
    elif code == Admission.TIER_SHED:
        max_load = 0
        for i in range(n):
            load = _load(rt, i)
            if load > max_load:
                max_load = load
        if max_load > rt.rcfg[RC_TIER_THRESHOLD]:
            if rt.req_priority[r] < rt.rcfg[RC_TIER_MIN_PRIORITY]:
                ok = False
                reason = AdmissionReason.TIER_SHED
    elif code == Admission.CUSTOM:
        _fill_hook_view(rt, kv_ht, r, input_len, np.int64(0), n, clock, np.int64(0) > 0)
        rt.hook_req[hk.REQ_ARRIVAL] = arrival
        if not admit_fn(rt.hook_snap[:n], rt.hook_req):
            ok = False
            reason = AdmissionReason.CUSTOM
    elif code == Admission.GAIE_LEGACY:
        if rt.req_sheddable[r] == 1:
            total = 0.0
            for i in range(n):
                q_ratio = np.float64(rt.snap_i[i, SN_QUEUE]) / rt.rfl[RF_GAIE_QD]
                kv_ratio = rt.snap_f[i, 0] / rt.rfl[RF_GAIE_KV]
                total += max(q_ratio, kv_ratio)
            sat = total / np.float64(n) if n > 0 else 1.0
            if sat >= 1.0:
                ok = False
                reason = AdmissionReason.GAIE
    if ok and rt.rcfg[RC_HAS_TENANT_BUDGETS] == 1:
        # tenant_budget holds budget * max(1, instances * max running requests) (DELTA-40)
        t = rt.req_tenant[r]
        if t >= 0 and rt.tenant_budget[t] >= 0 and rt.req_sheddable[r] == 1:
            if np.float64(rt.tenant_inflight[t]) > rt.tenant_budget[t]:
                ok = False
                reason = AdmissionReason.TENANT_BUDGET
    if rt.rcfg[RC_TRACE] == 1:
        k = rt.st[ST_N_ADM]
        rt.adm_req[k] = r
        rt.adm_clock[k] = clock
        rt.adm_ok[k] = 1 if ok else 0
        rt.adm_reason[k] = reason
        rt.st[ST_N_ADM] = k + 1
    return ok, reason


# ---------------------------------------------------------------- scorers


@njit(cache=True, _nrt=False, error_model="numpy")
def _minmax_score(rt, n, invert):
    """Min-max normalise rt.raw into rt.dim: (max-x)/(max-min) or (x-min)/(max-min); 1 if equal."""
    lo = rt.raw[0]
    hi = rt.raw[0]
    for i in range(1, n):
        if rt.raw[i] < lo:
            lo = rt.raw[i]
        if rt.raw[i] > hi:
            hi = rt.raw[i]
    for i in range(n):
        if hi == lo:
            rt.dim[i] = 1.0
        elif invert:
            rt.dim[i] = np.float64(hi - rt.raw[i]) / np.float64(hi - lo)
        else:
            rt.dim[i] = np.float64(rt.raw[i] - lo) / np.float64(hi - lo)


@njit(cache=True, _nrt=False, error_model="numpy")
def _pa_match(rt, i, n_hashes):
    if rt.pa_meta[i, 2] == 0:
        return 0
    return _leading_hits(rt.pa_table, i, rt.hashes, n_hashes)


@njit(cache=True, _nrt=False, error_model="numpy")
def _pa_record(rt, i, n_hashes):
    """Record the request's block hashes as most recently used on instance ``i``."""
    cap = rt.pa_hash.shape[1]
    meta = rt.pa_meta
    for k in range(n_hashes):
        h = rt.hashes[k]
        node = _tget(rt.pa_table, i, h)
        if node >= 0:
            # unlink, then push at head
            p = rt.pa_prev[i, node]
            q = rt.pa_next[i, node]
            if p >= 0:
                rt.pa_next[i, p] = q
            else:
                meta[i, 0] = q
            if q >= 0:
                rt.pa_prev[i, q] = p
            else:
                meta[i, 1] = p
        else:
            if meta[i, 2] >= cap:
                victim = meta[i, 1]
                _tdel(rt.pa_table, i, rt.pa_hash[i, victim])
                p = rt.pa_prev[i, victim]
                if p >= 0:
                    rt.pa_next[i, p] = -1
                else:
                    meta[i, 0] = -1
                meta[i, 1] = p
                meta[i, 2] -= 1
                node = victim
            else:
                node = meta[i, 3]
                meta[i, 3] += 1
            rt.pa_hash[i, node] = h
            _tput(rt.pa_table, i, h, node)
            meta[i, 2] += 1
        rt.pa_prev[i, node] = -1
        head = meta[i, 0]
        rt.pa_next[i, node] = head
        if head >= 0:
            rt.pa_prev[i, head] = node
        meta[i, 0] = node
        if meta[i, 1] < 0:
            meta[i, 1] = node


@njit(cache=True, _nrt=False, error_model="numpy")
def _cache_query(rt, kv_ht, i, n_hashes):
    if rt.rcfg[RC_CACHE_DELAY] > 0:
        return _leading_hits(rt.cq_table, i, rt.hashes, n_hashes)
    return _leading_hits(kv_ht, i, rt.hashes, n_hashes)


@njit(cache=True, _nrt=False, error_model="numpy")
def _score_dimension(rt, code, r, n, n_hashes, scorer_table):
    """One scorer's values for every candidate into rt.dim (CLU-3.22, DELTA-32/34; the
    stateless scorers are table cfuncs reading rt.hook_snap)."""
    if code >= StatefulScorer.TABLE_BASE:
        scorer_table[code - StatefulScorer.TABLE_BASE](rt.hook_snap[:n], rt.hook_req, rt.dim[:n])
    elif code == StatefulScorer.PREFIX_AFFINITY:
        for i in range(n):
            if n_hashes == 0:
                rt.dim[i] = 0.0
            else:
                rt.dim[i] = np.float64(_pa_match(rt, i, n_hashes)) / np.float64(n_hashes)
    elif code == StatefulScorer.PRECISE_PREFIX_CACHE:
        for i in range(n):
            rt.raw[i] = np.int64(rt.hook_snap[i, hk.SNAP_CACHED_BLOCKS])
        _minmax_score(rt, n, False)
    elif code == StatefulScorer.NO_HIT_LRU:
        warm = False
        for i in range(n):
            if rt.hook_snap[i, hk.SNAP_CACHED_BLOCKS] > 0:
                warm = True
                break
        rt.st[ST_NH_LAST_REQ] = r
        rt.st[ST_NH_LAST_WARM] = 1 if warm else 0
        if warm:
            for i in range(n):
                rt.dim[i] = 0.5
        elif n <= 1:
            for i in range(n):
                rt.dim[i] = 1.0
        else:
            rank = 0
            for i in range(n):
                if rt.nh_set[i] == 0:
                    rt.dim[i] = 1.0 - np.float64(rank) / np.float64(n - 1)
                    rank += 1
            for k in range(rt.st[ST_NH_LEN] - 1, -1, -1):
                i = rt.nh_order[k]
                rt.dim[i] = 1.0 - np.float64(rank) / np.float64(n - 1)
                rank += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _nh_observe(rt, r, target):
    if rt.st[ST_NH_LAST_WARM] == 1 or rt.st[ST_NH_LAST_REQ] != r:
        return
    length = rt.st[ST_NH_LEN]
    if rt.nh_set[target] == 1:
        pos = 0
        while rt.nh_order[pos] != target:
            pos += 1
        for k in range(pos, length - 1):
            rt.nh_order[k] = rt.nh_order[k + 1]
        length -= 1
    for k in range(length, 0, -1):
        rt.nh_order[k] = rt.nh_order[k - 1]
    rt.nh_order[0] = target
    rt.nh_set[target] = 1
    rt.st[ST_NH_LEN] = length + 1


# ---------------------------------------------------------------- routing


@njit(cache=True, _nrt=False, error_model="numpy")
def route(rt, kv_ht, chunk_off, chunk_dig, r, input_len, clock, inst_rank, arrival,
          scorer_table):
    """Choose the target instance for request ``r`` (CLU-3.11..3.16); records the trace."""
    code = rt.rcfg[RC_ROUTING]
    n = rt.snap_i.shape[0]
    target = 0
    best = 0.0
    if code == Routing.ROUND_ROBIN:
        target = rt.st[ST_RR] % n
        best = np.float64(rt.st[ST_RR])
        rt.st[ST_RR] += 1
    elif code == Routing.LEAST_LOADED or code == Routing.ALWAYS_BUSIEST:
        extreme = _load(rt, 0)
        for i in range(1, n):
            load = _load(rt, i)
            if (code == Routing.LEAST_LOADED and load < extreme) or (
                    code == Routing.ALWAYS_BUSIEST and load > extreme):
                extreme = load
        best = np.float64(extreme)
        if code == Routing.ALWAYS_BUSIEST:
            for i in range(n):
                if _load(rt, i) == extreme:
                    target = i
                    break
        else:
            n_tied = 0
            for i in range(n):
                if _load(rt, i) == extreme:
                    rt.tied[n_tied] = i
                    n_tied += 1
            target = rt.tied[0]
            if n_tied > 1:
                target = rt.tied[intn(rt.rng, n_tied)]
    else:  # weighted
        n_hashes = np.int64(0)
        if rt.rcfg[RC_USES_CACHE_QUERY] == 1 or rt.pa_hash.shape[1] > 1:
            n_hashes = input_hashes(rt, chunk_off, chunk_dig, r, input_len)
        _fill_hook_view(rt, kv_ht, r, input_len, n_hashes, n, clock,
                        rt.rcfg[RC_USES_CACHE_QUERY] == 1)
        rt.hook_req[hk.REQ_ARRIVAL] = arrival
        for i in range(n):
            rt.scores[i] = 0.0
        for s in range(rt.rcfg[RC_N_SCORERS]):
            _score_dimension(rt, rt.scorer_codes[s], r, n, n_hashes, scorer_table)
            w = rt.scorer_weights[s]
            for i in range(n):
                v = rt.dim[i]
                if v < 0:
                    v = 0.0
                if v > 1:
                    v = 1.0
                rt.scores[i] += v * w
        best = -1.0
        for i in range(n):
            if rt.scores[i] > best:
                best = rt.scores[i]
        n_tied = 0
        for i in range(n):
            if rt.scores[i] == best:
                rt.tied[n_tied] = i
                n_tied += 1
        target = rt.tied[0]
        if n_tied > 1:
            target = rt.tied[intn(rt.rng, n_tied)]
        for s in range(rt.rcfg[RC_N_SCORERS]):
            c = rt.scorer_codes[s]
            if c == StatefulScorer.PREFIX_AFFINITY:
                _pa_record(rt, target, n_hashes)
            elif c == StatefulScorer.NO_HIT_LRU:
                _nh_observe(rt, r, target)
    if rt.rcfg[RC_TRACE] == 1:
        _record_routing(rt, code, r, clock, target, best, inst_rank)
    return target


@njit(cache=True, _nrt=False, error_model="numpy")
def _record_routing(rt, code, r, clock, target, best, inst_rank):
    k = rt.st[ST_N_ROUTE]
    rt.st[ST_N_ROUTE] = k + 1
    rt.rt_req[k] = r
    rt.rt_clock[k] = clock
    rt.rt_target[k] = target
    rt.rt_best[k] = best
    n = rt.snap_i.shape[0]
    weighted = code == Routing.WEIGHTED
    if weighted:
        for i in range(n):
            rt.rt_scores[k, i] = rt.scores[i]
    kk = rt.rcfg[RC_CF_K]
    if kk <= 0:
        return
    # candidate score: the composite for weighted routing, else minus the effective load
    for i in range(n):
        rt.dim[i] = rt.scores[i] if weighted else -np.float64(_load(rt, i))
        rt.order[i] = i
    # insertion sort: score descending, then instance id ascending (string order)
    for a in range(1, n):
        x = rt.order[a]
        b = a - 1
        while b >= 0:
            y = rt.order[b]
            if rt.dim[y] > rt.dim[x] or (rt.dim[y] == rt.dim[x]
                                         and inst_rank[y] < inst_rank[x]):
                break
            rt.order[b + 1] = y
            b -= 1
        rt.order[b + 1] = x
    m = min(kk, n)
    for j in range(m):
        i = rt.order[j]
        rt.cf_inst[k, j] = i
        rt.cf_score[k, j] = rt.dim[i]
        rt.cf_int[k, j, 0] = rt.snap_i[i, SN_QUEUE]
        rt.cf_int[k, j, 1] = rt.snap_i[i, SN_BATCH]
        rt.cf_int[k, j, 2] = rt.inflight_view[i]
        rt.cf_int[k, j, 3] = rt.snap_i[i, SN_FREE]
        rt.cf_kv[k, j] = rt.snap_f[i, 0]
    regret = rt.dim[rt.order[0]] - rt.dim[target]
    rt.rt_regret[k] = regret if regret > 0 else 0.0
