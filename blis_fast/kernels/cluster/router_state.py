"""The cluster router's state: :class:`RouterState`, its slot families and its constructor.

``RouterState`` holds the snapshot cache (periodic refresh per field group, CLU-3.7/3.8), the
router's Go-rand stream for tie-breaking, the token bucket, the prefix-affinity LRU index per
instance, frozen copies of the instance prefix tables for the cache-signal delay (DELTA-33),
the no-hit LRU, tenant counters (DELTA-40), per-request router inputs, decision-trace buffers
(CLU-6) and what user hooks observe (``kernels/cluster/hooks.py``). Admission is in
``kernels/cluster/admission.py``, routing in ``kernels/cluster/routing.py``, the scorers in
``kernels/cluster/scorers.py``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.cluster import hooks as hk
from blis_fast.kernels.enums import Routing, StatefulScorer

PREFIX_LRU_CAPACITY = 10000  # sim/routing_prefix_scorer.go defaultLRUCapacity


class RouterCfgT(NamedTuple):
    """Slots of ``RouterState.rcfg`` (int64 configuration)."""

    ROUTING: int = 0  # Routing code
    ADMISSION: int = 1  # Admission code
    REFRESH: int = 2  # snapshot refresh interval (0 = always current)
    CACHE_DELAY: int = 3  # cache-signal delay
    N_SCORERS: int = 4
    TRACE: int = 5  # 1 when decisions are traced
    COUNTERFACTUAL_K: int = 6
    TIER_THRESHOLD: int = 7
    TIER_MIN_PRIORITY: int = 8
    HAS_TENANT_BUDGETS: int = 9
    USES_CACHE_QUERY: int = 10  # weighted routing with a scorer that reads the caches
    BLOCK_SIZE: int = 11
    SIZE: int = 12


RouterCfg = RouterCfgT()


class RouterVarT(NamedTuple):
    """Slots of ``RouterState.st`` (int64 scalars that change as the run goes)."""

    RR: int = 0  # round-robin counter
    TB_LAST: int = 1  # last token-bucket refill tick
    CACHE_LAST: int = 2  # last freeze of the cache copies
    NH_LEN: int = 3  # no-hit LRU length
    NH_LAST_REQ: int = 4  # the request the no-hit scorer last scored (-1 = none)
    NH_LAST_WARM: int = 5  # 1 when some instance had its prefix cached then
    N_ADMISSION_RECORDS: int = 6
    N_ROUTING_RECORDS: int = 7
    N_ROUTABLE: int = 8  # instances in ``routable``
    SIZE: int = 9


RouterVar = RouterVarT()


class SnapFieldT(NamedTuple):
    """Columns of ``RouterState.snap_i`` (an instance's integer snapshot)."""

    QUEUE: int = 0
    BATCH: int = 1
    FREE: int = 2  # free KV blocks
    PREEMPTIONS: int = 3
    TOTAL: int = 4  # KV blocks of the instance (0 until the KV group's first refresh)
    SIZE: int = 5


SnapField = SnapFieldT()


class SnapRateT(NamedTuple):
    """Columns of ``RouterState.snap_f`` (an instance's float snapshot)."""

    KV_UTIL: int = 0
    HIT_RATE: int = 1
    SIZE: int = 2


SnapRate = SnapRateT()


class SnapGroupT(NamedTuple):
    """Columns of ``RouterState.snap_last``: the snapshot field groups refreshed together."""

    QUEUE: int = 0
    BATCH: int = 1
    KV: int = 2
    PREEMPT: int = 3
    SIZE: int = 4


SnapGroup = SnapGroupT()


class LruMetaT(NamedTuple):
    """Columns of ``RouterState.pa_meta`` (an instance's prefix-affinity LRU)."""

    HEAD: int = 0  # most recent node (-1 = empty)
    TAIL: int = 1  # least recent node
    LEN: int = 2
    NEXT_NODE: int = 3  # nodes handed out so far
    SIZE: int = 4


LruMeta = LruMetaT()


class CandidateCountT(NamedTuple):
    """Columns of ``RouterState.cf_int`` (a counterfactual candidate's snapshot counts)."""

    QUEUE: int = 0
    BATCH: int = 1
    IN_FLIGHT: int = 2
    FREE: int = 3
    SIZE: int = 4


CandidateCount = CandidateCountT()


class RouterState(NamedTuple):
    """Everything the router keeps (see the module docstring)."""

    rcfg: np.ndarray  # RouterCfg
    rfl: np.ndarray  # the admission policies' float parameters (kernels/cluster/admission.py: RouterParam)
    st: np.ndarray  # RouterVar
    tb_tokens: np.ndarray  # float64 [1] token-bucket level
    scorer_codes: np.ndarray  # StatefulScorer codes or TABLE_BASE + table index
    scorer_weights: np.ndarray  # normalised weights
    rng: np.ndarray  # Go rand state (kernels/go/gorand.py)
    # the instances eligible for a decision (CLU-3.7: routable, in index order); a fixed fleet
    # lists every instance; ``cand`` holds a filtered list (a pool) and ``pos`` maps an
    # instance to its place in the candidate list of the decision at hand (-1 = not in it)
    routable: np.ndarray  # int64 [n]; the first st[RouterVar.N_ROUTABLE] are valid
    cand: np.ndarray  # int64 [n]
    pos: np.ndarray  # int64 [n]
    snap_i: np.ndarray  # [n, SnapField]
    snap_f: np.ndarray  # [n, SnapRate]
    snap_last: np.ndarray  # [n, SnapGroup] tick of each group's last refresh
    inflight_view: np.ndarray  # [n] in-flight counts (always current)
    # per candidate of the decision at hand (position k: instance cand[k])
    scores: np.ndarray  # [n] composite scores
    dim: np.ndarray  # [n] one scorer's values
    tied: np.ndarray  # [n] positions tied for the best
    order: np.ndarray  # [n] counterfactual ranking (positions)
    hashes: np.ndarray  # uint64 block hashes of the request's input (prefix affinity)
    found: np.ndarray  # int64 values of a prefix walk (unused beyond the count)
    # prefix-affinity router index, per instance: LRU nodes and a hash -> node table
    pa_hash: np.ndarray
    pa_prev: np.ndarray
    pa_next: np.ndarray
    pa_table: np.ndarray
    pa_meta: np.ndarray  # [n, LruMeta]
    cq_table: np.ndarray  # frozen copy of every instance's prefix table (cache-signal delay)
    nh_order: np.ndarray  # no-hit LRU: instance ids, most recent first
    nh_set: np.ndarray  # and membership
    # per-request inputs: SLO priority (tier), sheddable flag, tenant code, model mismatch flag
    req_priority: np.ndarray
    req_sheddable: np.ndarray
    req_tenant: np.ndarray
    req_model_bad: np.ndarray
    tenant_inflight: np.ndarray  # per tenant: in flight, and budget (negative = none)
    tenant_budget: np.ndarray
    # decision trace (CLU-6)
    adm_req: np.ndarray
    adm_clock: np.ndarray
    adm_ok: np.ndarray
    adm_reason: np.ndarray
    rt_req: np.ndarray
    rt_clock: np.ndarray
    rt_target: np.ndarray
    rt_regret: np.ndarray
    rt_best: np.ndarray
    rt_scores: np.ndarray
    cf_inst: np.ndarray
    cf_score: np.ndarray
    cf_int: np.ndarray  # [records, k, CandidateCount]
    cf_kv: np.ndarray
    # what user hooks observe (kernels/cluster/hooks.py): one row per candidate, and the request
    hook_snap: np.ndarray
    hook_req: np.ndarray
    lora_warm: np.ndarray  # float64 [n] the lora-affinity scorer's values per candidate
    # position (kernels/engine/lora.py: fill_affinity; 1.0, neutral, without LoRA)


def new_router_state(
    n_instances: int,
    n_requests: int,
    *,
    routing: int,
    scorer_codes: np.ndarray,
    scorer_weights: np.ndarray,
    rng_state: np.ndarray,
    cache_delay: int = 0,
    trace: bool = False,
    counterfactual_k: int = 0,
    req_priority: np.ndarray | None = None,
    req_sheddable: np.ndarray | None = None,
    req_tenant: np.ndarray | None = None,
    req_model_bad: np.ndarray | None = None,
    tenant_budget: np.ndarray | None = None,
    max_chunks: int = 1,
    table_size: int = 16,
    uses_cache_query: bool = False,
    decider_reads_cache: bool = False,
    trace_scores: bool = False,
    admission_param_slots: int,
) -> RouterState:
    """Allocate the router state (trace buffers only when tracing is on); ``routing``,
    ``cache_delay`` and ``counterfactual_k`` size it. ``decider_reads_cache``: something
    besides this policy reads the cache view (the P/D decider, a pool's scorers);
    ``trace_scores``: traced decisions carry scores even when ``routing`` is not weighted (a
    pool's weighted policy makes them); ``admission_param_slots``: the length of ``rfl``
    (``kernels/cluster/admission.py: RouterParam.SIZE``, which imports this module). The policy codes
    and parameters in ``rcfg``/``rfl`` are packed by the caller from the declared slots
    (engine/engine_config.py)."""
    n = n_instances
    rcfg = np.zeros(RouterCfg.SIZE, np.int64)
    rcfg[RouterCfg.ROUTING] = routing
    rcfg[RouterCfg.CACHE_DELAY] = cache_delay
    rcfg[RouterCfg.N_SCORERS] = len(scorer_codes)
    rcfg[RouterCfg.TRACE] = 1 if trace else 0
    rcfg[RouterCfg.COUNTERFACTUAL_K] = counterfactual_k
    has_budgets = tenant_budget is not None and len(tenant_budget) > 0
    rcfg[RouterCfg.HAS_TENANT_BUDGETS] = 1 if has_budgets else 0
    codes = [int(c) for c in scorer_codes]
    uses_pa = routing == Routing.WEIGHTED and StatefulScorer.PREFIX_AFFINITY in codes
    # the router's cache view is kept when a scorer or the P/D prefix-threshold decider reads it
    uses_cq = (routing == Routing.WEIGHTED and uses_cache_query) or decider_reads_cache
    rcfg[RouterCfg.USES_CACHE_QUERY] = 1 if uses_cq else 0
    rfl = np.zeros(admission_param_slots, np.float64)
    st = np.zeros(RouterVar.SIZE, np.int64)
    st[RouterVar.NH_LAST_REQ] = -1
    st[RouterVar.N_ROUTABLE] = n
    pa_cap = PREFIX_LRU_CAPACITY if uses_pa else 1
    pa_tbl = 16
    while uses_pa and pa_tbl < 2 * pa_cap:
        pa_tbl *= 2
    pa_meta = np.zeros((n, LruMeta.SIZE), np.int64)
    pa_meta[:, LruMeta.HEAD] = -1
    pa_meta[:, LruMeta.TAIL] = -1
    cq_size = table_size if (uses_cq and cache_delay > 0) else 1
    rec = n_requests if trace else 1
    k = max(counterfactual_k, 1) if trace else 1
    rows = max(n_requests, 1)
    none_i8 = np.zeros(rows, np.int8)
    n_tenants = max(len(tenant_budget) if tenant_budget is not None else 0, 1)
    return RouterState(
        rcfg=rcfg, rfl=rfl, st=st, tb_tokens=np.zeros(1, np.float64),
        scorer_codes=np.ascontiguousarray(scorer_codes, np.int64),
        scorer_weights=np.ascontiguousarray(scorer_weights, np.float64),
        rng=rng_state,
        routable=np.arange(n, dtype=np.int64), cand=np.arange(n, dtype=np.int64),
        pos=np.full(n, -1, np.int64),
        snap_i=np.zeros((n, SnapField.SIZE), np.int64),
        snap_f=np.zeros((n, SnapRate.SIZE), np.float64),
        snap_last=np.zeros((n, SnapGroup.SIZE), np.int64), inflight_view=np.zeros(n, np.int64),
        scores=np.zeros(n, np.float64), dim=np.zeros(n, np.float64),
        tied=np.zeros(n, np.int64), order=np.zeros(n, np.int64),
        hashes=np.zeros(max_chunks + 1, np.uint64), found=np.zeros(max_chunks + 1, np.int64),
        pa_hash=np.zeros((n, pa_cap), np.uint64), pa_prev=np.full((n, pa_cap), -1, np.int64),
        pa_next=np.full((n, pa_cap), -1, np.int64),
        pa_table=np.zeros((n, pa_tbl, 2), np.uint64), pa_meta=pa_meta,
        cq_table=np.zeros((n, cq_size, 2), np.uint64),
        nh_order=np.zeros(n, np.int64), nh_set=np.zeros(n, np.int8),
        req_priority=(req_priority if req_priority is not None
                      else np.full(rows, 3, np.int64)),
        req_sheddable=req_sheddable if req_sheddable is not None else none_i8,
        req_tenant=req_tenant if req_tenant is not None else np.full(rows, -1, np.int64),
        req_model_bad=req_model_bad if req_model_bad is not None else none_i8.copy(),
        tenant_inflight=np.zeros(n_tenants, np.int64),
        tenant_budget=tenant_budget if has_budgets else np.full(1, -1.0),
        adm_req=np.zeros(rec, np.int64), adm_clock=np.zeros(rec, np.int64),
        adm_ok=np.zeros(rec, np.int8), adm_reason=np.zeros(rec, np.int8),
        rt_req=np.zeros(rec, np.int64), rt_clock=np.zeros(rec, np.int64),
        rt_target=np.zeros(rec, np.int64), rt_regret=np.zeros(rec, np.float64),
        rt_best=np.zeros(rec, np.float64),
        rt_scores=np.zeros((rec if trace and (routing == Routing.WEIGHTED or trace_scores)
                            else 1, n), np.float64),
        cf_inst=np.full((rec, k), -1, np.int64), cf_score=np.zeros((rec, k), np.float64),
        cf_int=np.zeros((rec, k, CandidateCount.SIZE), np.int64),
        cf_kv=np.zeros((rec, k), np.float64),
        hook_snap=np.zeros((n, hk.SNAP_COLS), np.float64),
        hook_req=np.zeros(hk.REQ_COLS, np.float64), lora_warm=np.ones(n, np.float64),
    )


def pool_router(main: RouterState, scorer_codes: np.ndarray, scorer_weights: np.ndarray,
                rng_state: np.ndarray, uses_cache_query: bool) -> RouterState:
    """A P/D pool's own weighted policy (PD-2.3, PD-2.9): its scorers, weights, Go-rand stream,
    prefix-affinity index and no-hit LRU, over the snapshots, cache view, scratch and trace
    buffers of ``main`` (whose ``rcfg`` is already packed). Only ``routing.pick`` runs on it:
    the trace records, snapshots and cache refresh stay with ``main``."""
    n = main.routable.shape[0]
    own = new_router_state(n, 1, routing=Routing.WEIGHTED, scorer_codes=scorer_codes,
                           scorer_weights=scorer_weights, rng_state=rng_state,
                           admission_param_slots=1)  # the pool shares main's rfl
    rcfg = main.rcfg.copy()
    rcfg[RouterCfg.ROUTING] = Routing.WEIGHTED
    rcfg[RouterCfg.N_SCORERS] = len(scorer_codes)
    rcfg[RouterCfg.USES_CACHE_QUERY] = 1 if uses_cache_query else 0
    return main._replace(
        rcfg=rcfg, st=own.st, scorer_codes=own.scorer_codes, scorer_weights=own.scorer_weights,
        rng=own.rng, pa_hash=own.pa_hash, pa_prev=own.pa_prev, pa_next=own.pa_next,
        pa_table=own.pa_table, pa_meta=own.pa_meta, nh_order=own.nh_order, nh_set=own.nh_set)
