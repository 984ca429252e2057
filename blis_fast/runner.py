"""``blis run`` end to end: validate and resolve options, generate, simulate, report.

Validation follows the reference's order (DELTA-26) so the first bad flag is the one
reported; every check runs before the kernel starts and before any file is written.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from blis_fast.config.defaults import load_defaults
from blis_fast.config.latency import LatencyConfig, LatencyOptions, resolve_latency
from blis_fast.config.policy_bundle import (
    VALID_ADMISSION,
    VALID_PRIORITY,
    VALID_ROUTING,
    VALID_SCHEDULER,
    load_policy_bundle,
    parse_scorer_list,
)
from blis_fast.data import data_path
from blis_fast.engine.compile_notice import notify_if_compiling
from blis_fast.engine.simulate import (
    DEFAULT_SCORERS,
    EngineConfig,
    Hooks,
    SessionPlan,
    SimulationResult,
    run_engine,
)
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.files import OutputPlan
from blis_fast.kernels.enums import Registration, RequestState
from blis_fast.kernels.heap import MAX_INSTANCES
from blis_fast.kernels.latency import output_token_processing_time, post_decode_fixed_overhead
from blis_fast.kernels.state import InstanceCounter
from blis_fast.options import RunOptions
from blis_fast.output.report import (
    ClusterReport,
    parse_fitness_weights,
    render_report,
    summarize_trace,
)
from blis_fast.output.summary import (
    InstanceMetrics,
    RequestColumns,
    aggregate_instances,
    build_metrics_output,
    replay_results_text,
    results_text,
)
from blis_fast.workload.generator import (
    apply_timeout_to_workload,
    check_generation_bounded,
    generate_workload,
    resolve_horizon,
    resolve_max_requests,
    resolve_workload_seed,
)
from blis_fast.workload.gofmt import go_quote
from blis_fast.workload.replay import (
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
    validate_rate,
)
from blis_fast.workload.trace_v2 import TraceOutcome, trace_v2_files

log = logging.getLogger("blis_fast")

LOG_LEVELS = {
    "trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
    "warn": logging.WARNING, "warning": logging.WARNING, "error": logging.ERROR,
    "fatal": logging.CRITICAL, "panic": logging.CRITICAL,
}

FITNESS_KEYS = ("throughput", "tokens_per_sec", "p99_ttft", "p50_ttft", "mean_ttft", "p99_e2e",
                "p50_e2e", "mean_e2e")


@dataclass
class Prepared:
    """A validated run: resolved latency backend, generated workload, engine config."""

    opts: RunOptions
    latency: LatencyConfig
    table: RequestTable
    engine: EngineConfig
    policies: Policies
    sessions: SessionPlan | None = None  # closed-loop sessions continued by the engine


@dataclass
class RunResult:
    """What one ``blis run`` produced."""

    stdout: str
    summary: dict
    per_instance: list[dict]
    requests: RequestColumns
    simulation: SimulationResult
    prepared: Prepared

    def requests_table(self):
        """Per-request results as a pyarrow Table (schema ``schemas/requests.json``)."""
        from blis_fast.output.parquet import requests_table

        return requests_table(self.requests)

    def requests_frame(self):
        """Per-request results as a polars DataFrame."""
        import polars as pl

        return pl.from_arrow(self.requests_table())


def _fail(msg: str) -> None:
    raise BlisConfigError(msg)


def _setup_logging(level_name: str) -> None:
    level = LOG_LEVELS.get(level_name.lower())
    if level is None:
        _fail(f"--log: invalid log level {level_name!r} (valid: {', '.join(LOG_LEVELS)})")
    log.setLevel(level)


def _defaults_file(opts: RunOptions) -> str:
    """The defaults.yaml to use: the flag's value, else the bundled copy."""
    return opts.defaults_filepath or str(data_path("defaults.yaml"))


def _resolve_latency(opts: RunOptions) -> LatencyConfig:
    if opts.given("total_kv_blocks") and opts.total_kv_blocks <= 0:
        # checked before the max-model-len cap derived from it can report a confusing error
        _fail(f"--total-kv-blocks must be > 0, got {opts.total_kv_blocks}")
    explicit = frozenset(name.replace("_", "-") for name in opts.explicit)
    lo = LatencyOptions(
        model=opts.model,
        latency_model=opts.latency_model,
        alpha_coeffs=tuple(opts.alpha_coeffs),
        beta_coeffs=tuple(opts.beta_coeffs),
        hardware=opts.hardware,
        tp=opts.tp,
        vllm_version=opts.vllm_version,
        total_kv_blocks=opts.total_kv_blocks,
        block_size_in_tokens=opts.block_size_in_tokens,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        max_model_len=opts.max_model_len,
        defaults_filepath=_defaults_file(opts),
        model_config_folder=opts.model_config_folder,
        hardware_config=opts.hardware_config,
        explicit=explicit,
    )
    return resolve_latency(lo)


def _generate(opts: RunOptions, horizon: int, total_blocks: int
              ) -> tuple[RequestTable, int, SessionPlan | None, bool]:
    """Workload source selection and generation (WL-1, WL-2, DELTA-28/29).

    Returns the requests, the simulation horizon (a spec's horizon applies unless
    ``--horizon`` was given), the closed-loop sessions the engine continues (or None) and
    whether some input repeats an earlier request's output (accumulating multi-turn clients).
    """
    if opts.num_requests < 0:
        _fail(f"--num-requests must be >= 0, got {opts.num_requests}")
    if opts.prefix_tokens < 0:
        _fail(f"--prefix-tokens must be >= 0, got {opts.prefix_tokens}")
    if opts.concurrency < 0:
        _fail(f"--concurrency must be >= 0, got {opts.concurrency}")
    if opts.think_time_ms < 0:
        _fail(f"--think-time-ms must be >= 0, got {opts.think_time_ms}")
    if opts.think_time_ms * 1000 > TIME_LIMIT_US:
        _fail(f"--think-time-ms {opts.think_time_ms} is beyond the simulator's time range")
    if opts.given("think_time_ms") and opts.concurrency <= 0 and opts.think_time_ms != 0:
        _fail("--think-time-ms applies only to closed-loop runs: give --concurrency too")
    if opts.workload_spec and opts.given("workload"):
        _fail("--workload and --workload-spec both choose the workload; give one of them")
    if opts.concurrency > 0 and opts.given("rate"):
        _fail("--concurrency and --rate are mutually exclusive; use one or the other")
    params = DistributionParams.from_flags(opts)
    timeout_applies = True
    if opts.workload_spec:
        if opts.concurrency > 0:
            _fail("--concurrency cannot be used with --workload-spec; define concurrency in the "
                  "spec file using clients[].concurrency instead")
        try:
            spec = load_workload_spec(opts.workload_spec)
        except BlisInputError as exc:
            raise BlisInputError(f"--workload-spec: {exc}") from None
        spec.seed = resolve_workload_seed(spec.seed, opts.seed, opts.given("seed"))
        horizon = resolve_horizon(spec.horizon, horizon, opts.given("horizon"))
        timeout_applies = opts.given("timeout")
    elif opts.concurrency > 0:
        validate_distribution_params(params)
        spec = synthesize_concurrency(
            params, opts.concurrency, opts.think_time_ms,
            num_requests=opts.num_requests if opts.given("num_requests") else 0, seed=opts.seed)
    elif opts.workload == "distribution":
        validate_rate(opts.rate)
        validate_distribution_params(params)
        spec = synthesize_from_distribution(params, seed=opts.seed)
    else:
        validate_rate(opts.rate)
        defaults = load_defaults(_defaults_file(opts))
        preset = lookup_preset(defaults.workloads, opts.workload)
        spec = synthesize_from_preset(preset, opts.rate, opts.num_requests, seed=opts.seed)
    if opts.timeout == 0:
        _fail("--timeout must be positive (seconds) or negative to disable; got 0")
    if opts.timeout * 1_000_000 > TIME_LIMIT_US:
        _fail(f"--timeout {opts.timeout} s is beyond the simulator's time range")
    if timeout_applies:
        apply_timeout_to_spec(spec, opts.timeout)
    max_requests = resolve_max_requests(spec.num_requests, opts.num_requests,
                                        opts.given("num_requests"))
    check_generation_bounded(max_requests, horizon)
    tokens = 0 if opts.workload_spec else opts.prompt_tokens + opts.output_tokens
    _check_memory(opts, total_blocks, max_requests, tokens)
    notify_if_compiling()
    try:
        wl = generate_workload(spec, horizon=horizon, max_requests=max_requests,
                               block_size=opts.block_size_in_tokens)
    except MemoryError:
        # the sampled lengths are only known inside the generator (huge distribution means)
        source = f"--workload-spec {opts.workload_spec}" if opts.workload_spec else (
            "--num-requests/--prompt-tokens/--output-tokens")
        _fail(f"{source}: the generated requests need more memory than this machine has "
              "(request lengths or count too large)")
    if timeout_applies:
        wl = apply_timeout_to_workload(wl, opts.timeout)
    sessions = SessionPlan(wl.sessions, wl.follow_up_budget) if wl.sessions else None
    return wl.table, horizon, sessions, wl.outputs_reenter_inputs


def _replay_workload(opts: RunOptions) -> tuple[RequestTable, int, SessionPlan | None]:
    """The requests of a trace v2, the replay horizon (WL-9.6, WL-9.7) and, with
    ``--session-mode closed-loop``, the sessions the engine continues (DELTA-65)."""
    if not opts.trace_header:
        _fail("--trace-header is required")
    if not opts.trace_data:
        _fail("--trace-data is required")
    load_trace_header(opts.trace_header)
    records = load_trace_records(opts.trace_data)
    mode = opts.session_mode
    if mode not in ("fixed", "closed-loop"):
        _fail(f'--session-mode must be "fixed" or "closed-loop", got {go_quote(mode)}')
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
    notify_if_compiling()
    prelim = (opts.horizon if opts.given("horizon")
              else replay_horizon(max_injected_arrival(records, closed)))
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
    return table, horizon, sessions


@dataclass
class Policies:
    """Cluster policy settings after merging ``--policy-config`` under the CLI flags."""

    admission: str
    routing: str
    priority: str
    scheduler: str
    scorers: tuple[tuple[str, float], ...]
    token_bucket_capacity: float
    token_bucket_refill_rate: float
    tier_shed_threshold: int = 0
    tier_shed_min_priority: int = 0
    gaie_qd_threshold: float = 5.0
    gaie_kv_threshold: float = 0.8
    slo_priorities: dict | None = None
    tenant_budgets: dict | None = None


def _resolve_policies(opts: RunOptions, hooks: Hooks) -> Policies:
    """Bundle load/merge, then the policy and cluster flag checks (CLU-5, CLU-9.6, DELTA-26)."""
    pol = Policies(admission=opts.admission_policy, routing=opts.routing_policy,
                   priority=opts.priority_policy, scheduler=opts.scheduler, scorers=(),
                   token_bucket_capacity=opts.token_bucket_capacity,
                   token_bucket_refill_rate=opts.token_bucket_refill_rate)
    bundle_scorers: list[tuple[str, float]] = []
    if opts.policy_config:
        b = load_policy_bundle(opts.policy_config)
        if b.admission_policy and not opts.given("admission_policy"):
            pol.admission = b.admission_policy
        if b.token_bucket_capacity is not None and not opts.given("token_bucket_capacity"):
            pol.token_bucket_capacity = b.token_bucket_capacity
        if b.token_bucket_refill_rate is not None and not opts.given("token_bucket_refill_rate"):
            pol.token_bucket_refill_rate = b.token_bucket_refill_rate
        if b.tier_shed_threshold is not None:
            pol.tier_shed_threshold = b.tier_shed_threshold
        if b.tier_shed_min_priority is not None:
            pol.tier_shed_min_priority = b.tier_shed_min_priority
        elif b.admission_policy == "tier-shed":
            pol.tier_shed_min_priority = 3
        pol.tenant_budgets = b.tenant_budgets
        pol.slo_priorities = b.slo_priorities
        if b.gaie_qd_threshold is not None:
            pol.gaie_qd_threshold = b.gaie_qd_threshold
        if b.gaie_kv_threshold is not None:
            pol.gaie_kv_threshold = b.gaie_kv_threshold
        if b.routing_policy and not opts.given("routing_policy"):
            pol.routing = b.routing_policy
        bundle_scorers = b.scorers
        if b.priority_policy and not opts.given("priority_policy"):
            pol.priority = b.priority_policy
        if b.scheduler and not opts.given("scheduler"):
            pol.scheduler = b.scheduler
    if pol.admission == "token-bucket":
        for flag, value in (("token-bucket-capacity", pol.token_bucket_capacity),
                            ("token-bucket-refill-rate", pol.token_bucket_refill_rate)):
            if not (value > 0) or math.isinf(value):
                _fail(f"--{flag} must be a finite value > 0, got {value}")
    for flag, name, valid, hook in (
            ("admission-policy", pol.admission, VALID_ADMISSION, hooks.admission),
            ("routing-policy", pol.routing, VALID_ROUTING, None),
            ("priority-policy", pol.priority, VALID_PRIORITY, None),
            ("scheduler", pol.scheduler, VALID_SCHEDULER, hooks.scheduler_key)):
        if name == "custom":
            if hook is None:
                _fail(f"--{flag} custom needs a user function: pass it through the Python API "
                      "(blis_fast.run(..., custom_admission=... / custom_scheduler_key=...))")
            continue
        if name and name not in valid:
            _fail(f"--{flag}: unknown value {name!r}. Valid: "
                  + ", ".join(v for v in valid if v))
    if opts.trace_level not in ("", "none", "decisions"):
        _fail(f"--trace-level: unknown value {opts.trace_level!r}. Valid: none, decisions")
    if opts.counterfactual_k < 0:
        _fail(f"--counterfactual-k must be >= 0, got {opts.counterfactual_k}")
    if opts.trace_level != "decisions" and (opts.counterfactual_k > 0 or opts.summarize_trace):
        log.warning("--counterfactual-k and --summarize-trace have no effect without "
                    "--trace-level decisions")
    if opts.kv_cpu_blocks < 0:
        _fail(f"--kv-cpu-blocks must be >= 0, got {opts.kv_cpu_blocks}")
    thr = opts.kv_offload_threshold
    if not (0 <= thr <= 1):
        _fail(f"--kv-offload-threshold must be a finite value in [0, 1], got {thr:f}")
    bw = opts.kv_transfer_bandwidth
    if opts.kv_cpu_blocks > 0 and (not (bw > 0) or math.isinf(bw)):
        _fail(f"--kv-transfer-bandwidth must be a finite value > 0 when --kv-cpu-blocks > 0, "
              f"got {bw:f}")
    for flag, value in (("kv-transfer-base-latency", opts.kv_transfer_base_latency),
                        ("snapshot-refresh-interval", opts.snapshot_refresh_interval),
                        ("cache-signal-delay", opts.cache_signal_delay),
                        ("admission-latency", opts.admission_latency),
                        ("routing-latency", opts.routing_latency)):
        if value < 0:
            _fail(f"--{flag} must be >= 0, got {value}")
        if value > TIME_LIMIT_US:
            _fail(f"--{flag} {value} is beyond the simulator's time range")
    if opts.kv_cpu_blocks > 0 and (opts.kv_transfer_base_latency
                                   + math.ceil(opts.block_size_in_tokens / bw) > TIME_LIMIT_US):
        _fail(f"--kv-transfer-bandwidth {bw} makes a block transfer longer than the simulator's "
              "time range")
    if pol.routing == "weighted":
        cli_scorers = parse_scorer_list(opts.routing_scorers, allow_custom=hooks.scorer is not None)
        pol.scorers = tuple(cli_scorers or bundle_scorers)
    elif opts.routing_scorers:
        log.warning("--routing-scorers has no effect unless --routing-policy is weighted")
    if opts.fitness_weights:
        weights = parse_fitness_weights(opts.fitness_weights)
        for key in sorted(weights):
            if key not in FITNESS_KEYS:
                _fail(f"--fitness-weights: unknown fitness metric key {key!r}")
    return pol


TIME_LIMIT_US = 1 << 61
"""Largest delay or duration accepted (µs): event times stay far from int64 overflow."""
MEMORY_LIMIT_BYTES = 64 << 30
"""Refuse configurations whose up-front arrays alone would need more memory than this."""
REQUEST_BYTES = 512
"""Up-front state of one request (request table, engine and metric columns), a low estimate."""


def available_memory() -> int:
    """Bytes of memory the machine can give this process now (MemAvailable), capped at
    MEMORY_LIMIT_BYTES."""
    avail = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail <= 0:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            avail = MEMORY_LIMIT_BYTES
    return min(avail, MEMORY_LIMIT_BYTES)


def _check_memory(opts: RunOptions, total_blocks: int, num_requests: int,
                  tokens_per_request: int = 0) -> None:
    """One estimate of the arrays a run allocates up front, refused (naming the flag that
    drives it) when it exceeds the memory available: KV blocks of every instance (GPU and CPU
    tiers), the requests with their block digests, the shared prefix's token ids, and with
    --trace-level decisions the per-decision candidate (counterfactual k) and score rows."""
    n = max(opts.num_instances, 0)
    bs = max(opts.block_size_in_tokens, 1)
    reqs = max(num_requests, 0)
    parts = {
        "--total-kv-blocks" if opts.given("total_kv_blocks") else
        ("--tp" if opts.given("tp") else "--num-instances"):
            n * max(total_blocks, 0) * (32 + 2 * 16),  # block records and the prefix table
        "--kv-cpu-blocks": n * max(opts.kv_cpu_blocks, 0) * (8 + 3 * 4 + 2 * 16),
        "--num-requests": reqs * (REQUEST_BYTES + 16 * (max(tokens_per_request, 0) // bs)),
        "--prefix-tokens": 8 * max(opts.prefix_tokens, 0)
                           + reqs * 16 * (max(opts.prefix_tokens, 0) // bs),
    }
    if opts.trace_level == "decisions":
        k = min(max(opts.counterfactual_k, 1), max(n, 1))
        parts["--counterfactual-k"] = reqs * k * 56
        parts["--num-instances"] = parts.get("--num-instances", 0) + reqs * n * 8
    total = sum(parts.values())
    limit = available_memory()
    if total > limit:
        flag = max(parts, key=parts.__getitem__)
        _fail(f"{flag}: this run needs about {total / 2**30:.1f} GiB up front ({n} instance(s) x "
              f"{total_blocks} GPU + {opts.kv_cpu_blocks} CPU KV blocks, {reqs} requests), more "
              f"than the {limit / 2**30:.1f} GiB of memory available")


def prepare(opts: RunOptions, hooks: Hooks | None = None, replay: bool = False) -> Prepared:
    """Validate every option and build the run (no output is written here)."""
    _setup_logging(opts.log)
    if not opts.model:
        _fail("LLM name not provided (--model). Exiting simulation.")
    opts.values["model"] = opts.model.lower()
    latency = _resolve_latency(opts)
    if opts.num_instances > MAX_INSTANCES:  # blis_fast's own limit: before any sizing
        _fail(f"--num-instances must be <= {MAX_INSTANCES} (the most instances an event key "
              f"can address), got {opts.num_instances}")
    sessions = None
    outputs_reenter = False  # replayed inputs never repeat outputs (follow-ups: ``sessions``)
    if replay:
        table, horizon, sessions = _replay_workload(opts)
    else:
        table, horizon, sessions, outputs_reenter = _generate(opts, opts.horizon,
                                                              latency.total_kv_blocks)
    if opts.num_instances < 1:
        _fail("num-instances must be >= 1")
    total_blocks = latency.total_kv_blocks
    if total_blocks <= 0:
        _fail(f"--total-kv-blocks must be > 0, got {total_blocks}")
    if opts.max_num_running_reqs <= 0:
        _fail(f"--max-num-running-reqs must be > 0, got {opts.max_num_running_reqs}")
    if opts.max_num_scheduled_tokens <= 0:
        _fail(f"--max-num-scheduled-tokens must be > 0, got {opts.max_num_scheduled_tokens}")
    if opts.long_prefill_token_threshold < 0:
        _fail(f"--long-prefill-token-threshold must be >= 0, "
              f"got {opts.long_prefill_token_threshold}")
    if opts.given("horizon") and horizon <= 0:
        _fail(f"--horizon must be > 0, got {horizon}")
    pol = _resolve_policies(opts, hooks or Hooks())
    _check_memory(opts, total_blocks, table.n)
    bs = opts.block_size_in_tokens
    max_len = latency.max_model_len
    if max_len > 0 and -(-max_len // bs) > total_blocks:
        _fail(f"KV cache too small for --max-model-len: need {-(-max_len // bs)} blocks "
              f"(ceil({max_len}/{bs})) but total KV blocks = {total_blocks}")
    if opts.kv_offload_threshold != 0 and opts.kv_cpu_blocks > 0:
        log.warning("KVOffloadThreshold is deprecated and ignored; the CPU tier is populated "
                    "by mirroring")
    alpha = np.asarray(latency.alpha, dtype=np.float64)
    engine = EngineConfig(
        num_instances=opts.num_instances,
        horizon=horizon,
        total_kv_blocks=total_blocks,
        block_size=bs,
        max_running_reqs=opts.max_num_running_reqs,
        max_scheduled_tokens=opts.max_num_scheduled_tokens,
        long_prefill_token_threshold=opts.long_prefill_token_threshold,
        max_model_len=max_len,
        kv_cpu_blocks=opts.kv_cpu_blocks,
        kv_transfer_bandwidth=opts.kv_transfer_bandwidth,
        kv_transfer_base_latency=opts.kv_transfer_base_latency,
        admission_latency=opts.admission_latency,
        routing_latency=opts.routing_latency,
        admission_policy=pol.admission,
        routing_policy=pol.routing,
        priority_policy=pol.priority,
        scheduler=pol.scheduler,
        seed=opts.seed,
        routing_scorers=pol.scorers,
        snapshot_refresh_interval=opts.snapshot_refresh_interval,
        cache_signal_delay=opts.cache_signal_delay,
        token_bucket_capacity=pol.token_bucket_capacity,
        token_bucket_refill_rate=pol.token_bucket_refill_rate,
        tier_shed_threshold=pol.tier_shed_threshold,
        tier_shed_min_priority=pol.tier_shed_min_priority,
        gaie_qd_threshold=pol.gaie_qd_threshold,
        gaie_kv_threshold=pol.gaie_kv_threshold,
        slo_priorities=dict(pol.slo_priorities or {}),
        tenant_budgets=dict(pol.tenant_budgets or {}),
        trace_decisions=opts.trace_level == "decisions",
        counterfactual_k=min(opts.counterfactual_k, opts.num_instances),  # k > n adds nothing
        hooks=hooks,
        latency_code=latency.code,
        latency_params=latency.params,
        alpha=alpha,
        output_token_time=int(output_token_processing_time(latency.code, alpha)),
        post_decode_overhead=int(post_decode_fixed_overhead(latency.code, alpha)),
        # the reference hashes every block output tokens fill; a later request can match one
        # only if its input repeats that output: rounds of an accumulating multi-turn client,
        # open loop (pre-generated) or closed loop (follow-ups built at completion)
        hash_decode_blocks=outputs_reenter or bool(sessions and any(
            bp.context_growth == "accumulate" for bp in sessions.blueprints)),
    )
    # diagnostics of a run that passed every check (a refused run prints only its error)
    for msg in latency.warnings:
        log.warning(msg)
    for msg in latency.infos:
        log.info(msg)
    log.info("Policy config: admission=%s, routing=%s, priority=%s, scheduler=%s",
             pol.admission, pol.routing, pol.priority, pol.scheduler)
    if pol.routing == "weighted":
        active = pol.scorers or DEFAULT_SCORERS
        log.info("Weighted routing scorers: %s",
                 ", ".join(f"{name}:{weight:.1f}" for name, weight in active))
    return Prepared(opts=opts, latency=latency, table=table, engine=engine, policies=pol,
                    sessions=sessions)


def instance_metrics(res: SimulationResult, table: RequestTable) -> list[InstanceMetrics]:
    """Per-instance metrics objects for the report (ENG-7, CLU-7.1)."""
    cfg = res.config
    out: list[InstanceMetrics] = []
    ended = res.sim_ended_us
    otp = cfg.output_token_time
    for i in range(cfg.num_instances):
        c = res.counters[i]
        mine = res.instance == i
        ttft = res.ttft_us[mine & (res.ttft_us >= 0)].astype(np.float64)
        e2e = res.e2e_us[mine & (res.e2e_us >= 0)].astype(np.float64)
        sched = res.sched_delay_us[mine & (res.sched_delay_us >= 0)].astype(np.int64)
        steps = (res.step_instance == i) & (res.step_itl_count > 0)
        out.append(InstanceMetrics(
            completed=int(c[InstanceCounter.COMPLETED]),
            still_queued=int(res.still_queued[i]),
            still_running=int(res.still_running[i]),
            dropped_unservable=int(c[InstanceCounter.DROPPED]),
            timed_out=int(c[InstanceCounter.TIMED_OUT]),
            length_capped=int(c[InstanceCounter.LENGTH_CAPPED]),
            total_input_tokens=int(c[InstanceCounter.IN_TOKENS]),
            total_output_tokens=int(c[InstanceCounter.OUT_TOKENS]),
            preemption_count=int(c[InstanceCounter.PREEMPTIONS]),
            kv_allocation_failures=int(c[InstanceCounter.KV_FAILURES]),
            sim_ended_time_us=int(ended[i]),
            ttft_us=ttft,
            e2e_us=e2e,
            scheduling_delay_us=sched,
            itl_values_us=res.step_duration[steps] + otp,
            itl_counts=res.step_itl_count[steps],
            wait_queue_len_sum=int(res.wait_queue_sum[i, 0]),
            wait_queue_len_steps=int(res.wait_queue_sum[i, 1]),
            cache_hit_rate=float(res.cache_hit_rate[i]),
            kv_thrashing_rate=float(res.thrashing_rate[i]),
        ))
    return out


def request_columns(res: SimulationResult, table: RequestTable) -> RequestColumns:
    """Per-request records of every request registered at an instance (ENG-7.6, CLU-7.24)."""
    rows = np.flatnonzero(res.registered == 1)
    completed = res.state[rows] == RequestState.COMPLETED
    out_len = table.output_len[rows]
    capped = res.length_capped[rows] == 1
    n_itl = np.where(capped, res.itl_count[rows], out_len)
    denom = np.maximum(n_itl - 1, 1).astype(np.float64)
    itl = res.itl_sum_us[rows].astype(np.float64) / denom
    itl = np.where(out_len > 0, itl, 0.0)
    itl = np.where(completed, itl, np.nan)
    ttft = res.ttft_us[rows]
    e2e = res.e2e_us[rows]
    clients = table.clients
    cidx = table.client_idx[rows]

    def meta(key: str) -> np.ndarray:
        values = np.array([str(c.get(key, "") or "") for c in clients] or [""], dtype=object)
        return values[cidx] if len(clients) else np.full(len(rows), "", dtype=object)

    return RequestColumns(
        request_id=np.array(table.id_strings(), dtype=object)[rows],
        arrival_us=table.arrival_us[rows],
        num_prefill_tokens=table.input_len[rows],
        num_decode_tokens=out_len,
        ttft_us=np.where(ttft >= 0, ttft.astype(np.float64), np.nan),
        itl_us=itl,
        e2e_us=np.where(e2e >= 0, e2e.astype(np.float64), np.nan),
        scheduling_delay_us=res.sched_delay_us[rows].astype(np.int64),
        handled_by=res.instance[rows].astype(np.int32),
        slo_class=meta("slo_class"),
        tenant_id=meta("tenant_id"),
        model=meta("model"),
        length_capped=capped,
    )


def trace_outcome(res: SimulationResult, n: int | None = None) -> TraceOutcome:
    """Per-request status/TTFT/ITL sums for the trace v2 export (WL-9.5) of the first ``n``
    requests (default: all)."""
    state = res.state[:n]
    status = np.full(state.shape[0], 2, dtype=np.int8)
    status[state == RequestState.COMPLETED] = 0
    status[state == RequestState.TIMED_OUT] = 1
    return TraceOutcome(status=status, ttft_us=res.ttft_us[:n].astype(np.int64),
                        itl_sum_us=res.itl_sum_us[:n].astype(np.int64))


def execute_run(opts: RunOptions, hooks: Hooks | None = None) -> RunResult:
    """Validate, simulate and produce every requested output of one ``blis run``."""
    return _execute(opts, hooks, replay=False)


def execute_replay(opts: RunOptions, hooks: Hooks | None = None) -> RunResult:
    """``blis replay``: simulate a trace's requests (WL-9.7); same outputs, replay variants."""
    return _execute(opts, hooks, replay=True)


INPUT_FLAGS = (("defaults_filepath", "--defaults-filepath"), ("policy_config", "--policy-config"),
               ("workload_spec", "--workload-spec"), ("trace_header", "--trace-header"),
               ("trace_data", "--trace-data"), ("hardware_config", "--hardware-config"))
"""Options naming input files: no output may overwrite one of them."""


def plan_outputs(opts: RunOptions, replay: bool) -> OutputPlan:
    """Check every output path of the run before anything is generated or simulated."""
    plan = OutputPlan()
    plan.add_inputs((flag, str(getattr(opts, name) or "")) for name, flag in INPUT_FLAGS)
    if opts.model_config_folder:
        plan.add_inputs([("--model-config-folder",
                          os.path.join(opts.model_config_folder, "config.json"))])
    if opts.metrics_path and opts.results_path and (
            os.path.realpath(opts.metrics_path) != os.path.realpath(opts.results_path)):
        _fail("--metrics-path and --results-path are two names of one output; give one of them "
              f"(got {opts.metrics_path!r} and {opts.results_path!r})")
    if replay and opts.results_path:
        plan.check_file(opts.results_path, "--results-path")
    elif opts.metrics_path or opts.results_path:
        flag = "--metrics-path" if opts.metrics_path else "--results-path"
        plan.check_file(opts.metrics_path or opts.results_path, flag)
    if opts.trace_output:
        plan.check_file(opts.trace_output + ".yaml", "--trace-output")
        plan.check_file(opts.trace_output + ".csv", "--trace-output")
    if opts.output_dir:
        plan.check_dir(opts.output_dir, "--output-dir")
        if os.path.isdir(opts.output_dir):
            for name in ("summary.parquet", "requests.parquet", "decisions.parquet"):
                plan.check_file(os.path.join(opts.output_dir, name), "--output-dir")
    return plan


def _execute(opts: RunOptions, hooks: Hooks | None, replay: bool) -> RunResult:
    _setup_logging(opts.log)
    outputs = plan_outputs(opts, replay)
    prepared = prepare(opts, hooks, replay=replay)
    started = time.perf_counter()
    res = run_engine(prepared.table, prepared.engine, model=prepared.latency.model,
                     sessions=prepared.sessions)
    log.info("Simulation wall-clock time: %.3fs", time.perf_counter() - started)
    table = res.table  # the pre-generated requests, then any closed-loop follow-ups
    instances = instance_metrics(res, table)
    requests = request_columns(res, table)
    aggregate = aggregate_instances(instances)
    per_instance = [build_metrics_output(f"instance_{i}", m) for i, m in enumerate(instances)]
    summary = build_metrics_output("cluster", aggregate)
    report = ClusterReport(
        instances=instances,
        requests=requests,
        admission_rejections=res.rejected_admission,
        routing_rejections=res.rejected_routing,
        shed_by_tier=_shed_by_tier(res, table),
        priority_policy=prepared.policies.priority,
        fitness_weights="" if replay else opts.fitness_weights,
        trace_summary=_trace_summary(res) if opts.summarize_trace else None,
        aggregate=aggregate,
        metrics_outputs=[*per_instance, summary],
        subcommand="replay" if replay else "run",
    )
    stdout = render_report(report)
    with outputs:  # every output staged, then moved into place; any failure removes them all
        _stage_outputs(outputs, opts, replay, prepared, res, summary, requests)
        outputs.commit()
    return RunResult(stdout=stdout, summary=summary, per_instance=per_instance,
                     requests=requests, simulation=res, prepared=prepared)


def _stage_outputs(plan: OutputPlan, opts: RunOptions, replay: bool, prepared: Prepared,
                   res: SimulationResult, summary: dict, requests: RequestColumns) -> None:
    """Write every requested output file to its temporary place (``plan.commit`` publishes)."""
    if opts.trace_output and replay:
        # a replay exports the requests it injected, in injection order (DELTA-64/65)
        files = trace_v2_files(opts.trace_output, prepared.table,
                               trace_outcome(res, prepared.table.n), replayed=True)
    elif opts.trace_output:
        files = trace_v2_files(opts.trace_output, res.table, trace_outcome(res))
    else:
        files = []
    for path, text in files:
        plan.stage_text(path, "--trace-output", text)
    if replay and opts.results_path:
        plan.stage_text(opts.results_path, "--results-path", replay_results_text(requests))
    elif opts.metrics_path or opts.results_path:
        flag = "--metrics-path" if opts.metrics_path else "--results-path"
        plan.stage_text(opts.metrics_path or opts.results_path, flag,
                        results_text(summary, requests))
    if opts.output_dir:
        import pyarrow.parquet as pq

        from blis_fast.output.parquet import requests_table, summary_table

        tables = [("summary.parquet", summary_table(summary)),
                  ("requests.parquet", requests_table(requests))]
        if res.decisions is not None:
            from blis_fast.output.decisions import decision_columns
            from blis_fast.output.parquet import decisions_table

            tables.append(("decisions.parquet", decisions_table(
                decision_columns(res.decisions, prepared.policies.routing))))
        out_dir = plan.make_dir(opts.output_dir, "--output-dir")
        for name, tab in tables:
            plan.stage(out_dir / name, "--output-dir",
                       lambda tmp, tab=tab: pq.write_table(tab, tmp))


def _trace_summary(res: SimulationResult):
    """The --summarize-trace section's numbers (CLU-6.5), when tracing was on."""
    if res.decisions is None:
        return None
    d = res.decisions
    return summarize_trace(d.admitted, d.routing_target, d.routing_regret)


def _shed_by_tier(res: SimulationResult, table: RequestTable) -> dict[str, int]:
    """Admission rejections per SLO class (DELTA-11); only reject-all exists so far."""
    if res.rejected_admission == 0:
        return {}
    rejected = res.registered == Registration.REJECTED_ADMISSION
    counts: dict[str, int] = {}
    for idx in np.flatnonzero(rejected):
        client = table.clients[table.client_idx[idx]] if table.clients else {}
        tier = str(client.get("slo_class", "") or "") or "standard"
        counts[tier] = counts.get(tier, 0) + 1
    return counts
