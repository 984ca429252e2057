"""``blis observe``: send a generated workload to a real server and record a trace (OBS-1..8).

Flags, their defaults and the order of the checks are the April reference's (``--min-tokens``,
no prewarm/goodput flags), plus the August reference's ``--scrape-kv-metrics`` family
(KVO-11.3, ``observe.kv_metrics``). Every check runs before anything is sent or written; a
refusal is one ``BlisConfigError``/``BlisInputError`` line (exit 2 from the CLI). The run
itself never fails on server behaviour: failures become trace rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from blis_fast.cli_options import GroupedHelpCommand, row_option
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.gonum import INT64_MAX
from blis_fast.options import LOG_LEVELS, OPTIONS_BY_FIELD, OPTIONS_BY_FLAG, OptionSpec

if TYPE_CHECKING:  # the CLI imports this module at start-up: keep aiohttp/numba out of it
    from blis_fast.observe.client import RealClient
    from blis_fast.observe.orchestrator import DispatchResult, Job
    from blis_fast.workload.trace_v2 import ObservedKVMetrics

log = logging.getLogger("blis_fast.observe")

RATIO_TIMEOUT_S = 30.0


# ---- the flags ----------------------------------------------------------------------------
OBSERVE_GROUP = "blis observe: the server, the requests, the trace"
"""The heading of observe's own flags in ``blis observe --help``."""


def _own(flag: str, kind: str, default: object, help_text: str, file: str = "",
         group: str = OBSERVE_GROUP) -> OptionSpec:
    """A flag of ``blis observe`` alone (or one whose meaning differs from ``blis run``'s)."""
    return OptionSpec(flag, kind, default, help_text, file=file, group=group)


OBSERVE_OPTIONS: tuple[OptionSpec, ...] = (
    _own("server-url", "str", "", "Inference server URL (required)"),
    _own("trace-header", "str", "", "Output path of the trace v2 header YAML (required)",
         file="output"),
    _own("trace-data", "str", "", "Output path of the trace v2 data CSV (required)",
         file="output"),
    _own("api-key", "str", "", "Bearer token"),
    _own("server-type", "str", "vllm", "Server type (recorded in the header)"),
    _own("api-format", "str", "completions",
         "completions (/v1/completions) or chat (/v1/chat/completions)"),
    _own("min-tokens", "int", 0, "min_tokens sent with every request (0 = omit)"),
    _own("timeout", "int", 300, "Per-request HTTP timeout in seconds (whole exchange)"),
    _own("max-concurrency", "int", 256, "Most requests in flight at once"),
    _own("warmup-requests", "int", 0, "First dispatched requests to leave out of the trace"),
    _own("rtt-ms", "float", 0.0, "Measured network round-trip time (recorded in the header)"),
    _own("drain-timeout", "float", 10.0,
         "After Ctrl-C, seconds to let in-flight requests finish before aborting them"),
    _own("no-streaming", "bool", False, "Never stream (stream false on every request)"),
    _own("unconstrained-output", "bool", False,
         "Do not bound the output length with max_tokens"),
    _own("record-itl", "bool", False, "Write per-chunk timestamps to the ITL CSV"),
    _own("itl-output", "str", "", "ITL CSV path [default: <trace-data minus .csv>.itl.csv]",
         file="output"),
    _own("output-dir", "str", "", "Also write observed_requests.parquet here", file="output"),
    _own("scrape-kv-metrics", "bool", False,
         "Read the server's Prometheus /metrics before and after the workload and record its "
         "KV-cache hit rate over that window in the trace header (observed_kv_metrics, for "
         "blis calibrate --sim-metrics); a failed scrape only warns"),
    _own("vllm-commit", "str", "",
         "The vLLM commit the server runs, recorded in observed_kv_metrics (with "
         "--scrape-kv-metrics)"),
    _own("kv-metrics-url", "str", "",
         "Prometheus endpoint to scrape [default: <server-url>/metrics] (with "
         "--scrape-kv-metrics)"),
    _own("quality-columns", "bool", False,
         "Append blis_fast's burst, not_streamed, client_late and client_lag_us columns to "
         "the trace CSV (the reference's 27 columns are unchanged without it)"),
    _own("workload", "str", "",
         "Workload preset (chatbot, summarization, contentgen, multidoc); needs --rate",
         group="Workload"),
    _own("think-time-dist", "str", "",
         "Think-time distribution, e.g. constant:value=500ms (needs --concurrency)",
         group="Workload"),
    *(OPTIONS_BY_FLAG[flag] for flag in (
        "model", "defaults-filepath", "seed", "horizon", "workload-spec", "rate",
        "num-requests", "concurrency", "think-time-ms", "prefix-tokens", "prompt-tokens",
        "prompt-tokens-stdev", "prompt-tokens-min", "prompt-tokens-max", "output-tokens",
        "output-tokens-stdev", "output-tokens-min", "output-tokens-max")),
)
"""Every flag of ``blis observe``: its own rows, then the ``blis run`` rows it shares (the
same help, type and checks of the value; defaults below where the reference's differ)."""

OBSERVE_DEFAULTS: dict[str, tuple[object, str]] = {
    "rate": (0.0, "give it, --concurrency or --workload-spec"),
    "horizon": (0, "the spec's, else unlimited"),
    "num-requests": (0, "the spec's, else unlimited"),
}
"""The reference's ``blis observe`` defaults of shared flags that differ from ``blis run``'s,
with what the default means."""


def observe_default(flag: str) -> Any:
    """The default of one ``blis observe`` flag: OBSERVE_DEFAULTS', else its row's."""
    if flag in OBSERVE_DEFAULTS:
        return OBSERVE_DEFAULTS[flag][0]
    return next(spec.default for spec in OBSERVE_OPTIONS if spec.flag == flag)


@dataclass
class ObserveOptions:
    """The flags of ``blis observe`` (April reference names; each default is
    :func:`observe_default`'s) plus ``given``."""

    server_url: str = observe_default("server-url")
    model: str = observe_default("model")
    trace_header: str = observe_default("trace-header")
    trace_data: str = observe_default("trace-data")
    workload_spec: str = observe_default("workload-spec")
    workload: str = observe_default("workload")
    defaults_filepath: str = observe_default("defaults-filepath")
    rate: float = observe_default("rate")
    concurrency: int = observe_default("concurrency")
    think_time_ms: int = observe_default("think-time-ms")
    think_time_dist: str = observe_default("think-time-dist")
    seed: int = observe_default("seed")
    horizon: int = observe_default("horizon")
    num_requests: int = observe_default("num-requests")
    prompt_tokens: int = observe_default("prompt-tokens")
    prompt_tokens_stdev: int = observe_default("prompt-tokens-stdev")
    prompt_tokens_min: int = observe_default("prompt-tokens-min")
    prompt_tokens_max: int = observe_default("prompt-tokens-max")
    output_tokens: int = observe_default("output-tokens")
    output_tokens_stdev: int = observe_default("output-tokens-stdev")
    output_tokens_min: int = observe_default("output-tokens-min")
    output_tokens_max: int = observe_default("output-tokens-max")
    prefix_tokens: int = observe_default("prefix-tokens")
    api_key: str = observe_default("api-key")
    server_type: str = observe_default("server-type")
    api_format: str = observe_default("api-format")
    no_streaming: bool = observe_default("no-streaming")
    unconstrained_output: bool = observe_default("unconstrained-output")
    min_tokens: int = observe_default("min-tokens")
    timeout: int = observe_default("timeout")
    max_concurrency: int = observe_default("max-concurrency")
    warmup_requests: int = observe_default("warmup-requests")
    rtt_ms: float = observe_default("rtt-ms")
    record_itl: bool = observe_default("record-itl")
    itl_output: str = observe_default("itl-output")
    output_dir: str = observe_default("output-dir")
    quality_columns: bool = observe_default("quality-columns")
    scrape_kv_metrics: bool = observe_default("scrape-kv-metrics")
    vllm_commit: str = observe_default("vllm-commit")
    kv_metrics_url: str = observe_default("kv-metrics-url")
    drain_timeout: float = observe_default("drain-timeout")
    given: frozenset[str] = frozenset()

    def is_given(self, name: str) -> bool:
        return name in self.given


def _fail(msg: str) -> None:
    raise BlisConfigError(msg)


def validate_flags(o: ObserveOptions) -> None:
    """The flag checks of ``runObserve`` in the reference's order (OBS-1.2, April level)."""
    for flag, value in (("server-url", o.server_url), ("model", o.model),
                        ("trace-header", o.trace_header), ("trace-data", o.trace_data)):
        if not value:
            _fail(f"--{flag} is required")
    if o.itl_output and not o.record_itl:
        log.warning("--itl-output is set but --record-itl is not enabled; no ITL data will be written")
    if not o.workload and not o.workload_spec and not o.is_given("rate") and o.concurrency <= 0:
        _fail("Either --workload, --workload-spec, --rate, or --concurrency is required")
    if o.workload:
        if o.workload_spec:
            _fail("--workload and --workload-spec are mutually exclusive")
        if o.concurrency > 0:
            _fail("--workload and --concurrency are mutually exclusive; use --workload-spec with "
                  "clients[].concurrency for closed-loop preset workloads")
        if not o.is_given("rate"):
            _fail(f'--workload "{o.workload}" requires --rate (preset synthesis needs a request rate)')
    if o.concurrency > 0 and o.is_given("rate"):
        _fail("--concurrency and --rate are mutually exclusive; use one or the other")
    if o.concurrency < 0:
        _fail(f"--concurrency must be >= 0, got {o.concurrency}")
    if o.think_time_ms < 0:
        _fail(f"--think-time-ms must be >= 0, got {o.think_time_ms}")
    if o.is_given("think_time_ms") and o.is_given("think_time_dist"):
        _fail("--think-time-ms and --think-time-dist are mutually exclusive")
    if o.think_time_dist and o.concurrency <= 0:
        _fail("--think-time-dist requires --concurrency")
    if o.max_concurrency <= 0:
        _fail(f"--max-concurrency must be > 0, got {o.max_concurrency}")
    if o.warmup_requests < 0:
        _fail(f"--warmup-requests must be >= 0, got {o.warmup_requests}")
    if o.is_given("rate"):
        from blis_fast.workload.synthesis import validate_rate  # lazy: not for blis --help

        validate_rate(o.rate)
    if o.api_format not in ("completions", "chat"):
        _fail(f"--api-format must be 'completions' or 'chat', got \"{o.api_format}\"")
    if not (o.rtt_ms >= 0 and math.isfinite(o.rtt_ms)):
        _fail(f"--rtt-ms must be a finite value >= 0, got {o.rtt_ms:g}")
    if o.min_tokens < 0:
        _fail(f"--min-tokens must be >= 0, got {o.min_tokens}")
    if o.timeout <= 0 or o.timeout > 86400:
        _fail(f"--timeout must be between 1 and 86400 seconds (1 day), got {o.timeout}")
    if not (o.drain_timeout >= 0 and math.isfinite(o.drain_timeout)):
        _fail(f"--drain-timeout must be a finite value >= 0, got {o.drain_timeout:g}")
    _check_kv_metrics_flags(o)
    if (o.min_tokens > 0 and not o.unconstrained_output and not o.workload_spec
            and not o.workload and o.is_given("output_tokens")
            and o.min_tokens > o.output_tokens):
        _fail(f"--min-tokens ({o.min_tokens}) exceeds --output-tokens ({o.output_tokens}); "
              "min_tokens must be <= the output-token mean")
    # Project addition: refuse unwritable destinations now rather than after the run.
    _output_plan(o)


def _check_kv_metrics_flags(o: ObserveOptions) -> None:
    """``--kv-metrics-url`` must be an http(s) URL with a host (the reference would only warn
    at the first scrape); ``--vllm-commit``/``--kv-metrics-url`` without
    ``--scrape-kv-metrics`` do nothing, and say so."""
    if o.kv_metrics_url:
        from urllib.parse import urlsplit  # lazy: not for blis --help

        try:
            parts = urlsplit(o.kv_metrics_url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:
            ok = False
        if not ok:
            _fail(f"--kv-metrics-url must be an http:// or https:// URL with a host, got "
                  f"{o.kv_metrics_url!r}")
    unused = [f"--{flag}" for flag, value in (("vllm-commit", o.vllm_commit),
                                              ("kv-metrics-url", o.kv_metrics_url)) if value]
    if unused and not o.scrape_kv_metrics:
        log.warning(f"{' and '.join(unused)} without --scrape-kv-metrics: ignored (nothing is "
                    "scraped)")


def _output_plan(o: ObserveOptions):
    """The checked output paths of one observation (``blis_fast.files.OutputPlan``): every
    file's folder exists and takes a file, none is a directory or one of the inputs."""
    from blis_fast.files import OutputPlan  # lazy: not for blis --help

    plan = OutputPlan()
    plan.add_inputs([("--workload-spec", o.workload_spec),
                     ("--defaults-filepath", o.defaults_filepath)])
    plan.check_file(o.trace_header, "--trace-header")
    plan.check_file(o.trace_data, "--trace-data")
    if o.record_itl:
        plan.check_file(_itl_path(o), "--itl-output")
    if o.output_dir:
        plan.check_dir(o.output_dir, "--output-dir", files=("observed_requests.parquet",))
    return plan


def _itl_path(o: ObserveOptions) -> str:
    from blis_fast.observe.output import default_itl_path  # lazy: not for blis --help

    return o.itl_output or default_itl_path(o.trace_data)


@dataclass
class Workload:
    """What the dispatch loop needs from workload generation."""

    jobs: list[Job]
    seed: int
    group_lengths: dict[str, int]
    driver: object | None
    blueprint_jobs: list[Job]
    header_spec: str


def _warn_adapters_ignored(spec) -> None:
    """LORA-1.12: observe sends no adapter id; a spec that names adapters is told so."""
    if any(c.adapter for c in (*spec.clients, *spec.cohorts)):
        log.warning("workload spec declares LoRA adapter fields, but `blis observe` does not model "
                    "the LoRA control plane (the target server manages adapter loading); adapter "
                    "ids are ignored here. Use `blis run`/`blis replay` with --lora-config for "
                    "adapter-aware simulation.")


def build_workload(o: ObserveOptions) -> Workload:
    """Workload from a spec, a preset, or the distribution/concurrency flags (OBS-2)."""
    import numpy as np

    from blis_fast.config.defaults import load_defaults  # lazy: not for blis --help
    from blis_fast.data import data_path  # lazy: not for blis --help
    from blis_fast.engine.sessions import SessionDriver  # lazy: not for blis --help
    from blis_fast.observe.client import DEFAULT_MAX_OUTPUT_TOKENS  # lazy: not for blis --help
    from blis_fast.observe.orchestrator import Job  # lazy: not for blis --help
    from blis_fast.observe.prompts import group_lengths  # lazy: not for blis --help
    from blis_fast.workload.expand import expand_sources  # lazy: not for blis --help
    from blis_fast.workload.generator import generate_workload  # lazy: not for blis --help
    from blis_fast.workload.samplers import parse_think_time_dist  # lazy: not for blis --help
    from blis_fast.workload.spec_yaml import load_workload_spec  # lazy: not for blis --help
    from blis_fast.workload.synthesis import (  # lazy: not for blis --help
        DistributionParams,
        lookup_preset,
        synthesize_concurrency,
        synthesize_from_distribution,
        synthesize_from_preset,
        validate_distribution_params,
        workload_source,
    )

    think_sampler = None
    if o.is_given("think_time_dist"):
        try:
            think_sampler = parse_think_time_dist(o.think_time_dist)
        except (BlisConfigError, BlisInputError, ValueError) as exc:
            raise BlisConfigError(f"--think-time-dist: {exc}") from None
    header_spec = ""
    source = workload_source(o, distribution="")
    if source == "spec":
        if o.concurrency > 0:
            _fail("--concurrency cannot be used with --workload-spec; define concurrency in the "
                  "spec file using clients[].concurrency instead")
        try:
            spec = load_workload_spec(o.workload_spec)
        except BlisInputError as exc:
            raise BlisInputError(f"Failed to load workload spec: {exc}") from None
        if o.is_given("seed"):
            spec.seed = o.seed
        header_spec = o.workload_spec
    elif source == "preset":
        path = o.defaults_filepath or str(data_path("defaults.yaml"))
        if not os.path.exists(path):
            raise BlisInputError(
                "--workload requires a defaults.yaml with preset definitions; file not found "
                f'at "{path}" — use --defaults-filepath to specify its location')
        preset = lookup_preset(load_defaults(path).workloads, o.workload)
        spec = synthesize_from_preset(preset, o.rate, o.num_requests, seed=o.seed)
        header_spec = "preset:" + o.workload
    else:
        params = DistributionParams.from_flags(o)
        validate_distribution_params(params)
        if source == "concurrency":
            spec = synthesize_concurrency(params, o.concurrency, o.think_time_ms,
                                          num_requests=o.num_requests, seed=o.seed)
        else:
            spec = synthesize_from_distribution(params, seed=o.seed)
    _warn_adapters_ignored(spec)
    horizon = INT64_MAX
    if o.is_given("horizon") and o.horizon > 0:
        horizon = o.horizon
    elif spec.horizon > 0:
        horizon = spec.horizon
    max_requests = spec.num_requests
    if o.is_given("num_requests") and o.num_requests > 0:
        max_requests = o.num_requests
    _check_bounded(o, max_requests, horizon)
    try:
        wl = generate_workload(spec, horizon=horizon, max_requests=max_requests,
                               keep_token_ids=True)
    except BlisInputError as exc:
        raise BlisInputError(f"Failed to generate workload: {exc}") from None
    table = wl.table
    log.info("Generated %d requests", table.n)
    if table.n == 0:
        log.warning("No requests generated — writing empty trace")
    blueprints = wl.sessions
    if think_sampler is not None:
        blueprints = [replace(b, think_sampler=think_sampler) for b in blueprints]
    clamp = o.min_tokens > 0 and not o.unconstrained_output
    jobs = []
    for i in range(table.n):
        c = table.clients[int(table.client_idx[i])]
        mx = int(table.max_output_len[i])
        if clamp and (mx if mx > 0 else DEFAULT_MAX_OUTPUT_TOKENS) < o.min_tokens:
            mx = o.min_tokens
        jobs.append(Job(
            arrival_us=int(table.arrival_us[i]), ids=wl.input_ids[i], max_output_len=mx,
            prefix_length=int(table.prefix_length[i]), prefix_group=str(c["prefix_group"]),
            streaming=bool(c["streaming"]) or o.record_itl, client_id=str(c["id"]),
            tenant_id=str(c["tenant_id"]), slo_class=str(c["slo_class"]), model=str(c["model"]),
            deadline_us=int(table.deadline_us[i]), session_id=table.session_id(i),
            round_index=int(table.round_index[i]),
        ))
    driver = None
    bp_jobs: list[Job] = []
    if blueprints:
        log.info("Generated %d session blueprints (closed-loop)", len(blueprints))
        driver = SessionDriver(blueprints, wl.follow_up_budget, table.block_size)
        index = {b.session_id: k for k, b in enumerate(blueprints)}
        for j in jobs:
            j.blueprint = index.get(j.session_id, -1) if j.session_id else -1
        bp_jobs = [Job(0, np.zeros(0, dtype=np.int64), 0, 0, "", False, b.client_id,
                       b.tenant_id, b.slo_class, b.model, 0) for b in blueprints]
    groups = group_lengths(expand_sources(spec).clients)
    return Workload(jobs, int(spec.seed), groups, driver, bp_jobs, header_spec)


OBSERVE_REQUEST_BYTES = 1024
"""Bytes observe holds per request besides the table row and token ids (its job, the row it
records)."""


def _check_bounded(o: ObserveOptions, max_requests: int, horizon: int) -> None:
    """Refuse, before generating, an unbounded workload, and a request count whose rows and
    kept token ids cannot fit in memory (``blis run``'s check, with observe's per-request
    objects)."""
    from blis_fast.runner import REQUEST_BYTES, refuse_over_memory  # lazy: not for blis --help

    if max_requests <= 0 and horizon == INT64_MAX:
        _fail("Workload requires either num_requests, --num-requests, or --horizon to bound "
              "generation")
    reqs = max(max_requests, 0)
    tokens = 0 if o.workload_spec else max(o.prompt_tokens, 0) + max(o.prefix_tokens, 0)
    flag = ("--workload-spec" if o.workload_spec and not o.is_given("num_requests")
            else "--num-requests")
    refuse_over_memory({flag: reqs * (REQUEST_BYTES + OBSERVE_REQUEST_BYTES
                                                  + 8 * tokens)}, f"{reqs} requests")


async def _measure_ratio(client: RealClient) -> float:
    """Token-ratio request (OBS-3.2): 100 vocabulary words, ``max_tokens`` 1."""
    import asyncio

    from blis_fast.observe.client import PendingRequest  # lazy: not for blis --help
    from blis_fast.observe.prompts import RATIO_PROMPT, VOCABULARY  # lazy: not for blis --help

    rec = await client.send(PendingRequest(request_id=-1, input_tokens=0, max_output_tokens=1,
                                           prompt=RATIO_PROMPT, streaming=False),
                            timeout_s=min(RATIO_TIMEOUT_S, client.timeout_s))
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        # Ctrl-C during the probe: the reference has no handler yet and dies of the signal;
        # send() recorded the cancellation, so raise it again: asyncio.run then raises
        # KeyboardInterrupt (exit 130) and nothing is sent or written
        raise asyncio.CancelledError
    words = len(VOCABULARY)
    fallback = "using 1:1 word-to-token ratio"
    if rec.status != "ok":
        msg = rec.error_message or f"status={rec.status}"
        log.warning("Prefix token calibration failed (%s); %s", msg, fallback)
        return 1.0
    if rec.server_input_tokens <= 0:
        log.warning("Prefix token calibration failed (server returned 0 prompt_tokens — check "
                    "that usage reporting is enabled); %s", fallback)
        return 1.0
    ratio = rec.server_input_tokens / words
    if ratio < 1.0 or ratio > 3.0:
        log.warning("Prefix token calibration ratio %.3f outside expected range [1.0, 3.0]; "
                    "using 1:1 fallback", ratio)
        return 1.0
    log.info("Prefix token calibration: %d words → %d server tokens (%.3f tokens/word)",
             words, rec.server_input_tokens, ratio)
    return ratio


@dataclass
class ObserveResult:
    """What a run produced (for the API and tests)."""

    result: DispatchResult
    tokens_per_word: float
    wall_s: float
    observed_kv: ObservedKVMetrics | None = None  # --scrape-kv-metrics' header block


async def _observe(o: ObserveOptions, w: Workload) -> ObserveResult:
    from blis_fast.observe import kv_metrics  # lazy: not for blis --help
    from blis_fast.observe.client import RealClient  # lazy: not for blis --help
    from blis_fast.observe.orchestrator import (  # lazy: not for blis --help
        DispatchConfig,
        Dispatcher,
    )
    from blis_fast.observe.prompts import build_prefixes  # lazy: not for blis --help

    async with RealClient(o.server_url, o.model, o.api_key, o.api_format, o.timeout) as client:
        tpw = await _measure_ratio(client)
        log.info("Calibrated tokens-per-word ratio: %.3f", tpw)
        prefixes = build_prefixes(w.group_lengths, w.seed, tpw) if w.group_lengths else {}
        max_conc = o.max_concurrency
        if o.concurrency > 0 and not o.is_given("max_concurrency"):
            max_conc = o.concurrency
        cfg = DispatchConfig(
            max_concurrency=max_conc, warmup=o.warmup_requests, no_streaming=o.no_streaming,
            unconstrained=o.unconstrained_output, min_tokens=o.min_tokens,
            record_itl=o.record_itl, tokens_per_word=tpw, prefixes=prefixes,
            prefix_lengths=w.group_lengths, grace_s=o.drain_timeout,
        )
        url = kv_metrics.metrics_url(o.server_url, o.kv_metrics_url)
        # KVO-11.3: the window opens after the token-ratio request, just before the workload
        start = await kv_metrics.window_start(client, url) if o.scrape_kv_metrics else None
        t0 = time.perf_counter()
        res = await Dispatcher(client, w.jobs, cfg, w.driver, w.blueprint_jobs).run()
        wall = time.perf_counter() - t0
        log.info("Observation wall-clock time: %.3fs", wall)
        if start is not None and res.interrupted:
            log.warning("observe: --scrape-kv-metrics: the observation was interrupted, so the "
                        "window has no end scrape; the trace header will have no "
                        "observed_kv_metrics")
            start = None
        observed = await kv_metrics.window_end(client, url, start, o.vllm_commit)
        return ObserveResult(res, tpw, wall, observed)


def write_outputs(o: ObserveOptions, w: Workload, r: ObserveResult) -> None:
    """Header, trace CSV, ITL file and Parquet, all renamed into place together (OBS-8)."""
    from blis_fast.observe.output import (  # lazy: not for blis --help
        itl_csv,
        observed_table,
        trace_csv,
        trace_header,
    )

    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with _output_plan(o) as plan:  # all files renamed into place together, or none
        plan.stage_text(o.trace_header, "--trace-header",
                        trace_header(created, o.warmup_requests, w.seed, w.header_spec,
                                     o.server_type, o.model, o.rtt_ms)
                        + ("" if r.observed_kv is None else r.observed_kv.header_text()))
        plan.stage_text(o.trace_data, "--trace-data", trace_csv(r.result.observed,
                                                                 o.quality_columns))
        if o.record_itl:
            if not r.result.itl:
                log.warning("--record-itl was set but no ITL data recorded (non-streaming requests?)")
            plan.stage_text(_itl_path(o), "--itl-output", itl_csv(r.result.itl))
        if o.output_dir:
            import pyarrow.parquet as pq

            folder = plan.make_dir(o.output_dir, "--output-dir")
            from blis_fast.output.provenance import (  # lazy: not for blis --help
                file_provenance,
                options_record,
                with_provenance,
            )

            # the observe options (never --api-key) as a run's files record theirs
            provenance = {**file_provenance("observed_requests", "observe"),
                          "blis_fast.options": json.dumps(options_record(o), sort_keys=True)}
            table = with_provenance(observed_table(r.result.observed, r.result.start_wall_us),
                                    provenance)
            plan.stage(folder / "observed_requests.parquet", "--output-dir",
                       lambda tmp: pq.write_table(table, tmp))
        plan.commit()
    log.info("Trace exported: %d records to %s / %s", len(r.result.observed), o.trace_header,
             o.trace_data)
    report_quality(r)


def report_quality(r: ObserveResult) -> None:
    """Say on stderr which requests cannot teach the simulator about the server, and when
    the client itself ran late (issue 30, ``blis_fast.observe.quality``)."""
    from blis_fast.observe.output import observed_quality  # lazy: not for blis --help
    from blis_fast.observe.quality import lag_warning  # lazy: not for blis --help

    for line in observed_quality(r.result.observed).summary_lines():
        log.warning("observe: %s", line)
    warning = lag_warning(r.result.lag_us)
    if warning:
        log.warning("observe: %s", warning)


def run_observe(o: ObserveOptions) -> ObserveResult:
    """Validate, generate, observe, write. Raises ``BlisError`` for bad input only."""
    import asyncio

    validate_flags(o)
    # observe has no --log: its diagnostics at the default level, whatever an earlier call in
    # this process (blis_fast.run(log="error"), a test) left on the package's logger
    logging.getLogger("blis_fast").setLevel(LOG_LEVELS[OPTIONS_BY_FIELD["log"].default])
    w = build_workload(o)
    r = asyncio.run(_observe(o, w))
    with _signals_ignored():  # a second Ctrl-C must not cut the files short
        write_outputs(o, w, r)
    return r


@contextlib.contextmanager
def _signals_ignored():
    """Ignore SIGINT/SIGTERM for the duration (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _command(func):
    for spec in reversed(OBSERVE_OPTIONS):
        default, note = OBSERVE_DEFAULTS.get(spec.flag, (spec.default, ""))
        func = row_option(spec, parsed=True, default=default, default_note=note)(func)
    return func


def register(group: click.Group) -> None:
    """Add ``observe`` to the ``blis`` command group."""

    @group.command("observe", cls=GroupedHelpCommand)
    @_command
    @click.pass_context
    def observe_command(ctx: click.Context, **raw: object) -> None:
        """Send a workload to a real OpenAI-compatible server and record a trace v2."""
        from click.core import ParameterSource

        given = frozenset(k for k in raw
                          if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE)
        run_observe(ObserveOptions(**raw, given=given))  # type: ignore[arg-type]


__all__ = ["ObserveOptions", "ObserveResult", "build_workload", "register", "run_observe",
           "validate_flags", "write_outputs"]
