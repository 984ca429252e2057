"""``blis run`` end to end: validate → resolve the parts → generate → simulate → outputs.

Validation follows the reference's order (DELTA-26) so the first bad flag is the one
reported: each flag's own checks are declared in the options table and run at their stage
(``options.check_options``), checks across flags are written out here, in the resolving code
of ``config/latency.py`` and ``config/policy_bundle.py``. Every check runs before the kernel
starts and before any file is written.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from blis_fast.config.autoscale import resolve_autoscale
from blis_fast.config.defaults import DefaultsConfig, load_defaults
from blis_fast.config.kv_offload import (
    KVOffloadConfig,
    check_buildable,
    reconcile_replay,
    resolve_flag,
    with_block_bytes,
)
from blis_fast.config.latency import LatencyConfig, resolve_latency
from blis_fast.config.lora import (
    LoRAConfig,
    check_workload_adapters,
    compose_scorer_weight,
    no_capacity_warning,
    resolve_lora,
)
from blis_fast.config.pd import (
    check_construction,
    check_encode,
    check_transfer_range,
    config_warnings,
    resolve_pools,
    validate_pd,
    with_transfer_sizing,
)
from blis_fast.config.pd_mode import requested as pd_requested
from blis_fast.config.policy_bundle import Policies, parse_scorer_list, select_policies
from blis_fast.data import data_path
from blis_fast.engine.engine_config import EngineConfig, Hooks
from blis_fast.engine.fleet import run_warnings
from blis_fast.engine.floor import floor_warning
from blis_fast.engine.follow_ups import SessionPlan
from blis_fast.engine.memory import available_memory
from blis_fast.engine.results import SimulationResult
from blis_fast.engine.simulate import run_engine
from blis_fast.engine.warmup import notify_if_compiling
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.kernels.engine.heap import MAX_INSTANCES
from blis_fast.options import LOG_LEVELS, TIME_LIMIT_US, check_options
from blis_fast.output.fitness import FITNESS_KEYS, parse_fitness_weights
from blis_fast.output.pd import pd_warnings
from blis_fast.output.run_outputs import build_outputs, plan_outputs, write_outputs
from blis_fast.output.summary import RequestColumns
from blis_fast.policies.scorers import DEFAULT_PROFILE
from blis_fast.workload.generated import apply_timeout_to_workload
from blis_fast.workload.generator import generate_workload
from blis_fast.workload.precedence import (
    check_generation_bounded,
    resolve_horizon,
    resolve_max_requests,
    resolve_workload_seed,
)
from blis_fast.workload.replay import (
    check_observed_kv_replayable,
    load_trace_header,
    load_trace_records,
    max_injected_arrival,
    replay_horizon,
    replay_workload,
)
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.samplers import parse_think_time_dist
from blis_fast.workload.spec import apply_timeout_to_spec
from blis_fast.workload.spec_yaml import load_workload_spec
from blis_fast.workload.synthesis import (
    DistributionParams,
    lookup_preset,
    synthesize_concurrency,
    synthesize_from_distribution,
    synthesize_from_preset,
    validate_distribution_params,
    workload_source,
)
from blis_fast.workload.trace_v2 import ObservedKVMetrics

log = logging.getLogger("blis_fast")


@dataclass
class Prepared:
    """A validated run: the options, its resolved parts and the generated workload."""

    opts: Any  # the RunOptions as given (model lower-cased)
    latency: LatencyConfig
    table: RequestTable
    engine: EngineConfig
    policies: Policies
    sessions: SessionPlan | None = None  # closed-loop sessions continued by the engine
    given: Any = None  # the RunOptions exactly as given (model not lower-cased): provenance
    observed_kv: ObservedKVMetrics | None = None  # replay: the header's observed hit rate


@dataclass
class RunResult:
    """What one ``blis run`` produced."""

    stdout: str
    summary: dict
    per_instance: list[dict]
    requests: RequestColumns
    simulation: SimulationResult
    prepared: Prepared
    summary_extras: dict = field(default_factory=dict)  # cost, fleet and P/D columns (ours)
    pools: list[dict] | None = None  # pools.parquet's rows; None without P/D
    command: str = "run"  # "run" or "replay": which command made it (files' provenance)

    @property
    def summary_row(self) -> dict:
        """``summary.parquet``'s row: the reference's summary plus the cost/fleet/P/D columns."""
        return {**self.summary, **self.summary_extras}

    def provenance(self, schema: str) -> dict[str, str]:
        """The provenance metadata of this run's file with ``schemas/<schema>.json``: version,
        schema version and options (``blis_fast.output.provenance``); the ``*_table`` methods
        attach it."""
        from blis_fast.output.provenance import run_provenance  # lazy: pyarrow, tables only

        return run_provenance(schema, self.prepared.given, self.simulation.config,
                              self.command)

    def pools_table(self):
        """A P/D run's pools as a pyarrow Table (schema ``schemas/pools.json``); None without
        P/D."""
        if self.pools is None:
            return None
        from blis_fast.output.pools import pools_table  # lazy: pyarrow, tables only
        from blis_fast.output.provenance import with_provenance  # lazy: pyarrow, tables only

        return with_provenance(pools_table(self.pools), self.provenance("pools"))

    def pools_frame(self):
        """A P/D run's pools as a polars DataFrame; None without P/D."""
        import polars as pl

        table = self.pools_table()
        return None if table is None else pl.from_arrow(table)

    def adapters_table(self):
        """A LoRA run's per-adapter figures as a pyarrow Table (schema
        ``schemas/adapters.json``, the rows of ``adapters.parquet``); None when no request
        carries an adapter."""
        if "adapters" not in self.summary:
            return None
        from blis_fast.output.adapters import adapter_rows, adapters_table  # lazy: pyarrow
        from blis_fast.output.provenance import with_provenance  # lazy: pyarrow, tables only

        return with_provenance(adapters_table(adapter_rows([*self.per_instance, self.summary])),
                               self.provenance("adapters"))

    def requests_table(self):
        """Per-request results as a pyarrow Table (schema ``schemas/requests.json``)."""
        from blis_fast.output.parquet import requests_table  # lazy: pyarrow, tables only
        from blis_fast.output.provenance import with_provenance  # lazy: pyarrow, tables only

        return with_provenance(requests_table(self.requests), self.provenance("requests"))

    def requests_frame(self):
        """Per-request results as a polars DataFrame."""
        import polars as pl

        return pl.from_arrow(self.requests_table())


def execute_run(opts: Any, hooks: Hooks | None = None) -> RunResult:
    """Validate, simulate and produce every requested output of one ``blis run``."""
    return _execute(opts, hooks, replay=False)


def execute_replay(opts: Any, hooks: Hooks | None = None) -> RunResult:
    """``blis replay``: simulate a trace's requests (WL-9.7); same outputs, replay variants."""
    return _execute(opts, hooks, replay=True)


def _execute(opts: Any, hooks: Hooks | None, replay: bool) -> RunResult:
    _setup_logging(opts)
    plan = plan_outputs(opts, replay)
    prepared = prepare(opts, hooks, replay=replay)
    started = time.perf_counter()
    res = run_engine(prepared.table, prepared.engine, model=prepared.latency.model,
                     sessions=prepared.sessions)
    log.info("Simulation wall-clock time: %.3fs", time.perf_counter() - started)
    for msg in run_warnings(res):
        log.warning(msg)
    below_floor = floor_warning(res, prepared.latency.backend)
    if below_floor is not None:
        log.warning(below_floor)
    outputs = build_outputs(res, opts, replay)
    if res.pd is not None:
        for msg in pd_warnings(res, opts):
            log.warning(msg)
    write_outputs(plan, opts, replay, prepared.table, res, outputs, prepared.observed_kv)
    return RunResult(stdout=outputs.stdout, summary=outputs.summary,
                     per_instance=outputs.per_instance, requests=outputs.requests,
                     simulation=res, prepared=prepared, summary_extras=outputs.summary_extras,
                     pools=outputs.pools, command="replay" if replay else "run")


@dataclass(frozen=True)
class _Offload:
    """The ``--kv-offload-config`` file's configuration (None without the flag) and its
    warnings (inert keys, KVO-D4; the April tier's transfer flags, KVO-1.4), as resolved before
    the latency backend (KVO-1.3)."""

    config: KVOffloadConfig | None = None
    warnings: tuple[str, ...] = ()


def resolve_run_latency(opts: Any, lora: bool = False, replay: bool = False
                        ) -> tuple[Any, LatencyConfig, LoRAConfig | None, _Offload]:
    """A run's first stage: the log level, the start checks, the model lower-cased, with
    ``lora`` the LoRA configuration (LORA-1.11: before the latency backend, whose KV
    auto-calculation reserves its adapters' HBM) and the ``--kv-offload-config`` file (KVO-1.3:
    after LoRA, before the backend; ``replay`` states the clash with ``--kv-cpu-blocks``
    once the trace header is read), and the latency backend resolved. Returns the options
    (model lower-cased), the backend, the LoRA configuration (None without ``lora``) and the
    offload file's configuration; :func:`prepare` goes on from here, ``blis step-time``
    (:func:`step_latency`) stops here."""
    _setup_logging(opts)
    check_options(opts, "start")
    opts = replace(opts, model=opts.model.lower())
    lora_cfg = _resolve_lora(opts) if lora else None
    offload = _resolve_offload_flag(opts, replay) if lora else _Offload()
    return opts, resolve_latency(opts, lora_cfg), lora_cfg, offload


def _run_defaults(opts: Any) -> DefaultsConfig | None:
    """The run's defaults.yaml parsed (None when the file does not exist)."""
    path = _defaults_file(opts)
    if not os.path.exists(path):
        return None
    try:
        return load_defaults(path)
    except BlisInputError as exc:
        raise BlisInputError(f"--defaults-filepath: {exc}") from None


def _resolve_lora(opts: Any) -> LoRAConfig:
    """The run's LoRA configuration (file, defaults.yaml's block, flags; LORA-1.3)."""
    defaults = _run_defaults(opts)
    return resolve_lora(opts, None if defaults is None else defaults.lora)


def _resolve_offload_flag(opts: Any, replay: bool) -> _Offload:
    """The ``--kv-offload-config`` file resolved against defaults.yaml's device classes
    (KVO-2); a run also refuses it beside ``--kv-cpu-blocks`` (KVO-1.3)."""
    if not opts.kv_offload_config:
        return _Offload()
    defaults = _run_defaults(opts)
    devices = {} if defaults is None else defaults.kv_offload_devices
    cfg, warning = resolve_flag(opts.kv_offload_config, devices, opts.block_size_in_tokens)
    if not replay and opts.kv_cpu_blocks > 0:
        _fail("--kv-offload-config and --kv-cpu-blocks are mutually exclusive (distinct "
              "KV-offload models); set only one")
    warnings = () if warning is None else (warning,)
    ignored = [f"--{flag}" for flag in ("kv-transfer-bandwidth", "kv-transfer-base-latency")
               if opts.given(flag.replace("-", "_"))]
    if ignored:
        verb = "apply" if len(ignored) > 1 else "applies"
        warnings += (f"{' and '.join(ignored)} {verb} to the --kv-cpu-blocks tier only: the "
                     "--kv-offload-config chain takes its figures from the file",)
    return _Offload(cfg, warnings)


def _replay_offload(opts: Any, header: dict, flag: _Offload) -> _Offload:
    """Replay's tier chain (KVO-11.2): the trace header's configuration, the flag's checked
    against it, and the clash with ``--kv-cpu-blocks``."""
    cfg = reconcile_replay(header.get("kv_offload"), header.get("mode", ""), flag.config)
    if cfg is not None and opts.kv_cpu_blocks > 0:
        _fail("--kv-cpu-blocks conflicts with the trace's kv_offload config (distinct "
              "KV-offload models); set only one")
    check_observed_kv_replayable(header, cfg is not None)
    return _Offload(cfg, flag.warnings)


def step_latency(opts: Any) -> LatencyConfig:
    """The latency backend exactly as a run with ``opts`` resolves it, its warnings and
    informational messages logged as the run logs them (``blis step-time``)."""
    _, latency, _, _ = resolve_run_latency(opts)
    for msg in latency.warnings:
        log.warning(msg)
    for msg in latency.infos:
        log.info(msg)
    return latency


def prepare(opts: Any, hooks: Hooks | None = None, replay: bool = False) -> Prepared:
    """Validate every option and build the run (no output is written here)."""
    given = opts
    opts, latency, lora, offload = resolve_run_latency(opts, lora=True, replay=replay)
    if opts.num_instances > MAX_INSTANCES:  # blis_fast's own limit: before any sizing
        _fail(f"--num-instances must be <= {MAX_INSTANCES} (the most instances an event key "
              f"can address), got {opts.num_instances}")
    sessions = None
    outputs_reenter = False  # replayed inputs never repeat outputs (follow-ups: ``sessions``)
    adapter_refs: list[tuple[str, str, str, str]] = []  # LORA-1.8: spec clients, cohorts
    observed_kv = None  # replay: the trace header's observed_kv_metrics (KVO-11.3)
    if replay:
        table, horizon, sessions, header = _replay_workload(opts)
        offload = _replay_offload(opts, header, offload)
        observed_kv = header.get("observed_kv_metrics")
    else:
        table, horizon, sessions, outputs_reenter = _generate(opts, opts.horizon,
                                                              latency.total_kv_blocks,
                                                              adapter_refs)
    check_options(opts, "engine")
    hooks = hooks or Hooks()
    encode_warnings = check_encode(opts) if replay else None
    pol = _resolve_policies(opts, hooks, lora)
    pd = validate_pd(opts, replay, allow_custom=hooks.scorer is not None,
                     encode_warnings=encode_warnings)
    _check_hooks_used(hooks, pol, pd)
    autoscale = resolve_autoscale(opts, pol.bundle, latency, replay)
    if pd.on and autoscale.active:  # an instance the autoscaler adds would belong to no pool
        raise BlisConfigError("--prefill-instances/--decode-instances/--prefill-decode-instances "
                              "cannot be combined with the autoscaler (instances it adds would "
                              "belong to no pool)")
    total_blocks = latency.total_kv_blocks
    _check_memory(opts, total_blocks, table.n)
    bs = opts.block_size_in_tokens
    max_len = latency.max_model_len
    if max_len > 0 and -(-max_len // bs) > total_blocks:
        _fail(f"KV cache too small for --max-model-len: need {-(-max_len // bs)} blocks "
              f"(ceil({max_len}/{bs})) but total KV blocks = {total_blocks}")
    if opts.kv_offload_threshold != 0 and opts.kv_cpu_blocks > 0:
        log.warning("KVOffloadThreshold is deprecated and ignored; the CPU tier is populated "
                    "by mirroring")
    if opts.kv_cpu_reload == "always" and opts.kv_cpu_blocks <= 0:
        log.warning(f"--kv-cpu-reload {opts.kv_cpu_reload} has no effect without --kv-cpu-blocks "
                    "(the --kv-offload-config chain consults its tiers on every allocation)")
    check_construction(opts, pd)
    if pd.on:
        if sessions is not None and sessions.blueprints:
            _fail("closed-loop sessions are not supported yet with P/D disaggregation")
        pd = with_transfer_sizing(pd, opts, latency)
        pools = resolve_pools(pd, opts, latency)
        _check_memory(opts, total_blocks, table.n, instance_blocks=pools.kv_blocks)
        check_transfer_range(pd, pools.kv_blocks, table.n)
    pd = replace(pd, warnings=pd.warnings + tuple(config_warnings(opts, pd, latency.backend)))
    check_workload_adapters(lora, adapter_refs)  # LORA-1.8: after every other check
    kv_offload = _offload_for_engine(offload.config, opts, latency, replay)
    if pd.on and kv_offload is not None:  # as --kv-cpu-blocks: the P/D kernels run no CPU tier
        _fail("--kv-offload-config is not supported yet with P/D disaggregation")
    resolved = replace(opts, horizon=horizon, total_kv_blocks=total_blocks, max_model_len=max_len,
                       counterfactual_k=min(opts.counterfactual_k, opts.num_instances))
    engine = EngineConfig(
        options=resolved, latency=latency, policies=pol, hooks=hooks, pd=pd if pd.on else None,
        **(pools.engine_fields() if pd.on else {}),
        autoscale=autoscale if autoscale.active else None,
        lora=lora,
        kv_offload=kv_offload,
        # the reference hashes every block output tokens fill; a later request can match one
        # only if its input repeats that output: rounds of an accumulating multi-turn client,
        # open loop (pre-generated) or closed loop (follow-ups built at completion)
        hash_decode_blocks=outputs_reenter or bool(sessions and any(
            bp.context_growth == "accumulate" for bp in sessions.blueprints)),
    )
    # diagnostics of a run that passed every check (a refused run prints only its error)
    for msg in latency.warnings + list(pd.warnings) + list(pools.warnings if pd.on else ()):
        log.warning(msg)
    for msg in latency.infos:
        log.info(msg)
    for msg in autoscale.warnings:
        log.warning(msg)
    for msg in offload.warnings:
        log.warning(msg)
    if kv_offload is not None:
        log.warning("--kv-offload-config: CPU->GPU reloads cost no time, as in the August "
                    "reference (KVO-D1; --kv-cpu-blocks charges them)")
        if kv_offload.tiers:
            log.warning("--kv-offload-config: secondary tiers keep every block written to them "
                        "(no capacity, no eviction), as in the August reference (KVO-D2)")
    no_capacity = no_capacity_warning(lora)
    if no_capacity is not None:
        log.warning(no_capacity)
    log.info("Policy config: admission=%s, routing=%s, priority=%s, scheduler=%s",
             pol.admission, pol.routing, pol.priority, pol.scheduler)
    if pol.routing == "weighted":
        log.info("Weighted routing scorers: %s",
                 ", ".join(f"{name}:{weight:.1f}" for name, weight in engine.scorers))
    return Prepared(opts=opts, latency=latency, table=table, engine=engine, policies=pol,
                    sessions=sessions, given=given,
                    observed_kv=observed_kv)


def _fail(msg: str) -> None:
    raise BlisConfigError(msg)


def _setup_logging(opts: Any) -> None:
    check_options(opts, "logging")
    log.setLevel(LOG_LEVELS[opts.log.lower()])


def _defaults_file(opts: Any) -> str:
    """The defaults.yaml to use: the flag's value, else the bundled copy."""
    return opts.defaults_filepath or str(data_path("defaults.yaml"))


def _generate(opts: Any, horizon: int, total_blocks: int,
              adapter_refs: list[tuple[str, str, str, str]] | None = None
              ) -> tuple[RequestTable, int, SessionPlan | None, bool]:
    """Workload source selection and generation (WL-1, WL-2, DELTA-28/29).

    Returns the requests, the simulation horizon (a spec's horizon applies unless
    ``--horizon`` was given), the closed-loop sessions the engine continues (or None) and
    whether some input repeats an earlier request's output (accumulating multi-turn clients).
    ``adapter_refs`` receives a spec's ``(kind, id, model, adapter)`` of every client, then
    every cohort, for the LoRA reference check (LORA-1.8).
    """
    check_options(opts, "workload")
    if opts.given("think_time_ms") and opts.concurrency <= 0 and opts.think_time_ms != 0:
        _fail("--think-time-ms applies only to closed-loop runs: give --concurrency too")
    if opts.workload_spec and opts.given("workload"):
        _fail("--workload and --workload-spec both choose the workload; give one of them")
    if opts.concurrency > 0 and opts.given("rate"):
        _fail("--concurrency and --rate are mutually exclusive; use one or the other")
    params = DistributionParams.from_flags(opts)
    timeout_applies = True
    source = workload_source(opts, distribution="distribution")
    if source == "spec":
        if opts.concurrency > 0:
            _fail("--concurrency cannot be used with --workload-spec; define concurrency in the "
                  "spec file using clients[].concurrency instead")
        try:
            spec = load_workload_spec(opts.workload_spec)
        except BlisInputError as exc:
            raise BlisInputError(f"--workload-spec: {exc}") from None
        spec.seed = resolve_workload_seed(spec.seed, opts.seed, opts.given("seed"))
        if adapter_refs is not None:
            adapter_refs += [("client", c.id, c.model, c.adapter) for c in spec.clients]
            adapter_refs += [("cohort", c.id, c.model, c.adapter) for c in spec.cohorts]
        horizon = resolve_horizon(spec.horizon, horizon, opts.given("horizon"))
        timeout_applies = opts.given("timeout")
    elif source == "concurrency":
        validate_distribution_params(params)
        spec = synthesize_concurrency(
            params, opts.concurrency, opts.think_time_ms,
            num_requests=opts.num_requests if opts.given("num_requests") else 0, seed=opts.seed)
    elif source == "distribution":
        check_options(opts, "rate")
        validate_distribution_params(params)
        spec = synthesize_from_distribution(params, seed=opts.seed)
    else:
        check_options(opts, "rate")
        defaults = load_defaults(_defaults_file(opts))
        preset = lookup_preset(defaults.workloads, opts.workload)
        spec = synthesize_from_preset(preset, opts.rate, opts.num_requests, seed=opts.seed)
    check_options(opts, "timeout")
    if timeout_applies:
        apply_timeout_to_spec(spec, opts.timeout)
    max_requests = resolve_max_requests(spec.num_requests, opts.num_requests,
                                        opts.given("num_requests"))
    check_generation_bounded(max_requests, horizon)
    tokens = 0 if opts.workload_spec else opts.prompt_tokens + opts.output_tokens
    _check_memory(opts, total_blocks, max_requests, tokens)
    notify_if_compiling(pd=pd_requested(opts))
    try:
        wl = generate_workload(spec, horizon=horizon, max_requests=max_requests,
                               block_size=opts.block_size_in_tokens)
    except (MemoryError, ValueError) as exc:
        # the sampled lengths are only known inside the generator (huge distribution means or
        # tails): numba reports an allocation past int64 as ValueError ("array is too big",
        # "negative dimensions")
        if isinstance(exc, ValueError) and not _allocation_error(exc):
            raise
        source = f"--workload-spec {opts.workload_spec}" if opts.workload_spec else (
            "--num-requests/--prompt-tokens/--output-tokens")
        _fail(f"{source}: the generated requests need more memory than this machine has "
              "(request lengths or count too large)")
    if timeout_applies:
        wl = apply_timeout_to_workload(wl, opts.timeout)
    sessions = SessionPlan(wl.sessions, wl.follow_up_budget) if wl.sessions else None
    return wl.table, horizon, sessions, wl.outputs_reenter_inputs


def _check_hooks_used(hooks: Hooks, pol: Any, pd: Any) -> None:
    """Refuse a user function that no chosen policy would call (the API's ``custom_*``
    keywords): passed without ``admission_policy="custom"``, ``scheduler="custom"`` or a
    ``custom`` routing scorer, it would be ignored silently and the run would not be the one
    asked for."""
    pools = (pd.prefill_scorers + pd.decode_scorers) if pd.on else ()
    scorers = [name for name, _w in (*pol.scorers, *pools)]
    for name, given, used, how in (
            ("custom_scorer", hooks.scorer, "custom" in scorers,
             'routing_policy="weighted" with routing_scorers naming "custom"'),
            ("custom_admission", hooks.admission, pol.admission == "custom",
             'admission_policy="custom"'),
            ("custom_scheduler_key", hooks.scheduler_key, pol.scheduler == "custom",
             'scheduler="custom"')):
        if given is not None and not used:
            _fail(f"{name} was given but no policy calls it: choose it with {how}")


def _offload_for_engine(cfg: KVOffloadConfig | None, opts: Any, latency: LatencyConfig,
                        replay: bool) -> KVOffloadConfig | None:
    """The tier chain as the engine builds it: ``per_block_bytes`` derived from the model
    (KVO-3.1: the GPU block on ``run``; on ``replay`` kept from the trace header, else the
    offload block, KVO-11.2), then the configurations the reference cannot build refused
    (KVO-D3)."""
    if cfg is None:
        return None
    if not replay or cfg.per_block_bytes == 0:
        tokens = cfg.block_size if replay else opts.block_size_in_tokens
        cfg = with_block_bytes(cfg, latency.model_config, latency.tp, tokens, latency.backend)
    check_buildable(cfg)
    return cfg


def _replay_workload(opts: Any) -> tuple[RequestTable, int, SessionPlan | None, dict]:
    """The requests of a trace v2, the replay horizon (WL-9.6, WL-9.7), with
    ``--session-mode closed-loop`` the sessions the engine continues (DELTA-65), and the
    trace header."""
    check_options(opts, "replay-inputs")
    header = load_trace_header(opts.trace_header)
    records = load_trace_records(opts.trace_data)
    check_options(opts, "replay")
    mode = opts.session_mode
    # replay states this flag's checks itself: its message differs from blis run's
    if opts.think_time_ms < 0:
        _fail(f"--think-time-ms must be non-negative, got {opts.think_time_ms}")
    if opts.think_time_ms * 1000 > TIME_LIMIT_US:
        _fail(f"--think-time-ms {opts.think_time_ms} is beyond the simulator's time range")
    if opts.think_time_ms > 0 and mode != "closed-loop":
        _fail("--think-time-ms requires --session-mode closed-loop")
    if opts.think_time_dist and mode != "closed-loop":
        _fail("--think-time-dist requires --session-mode closed-loop")
    if opts.given("think_time_ms") and opts.given("think_time_dist"):
        _fail("--think-time-ms and --think-time-dist are mutually exclusive")
    think = None
    try:
        if opts.given("think_time_dist"):
            think = parse_think_time_dist(opts.think_time_dist)
        elif opts.think_time_ms > 0:
            think = parse_think_time_dist(f"constant:value={opts.think_time_ms}ms")
    except ValueError as exc:
        flag = "--think-time-dist" if opts.given("think_time_dist") else "--think-time-ms"
        _fail(f"{flag}: {exc}")
    if opts.fitness_weights:
        log.warning("--fitness-weights has no effect in replay")
    closed = mode == "closed-loop"
    notify_if_compiling(pd=pd_requested(opts))
    prelim = (opts.horizon if opts.given("horizon")
              else replay_horizon(max_injected_arrival(records, closed)))
    _check_replay_tokens(records, opts.block_size_in_tokens)
    replayed = replay_workload(records, opts.seed, opts.block_size_in_tokens,
                               closed_loop=closed, think_sampler=think, horizon=prelim)
    table = replayed.table
    horizon = opts.horizon if opts.given("horizon") else replay_horizon(table.arrival_us)
    sessions = None
    if closed and not replayed.sessions:
        log.warning("--session-mode closed-loop: no session records found in trace; all "
                    "requests injected with fixed timing")
    elif replayed.sessions:
        sessions = SessionPlan(replayed.sessions)
    return table, horizon, sessions, header


def _resolve_policies(opts: Any, hooks: Hooks, lora: LoRAConfig | None = None) -> Policies:
    """The policies (bundle merged under the flags, CLU-5) and the cluster flag checks that
    follow them in the reference's order (CLU-9.6, DELTA-26); ``--lora-scorer-weight``
    appends ``lora-affinity`` to the weighted profile (LORA-7.3)."""
    pol = select_policies(opts, hooks)
    check_options(opts, "tracing")
    if opts.trace_level != "decisions" and (opts.counterfactual_k > 0 or opts.summarize_trace):
        log.warning("--counterfactual-k and --summarize-trace have no effect without "
                    "--trace-level decisions")
    check_options(opts, "kv-tier")
    bw = opts.kv_transfer_bandwidth
    if opts.kv_cpu_blocks > 0 and (not (bw > 0) or math.isinf(bw)):
        _fail(f"--kv-transfer-bandwidth must be a finite value > 0 when --kv-cpu-blocks > 0, "
              f"got {bw:f}")
    check_options(opts, "delays")
    if opts.kv_cpu_blocks > 0 and (opts.kv_transfer_base_latency  # float: a denormal bw is inf
                                   + opts.block_size_in_tokens / bw > TIME_LIMIT_US):
        _fail(f"--kv-transfer-bandwidth {bw} makes a block transfer longer than the simulator's "
              "time range")
    if pol.routing == "weighted":
        cli_scorers = parse_scorer_list(opts.routing_scorers, allow_custom=hooks.scorer is not None)
        pol.scorers = tuple(cli_scorers) or pol.scorers
    else:
        pol.scorers = ()
        if opts.routing_scorers:
            log.warning("--routing-scorers has no effect unless --routing-policy is weighted")
    pol.scorers, lora_warning = compose_scorer_weight(lora, pol.routing, pol.scorers,
                                                      DEFAULT_PROFILE)
    if lora_warning is not None:
        log.warning(lora_warning)
    if opts.fitness_weights:
        weights = parse_fitness_weights(opts.fitness_weights)
        for key in sorted(weights):
            if key not in FITNESS_KEYS:
                _fail(f"--fitness-weights: unknown fitness metric key {key!r}")
    return pol


REQUEST_BYTES = 512
"""Up-front state of one request (request table, engine and metric columns), a low estimate."""
GROWING_BYTES = 4 * 52 + 2 * 24 + 3 * 25
"""What one request adds to the arrays that grow during the run, at their first size: four
step-log entries (52 bytes), two ITL runs (24) and three event-heap entries (25) per request
(``engine/simulate.py``); they double when full, and a growth past the memory available stops
the run (``simulate._check_growth``)."""


def _check_memory(opts: Any, total_blocks: int, num_requests: int,
                  tokens_per_request: int = 0,
                  instance_blocks: tuple[int, ...] | None = None) -> None:
    """One estimate of the arrays a run allocates up front, refused (naming the flag that
    drives it) when it exceeds the memory available: KV blocks of every instance (GPU and CPU
    tiers), the requests with their block digests and their share of the step log and event
    heap at first size, the shared prefix's token ids, and with
    --trace-level decisions the per-decision candidate (counterfactual k) and score rows."""
    n = max(opts.num_instances, 0)
    bs = max(opts.block_size_in_tokens, 1)
    reqs = max(num_requests, 0)
    blocks_flag = ("--total-kv-blocks" if opts.given("total_kv_blocks") else
                   "--tp" if opts.given("tp") else "--num-instances")
    if instance_blocks is not None:  # P/D pools: each pool's TP, GPU and length size its KV
        blocks_flag = next((f"--{pool}-{what}" for what in ("tp", "hardware")
                            for pool in ("prefill", "decode")
                            if opts.given(f"{pool}_{what}")), blocks_flag)
    parts = {
        blocks_flag: (sum(max(b, 0) for b in instance_blocks) if instance_blocks is not None
                      else n * max(total_blocks, 0)) * (32 + 2 * 16),  # records, prefix table
        "--kv-cpu-blocks": n * max(opts.kv_cpu_blocks, 0) * (8 + 3 * 4 + 2 * 16),
        "--num-requests": reqs * (REQUEST_BYTES + GROWING_BYTES
                                  + 16 * (max(tokens_per_request, 0) // bs)),
        "--prefix-tokens": 8 * max(opts.prefix_tokens, 0)
                           + reqs * 16 * (max(opts.prefix_tokens, 0) // bs),
    }
    if opts.trace_level == "decisions":
        k = min(max(opts.counterfactual_k, 1), max(n, 1))
        parts["--counterfactual-k"] = reqs * k * 56
        parts["--num-instances"] = parts.get("--num-instances", 0) + reqs * n * 8
    gpu = (f"{sum(instance_blocks)} GPU KV blocks over {n} instance(s)"
           if instance_blocks is not None else f"{n} instance(s) x {total_blocks} GPU")
    refuse_over_memory(parts, f"{gpu} + {opts.kv_cpu_blocks} CPU KV blocks, {reqs} requests")


def _allocation_error(exc: ValueError) -> bool:
    """True for numba's and numpy's refusals of an array size beyond int64."""
    text = str(exc)
    return "array is too big" in text or "negative dimensions" in text


def _check_replay_tokens(rec: Any, block_size: int) -> None:
    """Refuse a trace whose token counts need more memory than there is before its token ids
    are drawn (in Python integers: a row of 2^63-1 tokens must not wrap to a negative size):
    each shared prefix's ids, a digest per block of every request, one request's ids."""
    bs = max(block_size, 1)
    groups: dict[str, int] = {}
    for g, plen in zip(rec.prefix_group, rec.prefix_length.tolist(), strict=True):
        if g and plen > 0:
            groups.setdefault(g, int(plen))
    blocks = longest = 0
    for g, n_in, n_out in zip(rec.prefix_group, rec.input_tokens.tolist(),
                              rec.output_tokens.tolist(), strict=True):
        total = groups.get(g, 0) + int(n_in) + int(n_out)
        blocks += total // bs
        longest = max(longest, total)
    refuse_over_memory({"--trace-data": 8 * (sum(groups.values()) + blocks + longest)},
                       f"{len(rec.input_tokens)} trace rows, longest {longest} tokens")


def refuse_over_memory(parts: dict[str, int], detail: str) -> None:
    """Refuse a run whose up-front arrays (bytes per flag that drives them) exceed the memory
    available, naming the flag with the largest share; ``detail`` says what was counted.
    Shared by ``blis run``/``replay`` and ``blis observe``, so both refuse the same sizes."""
    total = sum(parts.values())
    limit = available_memory()
    if total > limit:
        flag = max(parts, key=parts.__getitem__)
        _fail(f"{flag}: this run needs about {total / 2**30:.1f} GiB up front ({detail}), more "
              f"than the {limit / 2**30:.1f} GiB of memory available")
