"""Pack a run's configuration and workload into arrays, run the kernel, unpack the results."""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numba.core.errors import NumbaExperimentalFeatureWarning

from blis_fast.engine.sessions import FollowUp, SessionDriver
from blis_fast.errors import BlisRuntimeError
from blis_fast.kernels.enums import (
    RequestState,
    Routing,
    SessionOutcome,
    Status,
)
from blis_fast.kernels.event_loop import SEQ_LIMIT, push_cluster_arrivals, simulate
from blis_fast.kernels.gomath import INT64_MAX
from blis_fast.kernels.gorand import new_source, subsystem_seed
from blis_fast.kernels.heap import MAX_INSTANCES
from blis_fast.kernels.kv_layout import (
    BlockList,
    CpuMeta,
    KVConfig,
    KVMeta,
    new_kv_state,
    pool_slots,
)
from blis_fast.kernels.router_state import RouterCfg, RouterParam, RouterVar, new_router_state
from blis_fast.kernels.state import (
    ConfigSlot,
    HotField,
    InstanceCounter,
    KernelHooks,
    LogCursor,
    LoopSlot,
    OutcomeField,
    QueueField,
    Rejection,
    RequestInputs,
    SessionBuffers,
    SimConfig,
    new_event_heap,
    new_instance_arrays,
    new_request_arrays,
    new_step_log,
    new_work,
)
from blis_fast.options import RUN_OPTIONS
from blis_fast.policies.admission import ADMISSION, admission_params
from blis_fast.policies.latency_backends import LATENCY_BACKENDS
from blis_fast.policies.priority import DEFAULT_SLO_PRIORITY, PRIORITY, SLO_PRIORITIES
from blis_fast.policies.routing import ROUTING
from blis_fast.policies.scheduler import SCHEDULER
from blis_fast.policies.scorers import DEFAULT_PROFILE, SCORERS

if TYPE_CHECKING:
    from blis_fast.config.latency import LatencyConfig
    from blis_fast.config.policy_bundle import Policies

KERNEL_FAILURES = {
    Status.UNKNOWN_BACKEND: "the simulation kernel does not know the latency backend code it "
                            "was given",
    Status.UNKNOWN_POLICY: "the simulation kernel does not know an admission, routing, "
                           "priority, scheduler or scorer code it was given",
    Status.TOO_MANY_INSTANCES: f"the simulation kernel supports at most {MAX_INSTANCES} "
                               "instances",
    Status.SEQ_OVERFLOW: "the run pushed more events than the event key can number "
                         f"({SEQ_LIMIT})",
}
"""Messages for the kernel's error statuses (the kernel returns codes, it never raises)."""

SLOT_ARRAYS = {"ConfigSlot": ConfigSlot, "RouterCfg": RouterCfg, "RouterParam": RouterParam}
"""The slot families a ``"<family>.<slot>"`` slot names, by family (the config arrays
they index: ``SimConfig.ints``, ``RouterState.rcfg``, ``RouterState.rfl``)."""


@dataclass(frozen=True)
class EngineConfig:
    """What the kernel runs, composed from the resolved parts of a run.

    ``options`` holds every flag's effective value (the resolved horizon, KV blocks,
    max-model-len and counterfactual k included); ``latency`` the backend's code, α and packed
    parameters; ``policies`` the merged policy names, scorers and admission parameters.
    """

    options: Any  # blis_fast.options.RunOptions
    latency: LatencyConfig
    policies: Policies
    hash_decode_blocks: bool = False  # register decode-filled blocks (accumulating sessions)
    hooks: Hooks | None = None  # user policies (custom scorer / admission / scheduler key)

    @property
    def scorers(self) -> tuple[tuple[str, float], ...]:
        """Weighted routing's scorers and weights (the default profile when none is set)."""
        return self.policies.scorers or DEFAULT_PROFILE

    @property
    def trace_decisions(self) -> bool:
        """True when the decision trace is recorded (``--trace-level decisions``)."""
        return self.options.trace_level == "decisions"

    def slot_values(self) -> list[tuple[str, int | float]]:
        """Every kernel config slot (``"<array>.<constant>"``) with its value: the options rows
        naming a slot, each policy family's chosen code, the admission parameters and the
        latency backend's per-token and post-decode times."""
        pol, lat = self.policies, self.latency
        values: list[tuple[str, int | float]] = [
            (spec.slot, getattr(self.options, spec.field)) for spec in RUN_OPTIONS if spec.slot]
        values += [(registry.slot, registry.code(name)) for registry, name in (
            (ADMISSION, pol.admission), (ROUTING, pol.routing), (PRIORITY, pol.priority),
            (SCHEDULER, pol.scheduler))]
        values.append((LATENCY_BACKENDS.slot, lat.code))
        values += [(p.slot, pol.params[p.key]) for p in admission_params()]
        values += [("ConfigSlot.OUTPUT_TOKEN_TIME", lat.output_token_time),
                   ("ConfigSlot.POST_DECODE", lat.post_decode_overhead)]
        return values

    def pack_slots(self, arrays: dict[str, np.ndarray]) -> None:
        """Write ``slot_values`` into the config arrays named by their slots."""
        for slot, value in self.slot_values():
            family, name = slot.split(".")
            arrays[family][getattr(SLOT_ARRAYS[family], name)] = value


@dataclass(frozen=True)
class Hooks:
    """User policy hooks, each a Numba cfunc of the signature in blis_fast.kernels.hooks."""

    scorer: object | None = None
    admission: object | None = None
    scheduler_key: object | None = None


@dataclass
class DecisionTrace:
    """Admission and routing decision records (CLU-6), when tracing is on."""

    admission_request: np.ndarray
    admission_clock: np.ndarray
    admitted: np.ndarray
    admission_reason: np.ndarray  # AdmissionReason codes (kernels/enums.py)
    routing_request: np.ndarray
    routing_clock: np.ndarray
    routing_target: np.ndarray
    routing_regret: np.ndarray
    routing_best: np.ndarray  # policy-specific: best composite score, extreme load, RR counter
    routing_scores: np.ndarray | None  # [decisions, instances] composite scores (weighted only)
    candidate_instance: np.ndarray  # [decisions, k]; -1 = none
    candidate_score: np.ndarray
    candidate_counts: np.ndarray  # [decisions, k, 4]: queue depth, batch size, in-flight, free
    candidate_kv_utilization: np.ndarray


@dataclass
class SimulationResult:
    """Raw per-request, per-instance and per-step results of one run."""

    config: EngineConfig
    table: object  # the RequestTable of every simulated request (follow-ups appended)
    # per request
    state: np.ndarray
    instance: np.ndarray
    registered: np.ndarray
    ttft_us: np.ndarray  # -1 when no first token
    e2e_us: np.ndarray  # -1 unless completed
    itl_sum_us: np.ndarray
    itl_count: np.ndarray
    sched_delay_us: np.ndarray  # -1 when never admitted
    length_capped: np.ndarray
    # per instance
    counters: np.ndarray  # int64 [N, InstanceCounter.SIZE]
    kv_integral: np.ndarray
    wait_queue_sum: np.ndarray  # [N, 2] sum of per-step wait-queue lengths, number of steps
    cache_hit_rate: np.ndarray
    thrashing_rate: np.ndarray
    still_queued: np.ndarray  # per instance, wait-queue length at the end
    still_running: np.ndarray  # per instance, running-batch size at the end
    rejected_admission: int
    rejected_routing: int
    decisions: DecisionTrace | None
    # per step
    step_time: np.ndarray
    step_instance: np.ndarray
    step_duration: np.ndarray
    step_queue: np.ndarray
    step_running: np.ndarray
    step_kv_used: np.ndarray
    step_itl_count: np.ndarray

    @property
    def sim_ended_us(self) -> np.ndarray:
        """Per-instance SimEndedTime = min(clock, horizon)."""
        return np.minimum(self.counters[:, InstanceCounter.CLOCK], self.config.options.horizon)


def id_rank_of(n: int, prefix: str = "request_") -> np.ndarray:
    """Rank of ``<prefix><i>`` ids in byte-wise string order (scheduler tie-breaks)."""
    return _rank_of_ids([f"{prefix}{i}" for i in range(n)])


def _rank_of_ids(id_list) -> np.ndarray:
    """Rank of each id in byte-wise string order."""
    n = len(id_list)
    ids = np.array(id_list)
    order = np.argsort(ids, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n, dtype=np.int64)
    return rank


@contextlib.contextmanager
def hook_errors(hooks: Hooks | None) -> Iterator[list[tuple[str, BaseException]]]:
    """Collect the exceptions user hooks raise inside the kernel.

    A Numba cfunc cannot propagate an exception: it reports it through
    ``sys.unraisablehook`` and returns a default value. While the kernel runs, that hook
    records ``(hook name, exception)`` instead of printing, so the caller can stop the run.
    """
    failures: list[tuple[str, BaseException]] = []
    if hooks is None or not (hooks.scorer or hooks.admission or hooks.scheduler_key):
        yield failures
        return
    previous = sys.unraisablehook
    given = [name for name, fn in (("custom_scorer", hooks.scorer),
                                   ("custom_admission", hooks.admission),
                                   ("custom_scheduler_key", hooks.scheduler_key)) if fn]

    def record(unraisable) -> None:
        # the report names no function: name the hook when only one is set or the message does
        name = next((n for n in given if n in str(unraisable.exc_value)),
                    given[0] if len(given) == 1 else "a user hook (" + ", ".join(given) + ")")
        failures.append((name, unraisable.exc_value))

    sys.unraisablehook = record
    try:
        yield failures
    finally:
        sys.unraisablehook = previous


def _kernel_hooks(hooks: Hooks | None) -> KernelHooks:
    """The kernel's scorer table and admission/scheduler hooks (user cfuncs or placeholders)."""
    from blis_fast.kernels import hooks as H

    hooks = hooks or Hooks()
    return KernelHooks(SCORERS.table(hooks.scorer or H.no_scorer),
                       hooks.admission or H.admit_all, hooks.scheduler_key or H.zero_key)


def _delayed_cache_signal(cfg: EngineConfig) -> bool:
    """True when the router reads frozen copies of the instance caches (DELTA-33)."""
    return (cfg.policies.routing == "weighted" and cfg.options.cache_signal_delay > 0
            and SCORERS.reads_cache(name for name, _ in cfg.scorers))


def instance_rank_of(n: int) -> np.ndarray:
    """Rank of ``instance_<i>`` ids in byte-wise string order (``instance_10`` < ``instance_2``)."""
    return id_rank_of(n, prefix="instance_")


@dataclass
class _RequestMeta:
    """Router-facing request metadata, per client and per request."""

    client_priority: np.ndarray  # int64 SLO priority
    client_tenant: np.ndarray  # int64 tenant code (-1 = no budget)
    client_model_bad: np.ndarray  # int8, 1 when the client's model is not the served one
    tenant_budget: np.ndarray  # float64 in-flight cap per tenant code
    per_request: tuple  # (priority, sheddable, tenant, model_bad) of the table's rows


def _request_metadata(table, cfg: EngineConfig, model: str) -> _RequestMeta:
    """Per-request SLO priority, sheddable flag, tenant code and model-mismatch flag."""
    priorities = dict(SLO_PRIORITIES)
    priorities.update(cfg.policies.slo_priorities)
    clients = table.clients or [{}]
    client_prio = np.array([priorities.get(str(c.get("slo_class", "") or ""),
                                           DEFAULT_SLO_PRIORITY) for c in clients], np.int64)
    budgets = cfg.policies.tenant_budgets
    tenants = sorted(budgets)
    tenant_code = {t: k for k, t in enumerate(tenants)}
    client_tenant = np.array([tenant_code.get(str(c.get("tenant_id", "") or ""), -1)
                              for c in clients], dtype=np.int64)
    client_model_bad = np.array([1 if (c.get("model") or "") not in ("", model) else 0
                                 for c in clients], dtype=np.int8)
    cidx = table.client_idx if table.n else np.zeros(0, np.int32)
    capacity = max(1, cfg.options.num_instances * cfg.options.max_num_running_reqs)
    budget = np.array([budgets[t] * float(capacity) for t in tenants], np.float64)
    prio = client_prio[cidx]
    return _RequestMeta(client_prio, client_tenant, client_model_bad, budget,
                        (prio, (prio < 0).astype(np.int8), client_tenant[cidx],
                         client_model_bad[cidx]))


@dataclass
class SessionPlan:
    """The closed-loop part of a workload: session blueprints and the follow-up budget."""

    blueprints: list
    follow_up_budget: int = -1


@dataclass
class _Capacity:
    """Room reserved for follow-up requests; a run that outgrows it restarts with more."""

    rows: int = 0  # follow-up requests
    chunks: int = 0  # their chunk digests
    pool: int = 0  # their KV block-list slots
    max_chunks: int = 1  # chunks of the longest request

    def grown(self) -> _Capacity:
        """Twice the room in every dimension."""
        return _Capacity(2 * self.rows + 64, 2 * self.chunks + 1024, 2 * self.pool + 1024,
                         2 * self.max_chunks + 16)


class _OutOfRoom(Exception):
    """Follow-ups outgrew the reserved capacity (the run restarts, deterministically)."""


def _initial_capacity(table, sessions: SessionPlan | None) -> _Capacity:
    """Room for the follow-ups a session plan can bring (exact when rounds are bounded)."""
    n = table.n
    chunks = np.diff(table.chunk_offsets) if n else np.zeros(1, np.int64)
    max_chunks = int(chunks.max(initial=0)) + 1
    if not sessions or not sessions.blueprints:
        return _Capacity(0, 0, 0, max_chunks)
    bounded = sum(max(bp.max_rounds - 1, 0) for bp in sessions.blueprints
                  if not bp.unlimited_rounds)
    unbounded = any(bp.unlimited_rounds for bp in sessions.blueprints)
    if sessions.follow_up_budget >= 0:
        rows = min(bounded + sessions.follow_up_budget, sessions.follow_up_budget)
    else:
        rows = bounded + (max(1024, 2 * n) if unbounded else 0)
    accumulate = any(bp.context_growth == "accumulate" for bp in sessions.blueprints)
    per_row = (4 if accumulate else 2) * max(max_chunks, 8)
    return _Capacity(rows, rows * per_row, rows * (per_row + 2), 4 * max_chunks + 64)


def run_engine(table, cfg: EngineConfig, model: str = "",
               sessions: SessionPlan | None = None) -> SimulationResult:
    """Simulate ``table`` (a RequestTable) under ``cfg``; ``sessions`` continues closed-loop
    sessions with follow-ups generated as their requests finish (WL-6.5, CLU-1.15)."""
    from blis_fast.engine.compile_notice import wait_for_engine_compile

    wait_for_engine_compile()
    room = _initial_capacity(table, sessions)
    while True:
        try:
            return _run_once(table, cfg, model, sessions, room)
        except _OutOfRoom:
            room = room.grown()


def _compiled_overload(dispatcher, args):
    """The machine-code entry point ``dispatcher`` chose for ``args`` (no type resolution)."""
    sig = tuple(dispatcher.typeof_pyval(a) for a in args)
    overload = dispatcher.overloads.get(sig)
    return dispatcher if overload is None else overload.entry_point


def _pad(values: np.ndarray, n: int, dtype, fill=0) -> np.ndarray:
    """``values`` as a contiguous ``dtype`` array of length ``n`` (extra rows = ``fill``); the
    array itself when it already is one (no room for follow-ups: nothing writes to it)."""
    if values.shape[0] == n:
        return np.ascontiguousarray(values, dtype=dtype)
    out = np.full(n, fill, dtype=dtype)
    out[: values.shape[0]] = values
    return out


def _config_ints(cfg: EngineConfig, rt) -> np.ndarray:
    """``SimConfig.ints`` by ConfigSlot, with the router's slots: every value the options
    table, the policy registries and the latency part declare a slot for (``pack_slots``)."""
    ints = np.zeros(ConfigSlot.SIZE, dtype=np.int64)
    cfg.pack_slots({"ConfigSlot": ints, "RouterCfg": rt.rcfg, "RouterParam": rt.rfl})
    rt.tb_tokens[0] = rt.rfl[RouterParam.TB_CAPACITY]  # the token bucket starts full
    return ints


def _router_state(cfg: EngineConfig, n: int, meta: _RequestMeta, kv, room: _Capacity):
    """The router's state for ``n`` request rows (scorers, per-request inputs); the policy
    codes and parameters are packed into its slots by ``_config_ints``."""
    opts = cfg.options
    scorers = cfg.scorers
    total_weight = 0.0
    for _, weight in scorers:
        total_weight += weight
    prio, sheddable, tenant, model_bad = (_pad(a, n, a.dtype) for a in meta.per_request)
    return new_router_state(
        opts.num_instances, n,
        routing=ROUTING.code(cfg.policies.routing),
        cache_delay=opts.cache_signal_delay,
        counterfactual_k=opts.counterfactual_k,
        scorer_codes=np.array([SCORERS.code(name) for name, _ in scorers], np.int64),
        uses_cache_query=SCORERS.reads_cache(name for name, _ in scorers),
        scorer_weights=np.array([weight / total_weight for _, weight in scorers], np.float64),
        rng_state=new_source(subsystem_seed(opts.seed, "router")),
        trace=cfg.trace_decisions,
        req_priority=prio, req_sheddable=sheddable, req_tenant=tenant, req_model_bad=model_bad,
        tenant_budget=meta.tenant_budget,
        max_chunks=room.max_chunks,
        table_size=kv.ht.shape[1],
    )


def _kv_state(table, cfg: EngineConfig, inp: RequestInputs, room: _Capacity):
    """Every instance's KV cache, with room for the follow-ups' digests and block lists."""
    opts = cfg.options
    n = inp.arrival.shape[0]
    chunk_off = _pad(table.chunk_offsets, n + 1, np.int64, table.chunk_offsets[-1])
    chunk_dig = _pad(table.chunk_digests, table.chunk_digests.shape[0] + room.chunks,
                     np.uint64)
    block_size = opts.block_size_in_tokens
    reload_ticks = 0
    if opts.kv_cpu_blocks > 0:
        reload_ticks = opts.kv_transfer_base_latency + int(
            math.ceil(float(block_size) / opts.kv_transfer_bandwidth))
    return new_kv_state(opts.num_instances, opts.total_kv_blocks, block_size, chunk_off,
                        chunk_dig, inp.input_len, inp.output_len, opts.kv_cpu_blocks,
                        reload_ticks, cfg.hash_decode_blocks,
                        log_changes=_delayed_cache_signal(cfg), pool_extra=room.pool,
                        chunk_capacity=chunk_dig.shape[0])


def _run_once(table, cfg: EngineConfig, model: str, sessions: SessionPlan | None,
              room: _Capacity) -> SimulationResult:
    n0 = table.n
    n = n0 + room.rows
    opts = cfg.options
    n_inst = opts.num_instances
    max_batch = max(1, min(opts.max_num_running_reqs, max(n, 1)))
    ranked = cfg.policies.scheduler not in ("", "fcfs")
    ids = table.id_strings() if ranked else []  # 100k strings cost a few garbage collections
    inp = RequestInputs(
        arrival=_pad(table.arrival_us, n, np.int64), input_len=_pad(table.input_len, n, np.int64),
        output_len=_pad(table.output_len, n, np.int64),
        deadline=_pad(table.deadline_us, n, np.int64),
        id_rank=_pad(_rank_of_ids(ids), n, np.int64) if ranked else np.zeros(n, np.int64),
        session=np.full(n, -1, np.int32))
    kv = _kv_state(table, cfg, inp, room)
    rs = new_request_arrays(n, _pad(table.max_output_len, n, np.int64))
    ins = new_instance_arrays(n_inst, max_batch)
    lg = new_step_log(max(1024, 4 * n), max(1024, 2 * n))
    meta = _request_metadata(table, cfg, model)
    rt = _router_state(cfg, n, meta, kv, room)
    heap = push_cluster_arrivals(new_event_heap(3 * n + 4 * n_inst + 16), inp.arrival,
                                 np.arange(n0, dtype=np.int64), np.full(n0, -1, np.int64))
    work = new_work(n, max_batch, room.max_chunks)
    driver = None
    think = np.zeros(1, np.int64)
    if sessions and sessions.blueprints:
        driver = SessionDriver(sessions.blueprints, sessions.follow_up_budget,
                               opts.block_size_in_tokens)
        for b, bp in enumerate(sessions.blueprints):
            inp.session[bp.round0_row] = b
        think = driver.think_times()
    sess = SessionBuffers(think, np.zeros((2 * max_batch + 64, OutcomeField.SIZE), np.int64))
    appended = _FollowUpRows(n0, int(kv.pool.shape[0] - room.pool - 1))
    sim_cfg = SimConfig(_config_ints(cfg, rt),
                        np.ascontiguousarray(cfg.latency.params, np.float64),
                        np.ascontiguousarray(cfg.latency.alpha, np.float64),
                        instance_rank_of(n_inst))
    with warnings.catch_warnings(), hook_errors(cfg.hooks) as failures:
        # the scorer table and the hooks are first-class functions, labelled experimental
        warnings.simplefilter("ignore", NumbaExperimentalFeatureWarning)
        hooks = _kernel_hooks(cfg.hooks)
        run = simulate
        while True:
            args = (sim_cfg, inp, rs, ins, kv, lg, rt, heap, work, hooks, sess)
            status, lg, heap = run(*args)
            if status != Status.SESSIONS:
                break
            if run is simulate:
                # re-entries call the compiled overload directly: resolving the argument types
                # (the function-pointer table especially) costs more than a short re-entry
                run = _compiled_overload(simulate, args)
            pending = heap.loop[LoopSlot.PENDING_OUTCOMES]
            rows, seqs = appended.take(driver, sess.outcomes[:pending], rs, inp, kv, rt, meta,
                                       room)
            heap.loop[LoopSlot.PENDING_OUTCOMES] = 0
            heap.loop[LoopSlot.FOLLOW_UP_TICK] = INT64_MAX
            if ranked and rows.shape[0]:
                inp.id_rank[: appended.n] = _rank_of_ids(
                    ids + [f.request_id for f in appended.follow_ups])
            heap = push_cluster_arrivals(heap, inp.arrival, rows, seqs)
    _raise_failure(status, failures)
    n_used = appended.n
    final = appended.table(table, sessions) if n_used > n0 else table
    return _result(cfg, final, n_used, rs, ins, kv, lg, rt)


def _raise_failure(status: int, failures: list) -> None:
    """BlisRuntimeError for a user hook that raised or a kernel error status."""
    if failures:
        name, exc = failures[0]
        raise BlisRuntimeError(f"{name} raised {type(exc).__name__}: {exc} (the run is "
                               "discarded; no output was written)")
    if status == Status.KV_LIST_OVERFLOW:
        raise BlisRuntimeError(
            "a request's KV block list outgrew its preallocated slice after CPU-tier reloads "
            "(--kv-cpu-blocks); this case is not supported yet")
    if status != Status.OK:
        raise BlisRuntimeError(KERNEL_FAILURES.get(
            status, f"simulation kernel failed with status {status}"))


def _result(cfg: EngineConfig, table, n_used: int, rs, ins, kv, lg, rt) -> SimulationResult:
    """Read the kernel's state back into a SimulationResult (rows ``0..n_used-1``)."""
    hits = kv.meta[:, KVMeta.HITS]
    total = hits + kv.meta[:, KVMeta.MISSES] + kv.cpu_meta[:, CpuMeta.MISSES]
    with np.errstate(invalid="ignore", divide="ignore"):
        hit_rate = np.where(total > 0, hits / np.maximum(total, 1), 0.0)
        mirrors = kv.cpu_meta[:, CpuMeta.MIRRORS]
        thrash = np.where(mirrors > 0, kv.cpu_meta[:, CpuMeta.EVICTIONS]
                          / np.maximum(mirrors, 1), 0.0)
    steps = int(lg.sizes[LogCursor.STEPS])
    used = slice(0, n_used)
    completed = rs.state[used] == RequestState.COMPLETED
    return SimulationResult(
        config=cfg,
        table=table,
        state=rs.state[used],
        instance=rs.inst[used],
        registered=rs.registered[used],
        ttft_us=np.where(rs.has_ttft[used] == 1, rs.ttft[used], -1),
        e2e_us=np.where(completed, rs.e2e[used], -1),
        itl_sum_us=rs.hot[used, HotField.ITL_SUM].copy(),
        itl_count=rs.hot[used, HotField.ITL_COUNT].copy(),
        sched_delay_us=np.where(rs.has_sched[used] == 1, rs.sched_delay[used], -1),
        length_capped=rs.capped[used],
        counters=ins.cnt,
        kv_integral=ins.kv_integral,
        wait_queue_sum=ins.wq_sum,
        cache_hit_rate=hit_rate,
        thrashing_rate=thrash,
        still_queued=ins.wq[:, QueueField.LEN].copy(),
        still_running=ins.batch_len.copy(),
        decisions=_decision_trace(rt) if cfg.trace_decisions else None,
        rejected_admission=int(ins.rejected[Rejection.ADMISSION]),
        rejected_routing=int(ins.rejected[Rejection.ROUTING]),
        step_time=lg.time[:steps].copy(),
        step_instance=lg.inst[:steps].copy(),
        step_duration=lg.dur[:steps].copy(),
        step_queue=lg.queue[:steps].copy(),
        step_running=lg.running[:steps].copy(),
        step_kv_used=lg.kv_used[:steps].copy(),
        step_itl_count=lg.itl_count[:steps].copy(),
    )


class _FollowUpRows:
    """Appends follow-ups to the run's request arrays, in the order they are generated."""

    def __init__(self, n0: int, pool_cursor: int) -> None:
        self.n = n0
        self.n0 = n0
        self.pool_cursor = pool_cursor
        self.follow_ups: list[FollowUp] = []

    def take(self, driver: SessionDriver, outcomes: np.ndarray, rs, inp: RequestInputs, kv, rt,
             meta: _RequestMeta, room: _Capacity):
        """Play ``OnComplete`` for each recorded outcome; append the follow-ups it returns.

        Returns the new rows and the event sequence numbers reserved for their arrivals.
        """
        rows: list[int] = []
        seqs: list[int] = []
        capacity = inp.arrival.shape[0]
        for row, tick, outcome, pi, seq in outcomes.tolist():
            b = int(inp.session[row])
            fu = driver.on_outcome(b, tick, outcome == SessionOutcome.COMPLETED, pi,
                                   int(inp.input_len[row]))
            if fu is None:
                continue
            k = self.n
            slots = int(pool_slots(fu.input_len, fu.output_len, kv.cfg[KVConfig.BLOCK_SIZE],
                                   kv.cfg[KVConfig.TIERED] == 1))
            c0 = int(kv.chunk_off[k])
            nch = fu.digests.shape[0]
            if (k >= capacity or c0 + nch > kv.chunk_dig.shape[0] or nch > room.max_chunks
                    or self.pool_cursor + slots >= kv.pool.shape[0]):
                raise _OutOfRoom()
            inp.arrival[k] = fu.arrival_us
            inp.input_len[k] = fu.input_len
            inp.output_len[k] = fu.output_len
            inp.deadline[k] = fu.deadline_us
            rs.max_out[k] = fu.output_len
            kv.chunk_dig[c0 : c0 + nch] = fu.digests
            kv.chunk_off[k + 1] = c0 + nch
            kv.req[k, BlockList.OFFSET] = self.pool_cursor
            self.pool_cursor += slots
            if k + 1 < capacity:
                kv.req[k + 1, BlockList.OFFSET] = self.pool_cursor
            client = driver.blueprints[b].client_idx
            rt.req_priority[k] = meta.client_priority[client]
            rt.req_sheddable[k] = meta.client_priority[client] < 0
            rt.req_tenant[k] = meta.client_tenant[client]
            rt.req_model_bad[k] = meta.client_model_bad[client]
            inp.session[k] = b
            self.n = k + 1
            self.follow_ups.append(fu)
            rows.append(k)
            seqs.append(seq)
        return np.array(rows, np.int64), np.array(seqs, np.int64)

    def table(self, table, sessions: SessionPlan):
        """The run's requests: the pre-generated rows, then the follow-ups in creation order."""
        fus = self.follow_ups
        bps = sessions.blueprints
        session_names = list(table.sessions)
        index = {name: k for k, name in enumerate(session_names)}
        for bp in bps:
            if bp.session_id not in index:
                index[bp.session_id] = len(session_names)
                session_names.append(bp.session_id)
        digests = np.concatenate([table.chunk_digests, *(f.digests for f in fus)])
        offsets = np.concatenate([table.chunk_offsets, table.chunk_offsets[-1]
                                  + np.cumsum([f.digests.shape[0] for f in fus], dtype=np.int64)])

        def column(values, name, dtype):
            return np.concatenate([getattr(table, name), np.array(values, dtype=dtype)])

        return replace(
            table,
            arrival_us=column([f.arrival_us for f in fus], "arrival_us", np.int64),
            input_len=column([f.input_len for f in fus], "input_len", np.int64),
            output_len=column([f.output_len for f in fus], "output_len", np.int64),
            max_output_len=column([f.output_len for f in fus], "max_output_len", np.int64),
            deadline_us=column([f.deadline_us for f in fus], "deadline_us", np.int64),
            prefix_length=column([0] * len(fus), "prefix_length", np.int64),
            client_idx=column([bps[f.blueprint].client_idx for f in fus], "client_idx",
                              np.int32),
            chunk_offsets=offsets,
            chunk_digests=digests,
            session_idx=column([index[bps[f.blueprint].session_id] for f in fus],
                               "session_idx", np.int32),
            round_index=column([f.round_index for f in fus], "round_index", np.int32),
            text_tokens=column([0] * len(fus), "text_tokens", np.int64),
            image_tokens=column([0] * len(fus), "image_tokens", np.int64),
            audio_tokens=column([0] * len(fus), "audio_tokens", np.int64),
            video_tokens=column([0] * len(fus), "video_tokens", np.int64),
            reason_ratio=column([0.0] * len(fus), "reason_ratio", np.float64),
            sessions=session_names,
            request_numbers=column([-1] * len(fus), "request_numbers", np.int64),
            extra_ids=list(table.extra_ids) + [f.request_id for f in fus],
        )


def _decision_trace(rt) -> DecisionTrace:
    """Slice the kernel's trace buffers to the records actually written."""
    na = int(rt.st[RouterVar.N_ADMISSION_RECORDS])
    nr = int(rt.st[RouterVar.N_ROUTING_RECORDS])
    weighted = rt.rcfg[RouterCfg.ROUTING] == Routing.WEIGHTED
    return DecisionTrace(
        admission_request=rt.adm_req[:na].copy(), admission_clock=rt.adm_clock[:na].copy(),
        admitted=rt.adm_ok[:na].astype(bool), admission_reason=rt.adm_reason[:na].copy(),
        routing_request=rt.rt_req[:nr].copy(), routing_clock=rt.rt_clock[:nr].copy(),
        routing_target=rt.rt_target[:nr].copy(), routing_regret=rt.rt_regret[:nr].copy(),
        routing_best=rt.rt_best[:nr].copy(),
        routing_scores=rt.rt_scores[:nr].copy() if weighted else None,
        candidate_instance=rt.cf_inst[:nr].copy(), candidate_score=rt.cf_score[:nr].copy(),
        candidate_counts=rt.cf_int[:nr].copy(), candidate_kv_utilization=rt.cf_kv[:nr].copy(),
    )
