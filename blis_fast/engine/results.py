"""The engine's results read back from the kernel's state: ``SimulationResult`` (per request,
per instance, per step) and the decision trace; the kernel's error statuses as errors.

The outputs read the result through named, typed views built here from the kernels' layouts
(``PDCounters``, ``ParentRecords``, ``FleetView``, ``ScalingSignals`` and the accessors of
``SimulationResult`` and ``PDRunData``), so no output module indexes a kernel buffer."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blis_fast.engine.engine_config import EngineConfig
from blis_fast.errors import BlisRuntimeError
from blis_fast.kernels.cluster.autoscale_layout import AsInst, AsVar, Signal
from blis_fast.kernels.cluster.pd import ParentField, PDCounter
from blis_fast.kernels.cluster.router_state import RouterCfg, RouterVar
from blis_fast.kernels.engine.event_loop import SEQ_LIMIT
from blis_fast.kernels.engine.heap import MAX_INSTANCES
from blis_fast.kernels.engine.lora import LoraVar
from blis_fast.kernels.engine.state import (
    HotField,
    InstanceCounter,
    LogCursor,
    QueueField,
    Rejection,
)
from blis_fast.kernels.enums import InstanceKind, Registration, RequestState, Routing, Status
from blis_fast.kernels.kv.kv_chain import (
    DEFER_PROMOTING,
    DEFER_RETRY,
    ChainCfg,
    ChainMeta,
    Defer,
)
from blis_fast.kernels.kv.kv_layout import BlockList, CpuMeta, KVConfig, KVMeta
from blis_fast.kernels.kv.kv_station import TierState

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


@dataclass
class KVOffloadFigures:
    """What the KV tier chain did (``--kv-offload-config``, spec kv-offload.md): per instance
    the CPU tier's counts, per instance and secondary tier (``[N, tiers]``, in the config's
    order; no columns without one) the transfers the tier's station started. Promotions
    give the chain's KV Thrashing Rate, failed / (fired + failed) (KVO-10.2)."""

    cpu_mirrors: np.ndarray  # blocks newly stored on the CPU tier (KVO-4.3)
    cpu_mirror_skipped: np.ndarray  # mirrors refused: the tier full, nothing evictable
    cpu_evictions: np.ndarray  # CPU blocks evicted (mirrors and promotions making room)
    cpu_reloads: np.ndarray  # blocks reloaded from the CPU tier into the GPU cache (KVO-5.2)
    promotions_fired: np.ndarray  # promotion runs read from a secondary tier (KVO-5.4)
    promotions_failed: np.ndarray  # promotion runs refused by the evictable gate (KVO-4.6)
    deferrals_started: np.ndarray  # admissions set aside to await a fetch (KVO-7.4)
    tier_reads: np.ndarray  # read jobs started (one per promoted run)
    tier_writes: np.ndarray  # write jobs started (one per written-through block, KVO-4.4)
    tier_bytes_read: np.ndarray
    tier_bytes_written: np.ndarray
    tier_queue_wait_us: np.ndarray  # sum over started jobs of start - submit tick


@dataclass
class KVChainRequests:
    """What the tier chain did for each request over its life (int64 per row; all 0 without a
    secondary tier): deferral episodes started (KVO-7.4), ticks spent deferred awaiting a fetch
    (each episode from its start to the poll that ended it) and blocks a promotion read brought
    back to the CPU tier on its behalf (KVO-5.4)."""

    deferrals: np.ndarray
    fetch_wait_us: np.ndarray
    promoted_blocks: np.ndarray


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


@dataclass(frozen=True)
class PDCounters:
    """The P/D counters of a run by name (``kernels/cluster/pd.py: PDCounter``)."""

    parents: int  # disaggregated decisions
    prefill_completed: int  # prefill sub-requests completed
    decode_completed: int
    decode_timed_out: int
    dropped_at_decode_kv: int  # parents dropped for lack of KV on their decode instance
    transfers_initiated: int
    transfers_completed: int
    peak_transfers: int  # most transfers in flight at once (with contention)
    transfer_starts: int  # transfers started under contention
    queue_depth_sum: int  # transfers in flight summed over those starts
    past_deadline: int  # decode sub-requests enqueued after their deadline

    @classmethod
    def of(cls, cnt: np.ndarray) -> PDCounters:
        """The counters of ``PDState.cnt``."""
        C = PDCounter
        return cls(
            parents=int(cnt[C.PARENTS]), prefill_completed=int(cnt[C.PREFILL_COMPLETED]),
            decode_completed=int(cnt[C.DECODE_COMPLETED]),
            decode_timed_out=int(cnt[C.DECODE_TIMED_OUT]),
            dropped_at_decode_kv=int(cnt[C.DROPPED_AT_DECODE_KV]),
            transfers_initiated=int(cnt[C.XFER_INITIATED]),
            transfers_completed=int(cnt[C.XFER_COMPLETED]), peak_transfers=int(cnt[C.PEAK]),
            transfer_starts=int(cnt[C.STARTS]), queue_depth_sum=int(cnt[C.DEPTH_SUM]),
            past_deadline=int(cnt[C.PAST_DEADLINE]))


@dataclass(frozen=True)
class ParentRecords:
    """The P/D parent records of workload requests by column (``kernels/cluster/pd.py:
    ParentField``): times in µs, 0 = unset as in the reference; instances -1 = none. The
    integer columns are views of the kernel's array."""

    disaggregated: np.ndarray  # bool: split into prefill and decode sub-requests
    prefill_instance: np.ndarray
    decode_instance: np.ndarray  # chosen at routing
    transfer_start_us: np.ndarray  # the start of the last prefill step
    transfer_done_us: np.ndarray
    decode_enqueue_us: np.ndarray
    done_us: np.ndarray  # parent completion: decode done, decode timeout or drop at start
    blocks: np.ndarray  # prompt blocks moved
    transfer_active: np.ndarray  # transfers in flight when it started (contention)
    attached: np.ndarray  # bool: the decode sub-request holds its KV reservation

    @classmethod
    def of(cls, par: np.ndarray) -> ParentRecords:
        """The records of the rows of ``PDState.par`` (``[requests, ParentField.SIZE]``)."""
        F = ParentField
        return cls(disaggregated=par[:, F.FLAG] == 1, prefill_instance=par[:, F.PREFILL],
                   decode_instance=par[:, F.DECODE], transfer_start_us=par[:, F.T_XFER_START],
                   transfer_done_us=par[:, F.T_XFER_DONE],
                   decode_enqueue_us=par[:, F.T_DECODE_ENQUEUE], done_us=par[:, F.T_DONE],
                   blocks=par[:, F.BLOCKS], transfer_active=par[:, F.XFER_ACTIVE],
                   attached=par[:, F.ATTACHED] == 1)


@dataclass
class PDRunData:
    """What a P/D run leaves besides the per-row arrays (``kernels/cluster/pd.py``): per workload
    request its parent record (``par[r, ParentField.*]``, read by name through
    :attr:`parents`), the P/D counters (by name: :attr:`counts`), and per row the time of its
    first token (0 = none) and the duration of its first ITL sample's step (-1 = no ITL run in
    its last attempt)."""

    par: np.ndarray
    counters: np.ndarray
    first_token_us: np.ndarray
    first_itl_step_us: np.ndarray
    decode_sub: np.ndarray  # int8 per row: 1 = became a decode sub-request

    @property
    def disaggregated(self) -> np.ndarray:
        """Per workload request, True when it was split into prefill and decode sub-requests
        (its parent record's flag), so outputs need not read the ``par`` layout."""
        return self.par[:, ParentField.FLAG] == 1

    @property
    def parents(self) -> ParentRecords:
        """Every workload request's parent record, by column."""
        return ParentRecords.of(self.par)

    def parents_at(self, rows: np.ndarray) -> ParentRecords:
        """The parent records of the workload requests ``rows``, by column."""
        return ParentRecords.of(self.par[rows])

    @property
    def counts(self) -> PDCounters:
        """The P/D counters by name."""
        return PDCounters.of(self.counters)

    @property
    def became_decode_sub(self) -> np.ndarray:
        """Per row, True when it became a decode sub-request."""
        return self.decode_sub == 1


@dataclass(frozen=True)
class ScalingSignals:
    """Per instance, the analyzer's figures of the autoscaler decision that placed or drained
    it (``kernels/cluster/autoscale_layout.py: Signal``; float64, ``decision_time_us`` NaN =
    no such decision); named as ``scaling.parquet``'s columns."""

    decision_time_us: np.ndarray  # the tick whose decision passed
    signal_since_us: np.ndarray  # the signal's first tick (its window's start)
    supply_tokens: np.ndarray
    demand_tokens: np.ndarray
    pending_tokens: np.ndarray  # supply of instances still loading
    signal_tokens: np.ndarray  # tokens required (scale-up) or spare (scale-down)
    delta: np.ndarray

    @classmethod
    def of(cls, sig: np.ndarray) -> ScalingSignals:
        """The records of ``sig`` (``[instances, Signal.SIZE]``)."""
        return cls(decision_time_us=sig[:, Signal.TICK], signal_since_us=sig[:, Signal.SINCE],
                   supply_tokens=sig[:, Signal.SUPPLY], demand_tokens=sig[:, Signal.DEMAND],
                   pending_tokens=sig[:, Signal.PENDING], signal_tokens=sig[:, Signal.AMOUNT],
                   delta=sig[:, Signal.DELTA])


@dataclass(frozen=True)
class FleetView:
    """The fleet of an autoscaled run or a run on node pools at its end, per built instance by
    column (``kernels/cluster/autoscale_layout.py: AsInst``; views of the kernel's arrays)."""

    placed_us: np.ndarray  # int64 lifecycle times, -1 = never
    ready_us: np.ndarray
    drained_us: np.ndarray
    terminated_us: np.ndarray
    node: np.ndarray  # node index in inventory order, -1 without pools
    label: np.ndarray  # GPU label id: an index of ``AutoscaleSetup.labels``
    tp: np.ndarray  # the reference's TP degree (0 without pools)
    autoscaled: np.ndarray  # bool: added by the autoscaler (else a start-up instance)
    scale_ups: int  # instances placed by the autoscaler
    scale_downs: int  # instances drained
    placed_by: ScalingSignals  # the scale-up decision behind each instance
    drained_by: ScalingSignals  # the scale-down decision that drained it

    @classmethod
    def of(cls, asc, rows: int) -> FleetView:
        """The view of the autoscaler state ``asc`` (``AutoscaleState``), instances
        ``0..rows-1``."""
        inst = asc.inst[:rows]
        return cls(placed_us=inst[:, AsInst.PLACED], ready_us=inst[:, AsInst.READY],
                   drained_us=inst[:, AsInst.DRAINED], terminated_us=inst[:, AsInst.TERMINATED],
                   node=inst[:, AsInst.NODE], label=inst[:, AsInst.LABEL], tp=inst[:, AsInst.TP],
                   autoscaled=inst[:, AsInst.KIND] == InstanceKind.AUTOSCALED,
                   scale_ups=int(asc.var[AsVar.SCALE_UPS]),
                   scale_downs=int(asc.var[AsVar.SCALE_DOWNS]),
                   placed_by=ScalingSignals.of(asc.inst_sig[:rows, 0]),
                   drained_by=ScalingSignals.of(asc.inst_sig[:rows, 1]))


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
    ttft_standing: np.ndarray  # bool: the first token was not undone by a later preemption
    # (a preempted request re-runs its prefill; until it does, the trace has no chunk times)
    e2e_us: np.ndarray  # -1 unless completed
    itl_sum_us: np.ndarray
    itl_count: np.ndarray
    sched_delay_us: np.ndarray  # -1 when never admitted
    length_capped: np.ndarray
    preemptions: np.ndarray  # int32: times preempted (sums to the instances' preemption counts)
    cached_prefix_tokens: np.ndarray  # int64: prompt tokens the prefix cache held at the last
    # admission from the wait queue (0 when never admitted)
    priority: np.ndarray  # float64: the priority policy's value when last computed (0.0: never)
    slo_priority: np.ndarray  # int64: the SLO class's priority (bundle overrides applied)
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
    # P/D (rows [n, 2n) of the per-request arrays are the prefill sub-requests)
    pd: PDRunData | None = None
    # the fleet of an autoscaled run or a run on node pools (``engine/fleet.py``); None for
    # a fixed fleet (instances ``instance_0`` .. ``instance_<N-1>``)
    instance_names: list[str] | None = None
    fleet: object | None = None  # kernels.autoscale_layout.AutoscaleState at the end of the run
    # (outputs read it by name through ``fleet_view``)
    # LoRA (LORA-8.2): per instance and adapter (``table.adapter_names``) the completed loads
    # and the evictions; None when LoRA did not run (inert, or no request has an adapter)
    adapter_loads: np.ndarray | None = None
    adapter_evictions: np.ndarray | None = None
    # the evictions and completed loads in event order, int64 [k, LoraLog.SIZE] columns tick,
    # instance, adapter, kind (kernels/engine/lora.py: LoraLog, LoraEvent); None without LoRA
    adapter_events: np.ndarray | None = None
    # the KV tier chain's counts (--kv-offload-config; None without it)
    kv_offload: KVOffloadFigures | None = None
    # per request (rows as above): blocks the CPU tier reloaded for it (None without a CPU
    # tier), and with --kv-offload-config the chain's records (None without it)
    kv_cpu_reloads: np.ndarray | None = None
    kv_chain_requests: KVChainRequests | None = None

    def instance_name(self, i: int) -> str:
        """The id of instance ``i`` as the reference prints it."""
        return self.instance_names[i] if self.instance_names is not None else f"instance_{i}"

    def instance_count(self, name: str) -> np.ndarray:
        """Per-instance counter ``name`` (``COMPLETED``, ``DROPPED``, ``CLOCK``...: a field of
        ``kernels.state.InstanceCounter``), so outputs name counters without the kernel's
        column layout."""
        return self.counters[:, getattr(InstanceCounter, name)]

    @property
    def completed(self) -> np.ndarray:
        """Per request row, True when it completed (``RequestState.COMPLETED``)."""
        return self.state == RequestState.COMPLETED

    @property
    def timed_out(self) -> np.ndarray:
        """Per request row, True when it timed out (``RequestState.TIMED_OUT``)."""
        return self.state == RequestState.TIMED_OUT

    @property
    def queued_or_running(self) -> np.ndarray:
        """Per request row, True when it was still queued or running at the end."""
        return np.isin(self.state, (RequestState.QUEUED, RequestState.RUNNING))

    @property
    def peak_kv_blocks(self) -> np.ndarray:
        """Per instance, the most KV blocks it held at once."""
        return self.counters[:, InstanceCounter.PEAK_KV]

    @property
    def fleet_view(self) -> FleetView | None:
        """The fleet by name (each built instance's lifecycle, placement and the decisions
        behind it), None for a fixed fleet."""
        return None if self.fleet is None else FleetView.of(self.fleet, self.counters.shape[0])

    @property
    def rejected_at_admission(self) -> np.ndarray:
        """Per request row, True when the admission policy rejected it."""
        return self.registered == Registration.REJECTED_ADMISSION

    @property
    def sim_ended_us(self) -> np.ndarray:
        """Per-instance SimEndedTime = min(clock, horizon)."""
        return np.minimum(self.counters[:, InstanceCounter.CLOCK], self.config.options.horizon)


def raise_failure(status: int, failures: list) -> None:
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


def read_result(cfg: EngineConfig, table, n_used: int, rs, ins, kv, lg, rt,
                pd=None, lora=None, chain=None) -> SimulationResult:
    """Read the kernel's state back into a SimulationResult (rows ``0..n_used-1``; with the
    P/D state ``pd``, every row: the workload's, then the prefill sub-requests; with the LoRA
    state ``lora``, its load and eviction counts; with the tier chain's secondary tiers
    ``chain``, their transfer figures)."""
    hits = kv.meta[:, KVMeta.HITS]
    total = hits + kv.meta[:, KVMeta.MISSES] + kv.cpu_meta[:, CpuMeta.MISSES]
    with np.errstate(invalid="ignore", divide="ignore"):
        hit_rate = np.where(total > 0, hits / np.maximum(total, 1), 0.0)
        mirrors = kv.cpu_meta[:, CpuMeta.MIRRORS]
        thrash = np.where(mirrors > 0, kv.cpu_meta[:, CpuMeta.EVICTIONS]
                          / np.maximum(mirrors, 1), 0.0)
        if cfg.kv_offload is not None:
            # the chain's KV Thrashing Rate is refused / attempted promotions (KVO-10.2,
            # KVO-D6): 0 without a promotion (always without a secondary tier)
            fired = kv.cpu_meta[:, CpuMeta.PROMO_FIRED]
            failed = kv.cpu_meta[:, CpuMeta.PROMO_FAILED]
            thrash = np.where(fired + failed > 0, failed / np.maximum(fired + failed, 1), 0.0)
    if chain is not None and chain.meta[:, ChainMeta.OVERFLOW].any():
        raise BlisRuntimeError("KV offload chain: the secondary tiers' key table or the "
                               "transfer station's job rows ran out of room")
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
        ttft_standing=rs.hot[used, HotField.TTFT_SET] == 1,
        e2e_us=np.where(completed, rs.e2e[used], -1),
        itl_sum_us=rs.hot[used, HotField.ITL_SUM].copy(),
        itl_count=rs.hot[used, HotField.ITL_COUNT].copy(),
        sched_delay_us=np.where(rs.has_sched[used] == 1, rs.sched_delay[used], -1),
        length_capped=rs.capped[used],
        preemptions=rs.preemptions[used],
        cached_prefix_tokens=rs.cached_prefix[used],
        priority=rs.priority[used],
        slo_priority=rt.req_priority[used],
        counters=ins.cnt,
        kv_integral=ins.kv_integral,
        wait_queue_sum=ins.wq_sum,
        cache_hit_rate=hit_rate,
        thrashing_rate=thrash,
        still_queued=ins.wq[:, QueueField.LEN].copy(),
        still_running=ins.batch_len.copy(),
        decisions=(decision_trace(rt, pd.rt_decode if pd is not None else rt)
                   if cfg.trace_decisions else None),
        rejected_admission=int(ins.rejected[Rejection.ADMISSION]),
        rejected_routing=int(ins.rejected[Rejection.ROUTING]),
        step_time=lg.time[:steps].copy(),
        step_instance=lg.inst[:steps].copy(),
        step_duration=lg.dur[:steps].copy(),
        step_queue=lg.queue[:steps].copy(),
        step_running=lg.running[:steps].copy(),
        step_kv_used=lg.kv_used[:steps].copy(),
        step_itl_count=lg.itl_count[:steps].copy(),
        pd=None if pd is None else _pd_data(pd, rs, lg, used),
        adapter_loads=None if lora is None else lora.loads.copy(),
        adapter_evictions=None if lora is None else lora.evictions.copy(),
        adapter_events=(None if lora is None
                        else lora.log[: int(lora.var[LoraVar.LOG_LEN])].copy()),
        kv_offload=None if cfg.kv_offload is None else offload_figures(kv, chain),
        kv_cpu_reloads=(kv.req[used, BlockList.CPU_RELOADS].copy()
                        if kv.cfg[KVConfig.TIERED] else None),
        kv_chain_requests=(None if cfg.kv_offload is None
                           else chain_requests(chain, n_used, rs.inst)),
    )


def chain_requests(chain, n_used: int, instance: np.ndarray) -> KVChainRequests:
    """The chain's per-request records of rows ``0..n_used-1`` (zeros without a secondary
    tier, ``chain`` None); a request still deferred when the run stopped has waited until its
    instance's last step start (``instance``: each row's instance)."""
    if chain is None:
        zeros = np.zeros(n_used, np.int64)
        return KVChainRequests(zeros, zeros.copy(), zeros.copy())
    d = chain.defer[:n_used]
    waited = d[:, Defer.WAITED].copy()
    phase = d[:, Defer.PHASE]
    open_ = np.flatnonzero(((phase == DEFER_RETRY) | (phase == DEFER_PROMOTING))
                           & (instance[:n_used] >= 0))
    clock = chain.meta[instance[open_], ChainMeta.CLOCK]
    waited[open_] += np.maximum(clock - d[open_, Defer.START], 0)
    return KVChainRequests(deferrals=d[:, Defer.EPISODES].copy(), fetch_wait_us=waited,
                           promoted_blocks=d[:, Defer.PROMOTED].copy())


def offload_figures(kv, chain) -> KVOffloadFigures:
    """The tier chain's counts at the end of the run: the CPU tier's from the KV state, the
    secondary tiers' from their transfer stations (none without a secondary tier)."""
    cm = kv.cpu_meta
    n_inst = cm.shape[0]
    if chain is None:
        tiers = np.zeros((n_inst, 0, TierState.SIZE), np.int64)
    else:
        tiers = chain.station.tier_state[:, : int(chain.cfg[ChainCfg.N_TIERS])]
    return KVOffloadFigures(
        cpu_mirrors=cm[:, CpuMeta.MIRRORS].copy(),
        cpu_mirror_skipped=cm[:, CpuMeta.MIRROR_SKIPPED].copy(),
        cpu_evictions=cm[:, CpuMeta.EVICTIONS].copy(),
        cpu_reloads=cm[:, CpuMeta.HITS].copy(),
        promotions_fired=cm[:, CpuMeta.PROMO_FIRED].copy(),
        promotions_failed=cm[:, CpuMeta.PROMO_FAILED].copy(),
        deferrals_started=(np.zeros(n_inst, np.int64) if chain is None
                           else chain.meta[:, ChainMeta.DEFERRALS].copy()),
        tier_reads=tiers[:, :, TierState.READS].copy(),
        tier_writes=tiers[:, :, TierState.WRITES].copy(),
        tier_bytes_read=tiers[:, :, TierState.BYTES_READ].copy(),
        tier_bytes_written=tiers[:, :, TierState.BYTES_WRITTEN].copy(),
        tier_queue_wait_us=tiers[:, :, TierState.QUEUE_WAIT].copy(),
    )


def _pd_data(pd, rs, lg, used) -> PDRunData:
    head = rs.run_head[used]
    first = np.where(head >= 0, lg.dur[lg.run_start[np.maximum(head, 0)]], -1)
    return PDRunData(par=pd.par, counters=pd.cnt.copy(),  # the run's own: nothing else keeps it
                     first_token_us=rs.first_token[used].copy(),
                     first_itl_step_us=first.astype(np.int64), decode_sub=rs.pd_sub[used].copy())


def decision_trace(rt, policy=None) -> DecisionTrace:
    """Slice the kernel's trace buffers to the records actually written; ``policy`` made the
    routing records (P/D: the decode pool's; default ``rt``), scores come with a weighted one."""
    na = int(rt.st[RouterVar.N_ADMISSION_RECORDS])
    nr = int(rt.st[RouterVar.N_ROUTING_RECORDS])
    policy = rt if policy is None else policy
    weighted = policy.rcfg[RouterCfg.ROUTING] == Routing.WEIGHTED
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
