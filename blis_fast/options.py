"""The options of ``blis run``: one table shared by the CLI, the Python API and sweeps.

Each row names the flag, its kind (how a command-line string is parsed, with Go's ``strconv``
rules so ``0x10`` or ``NaN`` mean what they mean to the reference), its default (the
reference's defaults, ENG-10.1, CLU-9, DELTA-27), the checks of its own value and, for a flag
the simulation kernel reads as is, the kernel config slot its value is packed into.

Parsed options are a ``RunOptions``: a frozen dataclass generated from the table and checked
in (``blis_fast/run_options.py``, rewritten by ``python -m blis_fast.run_options_codegen``: one
typed attribute per flag under its group's heading, plus the set of flags given explicitly;
loaded on first use and refused if it no longer agrees with the rows).
``check_options(opts, stage)`` runs the rows' checks at one point of the reference's
validation order (DELTA-26), ``CHECK_ORDER`` says which flags are checked at which point;
checks across flags stay in the code that resolves them.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from blis_fast.errors import BlisConfigError
from blis_fast.gonum import INT64_MAX, parse_bool, parse_float, parse_int

if TYPE_CHECKING:
    from blis_fast.run_options import RunOptions

TIME_LIMIT_US = 1 << 61
"""Largest delay or duration accepted (µs): event times stay far from int64 overflow."""
MAX_GPU_HOUR_COST = 1e12
"""Largest price of one GPU-hour (flag or node pool): any run's cost stays a finite float."""
LOG_LEVELS = {
    "trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
    "warn": logging.WARNING, "warning": logging.WARNING, "error": logging.ERROR,
    "fatal": logging.CRITICAL, "panic": logging.CRITICAL,
}
"""``--log`` values (logrus level names) and the Python level each one sets."""
TRACE_LEVELS = ("none", "decisions")
"""``--trace-level`` values (an empty value means ``none`` too)."""
SESSION_MODES = ("fixed", "closed-loop")
"""``--session-mode`` values of ``blis replay``."""
KV_CPU_RELOAD = ("on-failure", "always")
"""``--kv-cpu-reload`` values: when the ``--kv-cpu-blocks`` tier is consulted (KVO-9.1)."""


@dataclass(frozen=True)
class Check:
    """One check of a value: ``passes(value)``, else ``message`` formatted with ``flag`` (the
    flag or key the value came from) and ``value`` (or a function of the two giving the text)."""

    passes: Callable[[Any], bool]
    message: str | Callable[[str, Any], str]

    def error(self, name: str, value: Any) -> str | None:
        """The error text for ``value`` of ``name``, or None when it passes."""
        if self.passes(value):
            return None
        if callable(self.message):
            return self.message(name, value)
        return self.message.format(flag=name, value=value)


def at_least(low: int) -> Check:
    """``value >= low``."""
    return Check(lambda v: v >= low, f"--{{flag}} must be >= {low}, got {{value}}")


def positive() -> Check:
    """``value > 0``."""
    return Check(lambda v: v > 0, "--{flag} must be > 0, got {value}")


def in_time_range(scale: int = 1, unit: str = "") -> Check:
    """``value`` (in units of ``scale`` µs) within TIME_LIMIT_US."""
    return Check(lambda v: v * scale <= TIME_LIMIT_US,
                 f"--{{flag}} {{value}}{unit} is beyond the simulator's time range")


def finite_positive(message: str | Callable[[str, Any], str]
                    = "--{flag} must be a finite value > 0, got {value}") -> Check:
    """A finite ``value > 0`` (NaN fails)."""
    return Check(lambda v: v > 0 and not math.isinf(v), message)


def each_finite_non_negative() -> Check:
    """Every item of a list finite and >= 0 (the first bad item is reported)."""

    def bad_item(values: tuple[float, ...]) -> int:
        return next((i for i, c in enumerate(values)
                     if math.isnan(c) or math.isinf(c) or c < 0), -1)

    return Check(lambda v: bad_item(v) < 0,
                 lambda flag, v: f"--{flag}[{bad_item(v)}] must be a finite non-negative "
                                 f"number, got {v[bad_item(v)]}")


def required(message: str) -> Check:
    """A non-empty value."""
    return Check(bool, message)


def _go_g(v: float) -> str:
    from blis_fast.gofmt import go_g  # lazy: blis --help loads options, not gofmt

    return go_g(v)


def _session_mode_text(flag: str, value: str) -> str:
    from blis_fast.gofmt import go_quote  # lazy: blis --help loads options, not gofmt

    return f'--{flag} must be {" or ".join(map(go_quote, SESSION_MODES))}, got {go_quote(value)}'


@dataclass(frozen=True)
class OptionSpec:
    """One flag of ``blis run``."""

    flag: str
    kind: str  # "int", "float", "floats", "str", "bool"
    default: Any
    help: str
    checks: tuple[Check, ...] = ()
    slot: str = ""  # "<config array>.<kernel constant>" the resolved value is packed into
    choices: str = ""  # the policy family (blis_fast.policies) whose names are the values
    file: str = ""  # "input" (a file read), "input-folder" (holds config.json), "output"
    values: tuple[str, ...] = ()  # the values a text flag takes (its check reads the same list)
    group: str = ""  # the heading the flag is listed under in --help (set by _in_group)

    @property
    def field(self) -> str:
        """The RunOptions attribute holding this flag's value."""
        return self.flag.replace("-", "_")

    def default_text(self, default: Any = None) -> str:
        """The default ``--help`` shows, as the flag's value would be written (``default``,
        else the row's); "" when there is nothing to show: a switch, an empty string, or a
        help text that already says where the default comes from."""
        value = self.default if default is None else default
        if self.kind == "bool" or value == "" or "default" in self.help:
            return ""
        if self.kind == "float":
            return _go_g(value)
        if self.kind == "floats":
            return ",".join(_go_g(v) for v in value)
        return str(value)


def _in_group(group: str, *rows: OptionSpec) -> tuple[OptionSpec, ...]:
    """``rows`` listed under the ``--help`` heading ``group`` (each row then carries it)."""
    return tuple(replace(row, group=group) for row in rows)


_NON_NEGATIVE = at_least(0)
_POSITIVE = positive()
_DELAY = (_NON_NEGATIVE, in_time_range())

RUN_OPTIONS: tuple[OptionSpec, ...] = (
    *_in_group("Model and latency",
        OptionSpec("model", "str", "", "LLM name (required), e.g. meta-llama/llama-3.1-8b-instruct",
                   (required("LLM name not provided (--model). Exiting simulation."),)),
        OptionSpec("hardware", "str", "", "GPU type (default from defaults.yaml)"),
        OptionSpec("tp", "int", 0, "tensor parallelism (default from defaults.yaml)"),
        OptionSpec("vllm-version", "str", "", "vLLM version (default from defaults.yaml)"),
        OptionSpec("latency-model", "str", "roofline", "latency model", choices="latency_backends"),
        OptionSpec("alpha-coeffs", "floats", (0.0, 0.0, 0.0), "alpha coefficients (comma-separated)",
                   (each_finite_non_negative(),)),
        OptionSpec("beta-coeffs", "floats", (0.0, 0.0, 0.0), "beta coefficients (comma-separated)",
                   (each_finite_non_negative(),)),
        OptionSpec("model-config-folder", "str", "", "folder holding the model's config.json",
                   file="input-folder"),
        OptionSpec("hardware-config", "str", "", "hardware_config.json to use", file="input"),
        OptionSpec("gpu-profile", "str", "",
                   "GPU profile JSON of --latency-model profiled (default: the bundled profile "
                   "of --hardware; blis profile writes one)", file="input"),
        OptionSpec("defaults-filepath", "str", "",
                   "defaults.yaml to use (default: the bundled copy)", file="input"),
        OptionSpec("max-model-len", "int", 0, "max sequence length; 0 = derived or unlimited",
                   (_NON_NEGATIVE,), slot="ConfigSlot.MAX_MODEL_LEN"),
        OptionSpec("gpu-memory-utilization", "float", 0.9, "GPU memory fraction for the KV cache",
                   (Check(lambda u: 0 < u <= 1.0,
                          "--{flag} must be a finite value in (0, 1.0], got {value:f}"),)),
    ),
    *_in_group("KV cache and batching",
        OptionSpec("total-kv-blocks", "int", 1_000_000, "KV blocks per instance (default: derived)",
                   (_POSITIVE,)),
        OptionSpec("block-size-in-tokens", "int", 16, "tokens per KV block",
                   (_POSITIVE, Check(lambda v: v <= 1 << 24,
                                     "--{flag} must be <= 16777216 (2^24 tokens), got {value}")),
                   slot="RouterCfg.BLOCK_SIZE"),
        OptionSpec("max-num-running-reqs", "int", 256, "max requests in a running batch",
                   (_POSITIVE,), slot="ConfigSlot.MAX_RUNNING"),
        OptionSpec("max-num-scheduled-tokens", "int", 2048, "token budget per step", (_POSITIVE,),
                   slot="ConfigSlot.MAX_TOKENS"),
        OptionSpec("long-prefill-token-threshold", "int", 0, "chunked-prefill chunk size; 0 = off",
                   (_NON_NEGATIVE,), slot="ConfigSlot.LONG_PREFILL"),
        OptionSpec("kv-cpu-blocks", "int", 0, "CPU-tier KV blocks; > 0 enables tiered KV",
                   (_NON_NEGATIVE,)),
        OptionSpec("kv-offload-threshold", "float", 0.9, "deprecated; validated and ignored",
                   (Check(lambda v: 0 <= v <= 1,
                          "--{flag} must be a finite value in [0, 1], got {value:f}"),)),
        OptionSpec("kv-transfer-bandwidth", "float", 100.0, "CPU->GPU transfer rate (tokens/tick)"),
        OptionSpec("kv-transfer-base-latency", "int", 0, "fixed ticks per reloaded block", _DELAY),
        OptionSpec("kv-cpu-reload", "str", "on-failure",
                   "when the --kv-cpu-blocks tier is read back: on-failure (April: after a "
                   "failed GPU allocation) or always (August #1586: before every allocation)",
                   (Check(lambda v: v in KV_CPU_RELOAD,
                          lambda flag, v: f"--{flag} must be one of "
                                          f"{', '.join(KV_CPU_RELOAD)}, got {v!r}"),),
                   values=KV_CPU_RELOAD),
        OptionSpec("kv-offload-config", "str", "",
                   "YAML file with a top-level kv_offload: block: the August tier chain (CPU "
                   "bytes, secondary fs tiers); excludes --kv-cpu-blocks", file="input"),
    ),
    *_in_group("Simulation",
        OptionSpec("seed", "int", 42, "random seed"),
        OptionSpec("horizon", "int", INT64_MAX,
                   "horizon in ticks (µs): no request arrives later; a simulation stops there",
                   (_POSITIVE,),
                   slot="ConfigSlot.HORIZON"),
        OptionSpec("log", "str", "warn", "log level for stderr diagnostics",
                   (Check(lambda v: v.lower() in LOG_LEVELS,
                          "--{flag}: invalid log level {value!r} (valid: "
                          + ", ".join(LOG_LEVELS) + ")"),), values=tuple(LOG_LEVELS)),
    ),
    *_in_group("Cluster, admission and routing",
        OptionSpec("num-instances", "int", 1, "number of instances",
                   (Check(lambda v: v >= 1, "num-instances must be >= 1"),), slot="ConfigSlot.N_INSTANCES"),
        OptionSpec("admission-policy", "str", "always-admit", "admission policy",
                   choices="admission"),
        OptionSpec("admission-latency", "int", 0, "admission latency (µs)", _DELAY,
                   slot="ConfigSlot.ADMISSION_LATENCY"),
        OptionSpec("routing-latency", "int", 0, "routing latency (µs)", _DELAY,
                   slot="ConfigSlot.ROUTING_LATENCY"),
        OptionSpec("token-bucket-capacity", "float", 10000.0, "token bucket capacity"),
        OptionSpec("token-bucket-refill-rate", "float", 1000.0, "token bucket refill (tokens/s)"),
        OptionSpec("routing-policy", "str", "round-robin", "routing policy", choices="routing"),
        OptionSpec("routing-scorers", "str", "", "weighted-routing scorers, name:weight,..."),
        OptionSpec("priority-policy", "str", "constant", "priority policy", choices="priority"),
        OptionSpec("scheduler", "str", "fcfs", "instance scheduler", choices="scheduler"),
        OptionSpec("policy-config", "str", "", "policy bundle YAML", file="input"),
        OptionSpec("fitness-weights", "str", "", "fitness weights, key:value,..."),
        OptionSpec("trace-level", "str", "none", "decision trace level: none or decisions",
                   (Check(lambda v: v in ("", *TRACE_LEVELS),
                          "--{flag}: unknown value {value!r}. Valid: " + ", ".join(TRACE_LEVELS)),),
                   values=TRACE_LEVELS),
        OptionSpec("counterfactual-k", "int", 0, "counterfactual candidates per routing decision",
                   (_NON_NEGATIVE,), slot="RouterCfg.COUNTERFACTUAL_K"),
        OptionSpec("summarize-trace", "bool", False, "print the decision-trace summary"),
        OptionSpec("snapshot-refresh-interval", "int", 0, "routing snapshot refresh interval (µs)",
                   _DELAY, slot="RouterCfg.REFRESH"),
        OptionSpec("cache-signal-delay", "int", 50_000, "prefix-cache signal delay (µs)", _DELAY,
                   slot="RouterCfg.CACHE_DELAY"),
    ),
    *_in_group("Prefill/decode disaggregation (P/D)",
        OptionSpec("prefill-instances", "int", 0, "P/D: instances of the prefill pool",
                   (_NON_NEGATIVE,)),
        OptionSpec("decode-instances", "int", 0, "P/D: instances of the decode pool",
                   (_NON_NEGATIVE,)),
        OptionSpec("prefill-decode-instances", "int", 0,
                   "P/D: shared-role instances (both pools)", (_NON_NEGATIVE,)),
        OptionSpec("encode-instances", "int", 0, "P/D: instances of the encode pool"),
        OptionSpec("pd-decider", "str", "never", "P/D: which requests are disaggregated",
                   choices="deciders"),
        OptionSpec("pd-prefix-threshold", "int", 16,
                   "P/D prefix-threshold decider: uncached prompt tokens above which a request is "
                   "disaggregated"),
        OptionSpec("pd-transfer-bandwidth", "float", 25.0, "P/D: KV transfer bandwidth (GB/s)"),
        OptionSpec("pd-transfer-base-latency", "float", 0.05,
                   "P/D: fixed latency per KV transfer (ms)"),
        OptionSpec("pd-transfer-contention", "bool", False,
                   "P/D: concurrent KV transfers share the bandwidth"),
        OptionSpec("prefill-routing-scorers", "str", "",
                   "P/D: weighted scorers of the prefill pool, name:weight,..."),
        OptionSpec("decode-routing-scorers", "str", "",
                   "P/D: weighted scorers of the decode pool, name:weight,..."),
        OptionSpec("prefill-tp", "int", 0, "P/D: tensor parallelism of the prefill pool"),
        OptionSpec("decode-tp", "int", 0, "P/D: tensor parallelism of the decode pool"),
        OptionSpec("prefill-hardware", "str", "", "P/D: GPU of the prefill pool"),
        OptionSpec("decode-hardware", "str", "", "P/D: GPU of the decode pool"),
        OptionSpec("prefill-latency-model", "str", "", "P/D: latency model of the prefill pool"),
        OptionSpec("decode-latency-model", "str", "", "P/D: latency model of the decode pool"),
        OptionSpec("prefill-max-model-len", "int", 0, "P/D: max model length of the prefill pool"),
        OptionSpec("decode-max-model-len", "int", 0, "P/D: max model length of the decode pool"),
        OptionSpec("encode-decider", "str", "never", "P/D: which requests go through the encode pool",
                   choices="encode_deciders"),
    ),
    *_in_group("Autoscaler and cost",
        OptionSpec("model-autoscaler-interval-us", "float", 0.0,
                   "autoscaler tick interval (µs); 0 = off unless the policy bundle sets one",
                   (Check(lambda v: v >= 0 and not math.isinf(v),
                          lambda flag, v: f"--{flag} must be a finite number >= 0 (0 = disabled), "
                                          f"got {_go_g(v)}"),
                    Check(lambda v: v == 0 or v >= 1,
                          lambda flag, v: f"--{flag} must be 0 (off) or at least 1 µs, got "
                                          f"{_go_g(v)}: a shorter interval truncates to 0 and the "
                                          "reference ticks forever at one instant"),
                    in_time_range())),
        OptionSpec("gpu-hour-cost", "float", 0.0,
                   "price of one GPU-hour: prints the run's cost (node_pools[].gpu_hour_cost wins)",
                   (Check(lambda v: 0 <= v <= MAX_GPU_HOUR_COST,
                          lambda flag, v: f"--{flag} must be a number between 0 and "
                                          f"{MAX_GPU_HOUR_COST:g}, got {_go_g(v)}"),)),
    ),
    *_in_group("LoRA adapters",
        OptionSpec("lora-config", "str", "",
                   "YAML file with a top-level lora: block (adapter registry, capacity, costs)",
                   file="input"),
        OptionSpec("lora-adapter-capacity", "int", 0,
                   "resident adapter slots per instance (applied only when given)"),
        OptionSpec("lora-load-base-latency-us", "float", 0.0,
                   "fixed cold-load latency (µs; applied only when given, default from "
                   "--lora-config or defaults.yaml)"),
        OptionSpec("lora-load-bandwidth-bytes-us", "float", 0.0,
                   "cold-load bandwidth (bytes/µs; applied only when given, default from "
                   "--lora-config or defaults.yaml)"),
        OptionSpec("lora-footprint-bytes-per-rank", "float", 0.0,
                   "adapter HBM bytes per rank unit (applied only when given, default from "
                   "--lora-config or defaults.yaml)"),
        OptionSpec("lora-scorer-weight", "float", 0.0,
                   "weight of the lora-affinity scorer appended to the weighted profile "
                   "(applied only when given)"),
    ),
    *_in_group("Workload",
        OptionSpec("workload", "str", "distribution", "distribution or a preset name"),
        OptionSpec("workload-spec", "str", "", "workload spec YAML", file="input"),
        OptionSpec("rate", "float", 1.0, "requests per second",
                   (finite_positive(lambda flag, v: f"--{flag} must be a finite value > 0, got "
                                                    f"{_go_g(v)}"),)),
        OptionSpec("num-requests", "int", 100, "number of requests", (_NON_NEGATIVE,)),
        OptionSpec("concurrency", "int", 0, "closed-loop virtual users", (_NON_NEGATIVE,)),
        OptionSpec("think-time-ms", "int", 0, "think time between a response and the next request",
                   (_NON_NEGATIVE, in_time_range(1000))),
        OptionSpec("prefix-tokens", "int", 0, "shared prefix length", (_NON_NEGATIVE,)),
        OptionSpec("prompt-tokens", "int", 512, "mean prompt length"),
        OptionSpec("prompt-tokens-stdev", "int", 256, "prompt length standard deviation"),
        OptionSpec("prompt-tokens-min", "int", 2, "min prompt length"),
        OptionSpec("prompt-tokens-max", "int", 7000, "max prompt length"),
        OptionSpec("output-tokens", "int", 512, "mean output length"),
        OptionSpec("output-tokens-stdev", "int", 256, "output length standard deviation"),
        OptionSpec("output-tokens-min", "int", 2, "min output length"),
        OptionSpec("output-tokens-max", "int", 7000, "max output length"),
        OptionSpec("timeout", "int", 300, "per-request deadline (s); negative disables",
                   (Check(lambda v: v != 0,
                          "--{flag} must be positive (seconds) or negative to disable; got 0"),
                    in_time_range(1_000_000, " s"))),
    ),
    *_in_group("Outputs",
        OptionSpec("trace-output", "str", "", "export the workload as <prefix>.yaml + <prefix>.csv",
                   file="output"),
        OptionSpec("metrics-path", "str", "", "write the summary + per-request JSON here",
                   file="output"),
        OptionSpec("results-path", "str", "", "same as --metrics-path (the older name)",
                   file="output"),
        OptionSpec("output-dir", "str", "", "write summary.parquet and requests.parquet here",
                   file="output"),
    ),
    *_in_group("blis replay",
        OptionSpec("trace-header", "str", "", "replay: the trace v2 header YAML",
                   (required("--trace-header is required"),), file="input"),
        OptionSpec("trace-data", "str", "", "replay: the trace v2 data CSV",
                   (required("--trace-data is required"),), file="input"),
        OptionSpec("session-mode", "str", "fixed",
                   "replay: fixed (trace arrivals) or closed-loop (follow-ups after completions)",
                   (Check(lambda v: v in SESSION_MODES, _session_mode_text),),
                   values=SESSION_MODES),
        OptionSpec("think-time-dist", "str", "",
                   "replay closed-loop: think time, lognormal:mu=..,sigma=..[,min=..,max=..] or "
                   "constant:value=<time>"),
    ),
)

CHECK_ORDER: dict[str, tuple[str, ...]] = {
    "logging": ("log",),
    "start": ("model", "total-kv-blocks"),
    "latency": ("alpha-coeffs", "beta-coeffs", "gpu-memory-utilization", "block-size-in-tokens"),
    "latency-end": ("max-model-len",),
    "workload": ("num-requests", "prefix-tokens", "concurrency", "think-time-ms"),
    "rate": ("rate",),
    "timeout": ("timeout",),
    "replay-inputs": ("trace-header", "trace-data"),
    "replay": ("session-mode",),
    "engine": ("num-instances", "max-num-running-reqs", "max-num-scheduled-tokens",
               "long-prefill-token-threshold", "horizon"),
    "tracing": ("trace-level", "counterfactual-k"),
    "kv-tier": ("kv-cpu-blocks", "kv-offload-threshold", "kv-cpu-reload"),
    "delays": ("kv-transfer-base-latency", "snapshot-refresh-interval", "cache-signal-delay",
               "admission-latency", "routing-latency"),
    "pd": ("prefill-instances", "decode-instances", "prefill-decode-instances"),
    "autoscale": ("model-autoscaler-interval-us", "gpu-hour-cost"),
}
"""Which flags' own checks run at each point of a run's validation (DELTA-26), in order.

The stages are named where ``runner``/``config.latency`` call them: ``logging``; ``start``
(before latency resolution; ``--total-kv-blocks`` early, so the max-model-len cap derived from
it cannot report a confusing error); ``latency`` (after the backend name and the α/β pairing);
``latency-end``; ``workload`` (before the workload source checks); ``rate`` (the distribution
flags or a preset chosen: ``workload.synthesis.validate_rate``, also ``blis observe``'s and
``blis convert preset``'s check); ``timeout`` (after the source checks);
``replay-inputs``/``replay`` (``blis replay``); ``engine`` (after generation); ``tracing``,
``kv-tier`` and ``delays`` (after the policy names; warnings and cross-flag checks sit
between them); ``pd`` (the first P/D checks, ``config/pd.py: validate_pd``); ``autoscale``
(where the reference merges the flag over the bundle's interval)."""

WORKLOAD_FLAGS = frozenset({
    "workload", "workload-spec", "rate", "num-requests", "concurrency", "think-time-ms",
    "prefix-tokens", "prompt-tokens", "prompt-tokens-stdev", "prompt-tokens-min",
    "prompt-tokens-max", "output-tokens", "output-tokens-stdev", "output-tokens-min",
    "output-tokens-max", "timeout", "metrics-path"})
"""Flags of ``blis run`` that ``blis replay`` does not take (the trace is the workload)."""
REPLAY_ONLY_FLAGS = frozenset({"trace-header", "trace-data", "session-mode", "think-time-dist"})
STEP_TIME_FLAGS = frozenset(
    {spec.flag for spec in RUN_OPTIONS if spec.group == "Model and latency"}
    | {"total-kv-blocks", "block-size-in-tokens", "log"})
"""Flags ``blis step-time`` takes: the latency backend's resolution reads these (and the run's
start and log checks), no other."""

OPTIONS_BY_FIELD = {spec.field: spec for spec in RUN_OPTIONS}
OPTIONS_BY_FLAG = {spec.flag: spec for spec in RUN_OPTIONS}


def run_options_disagreements(cls: type, rows: tuple[OptionSpec, ...] = RUN_OPTIONS) -> list[str]:
    """How the fields of ``cls`` (a RunOptions class) differ from ``rows`` in names, order and
    defaults, one line each; empty when they agree."""
    import dataclasses

    fields = [f for f in dataclasses.fields(cls) if f.name != "explicit"]
    names, wanted = [f.name for f in fields], [spec.field for spec in rows]
    if names != wanted:
        missing, extra = sorted(set(wanted) - set(names)), sorted(set(names) - set(wanted))
        return [f"fields {names} are not the rows' {wanted} (missing {missing}, extra {extra})"]
    return [f"{f.name} defaults to {f.default!r}, its row to {spec.default!r}"
            for f, spec in zip(fields, rows, strict=True) if f.default != spec.default]


@functools.cache
def _run_options_class() -> type[RunOptions]:
    """RunOptions (``blis_fast/run_options.py``), imported on first use (building a 70-field
    dataclass costs start-up time that ``blis --help`` and the other subcommands need not pay).
    A file left stale after a row changed is refused here, naming the command that regenerates
    it, rather than running with another default or failing on an unknown keyword later."""
    from blis_fast.run_options import RunOptions  # lazy: a 70-field dataclass, not for --help

    problems = run_options_disagreements(RunOptions)
    if problems:
        raise RuntimeError("blis_fast/run_options.py is out of date with RUN_OPTIONS (regenerate "
                           "it: python -m blis_fast.run_options_codegen): " + "; ".join(problems))
    return RunOptions


def __getattr__(name: str) -> Any:
    if name == "RunOptions":  # blis_fast/run_options.py, generated from RUN_OPTIONS
        return _run_options_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_options(opts: RunOptions, stage: str) -> None:
    """Run the own checks of the flags of ``stage`` (CHECK_ORDER) in order; the first failure
    is raised as a BlisConfigError."""
    for flag in CHECK_ORDER[stage]:
        spec = OPTIONS_BY_FLAG[flag]
        value = getattr(opts, spec.field)
        for check in spec.checks:
            message = check.error(flag, value)
            if message is not None:
                raise BlisConfigError(message)


def default_options() -> dict[str, Any]:
    """Every field at its default."""
    return {spec.field: spec.default for spec in RUN_OPTIONS}


def parse_go_floats(text: str) -> tuple[float, ...]:
    """A pflag Float64Slice value: split on every comma, each part ``strconv.ParseFloat``'d
    (so an empty value or an empty item is a syntax error, as in the reference)."""
    return tuple(parse_float(part) for part in text.split(","))


def _number_text(value: Any, what: str) -> str:
    """The text a Python API number stands for, so it goes through the CLI's parser.

    Accepts ``int``/``float`` and NumPy integer/floating scalars; refuses bools, ``None``,
    strings of other types, complex numbers, sequences and arrays.
    """
    import numbers

    if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
        raise ValueError(f"expected {what}, got the bool {value!r}")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return repr(float(value))
    raise ValueError(f"expected {what}, got {type(value).__name__} {value!r}")


def _api_float(value: Any) -> float:
    """A float option's value: a string through ``strconv.ParseFloat``, a number through its text."""
    if isinstance(value, str):
        return parse_float(value)
    return parse_float(_number_text(value, "a number"))


def coerce(spec: OptionSpec, value: Any) -> Any:
    """Convert a CLI string or a Python API value to the option's type with the parser the
    reference applies to that flag (pflag: ParseInt(s, 0, 64), ParseFloat(s, 64),
    Float64Slice); API numbers are converted through their text so both accept the same."""
    if spec.kind == "int":
        if isinstance(value, str):
            return parse_int(value, 0, 64)
        return parse_int(_number_text(value, "an integer"), 0, 64)
    if spec.kind == "float":
        return _api_float(value)
    if spec.kind == "floats":
        if isinstance(value, str):
            return parse_go_floats(value)
        if not isinstance(value, (list, tuple)) and type(value).__name__ != "ndarray":
            raise ValueError(f"expected a comma-separated string or a sequence of numbers, got "
                             f"{type(value).__name__} {value!r}")
        return tuple(_api_float(v) for v in value)
    if spec.kind == "bool":
        if isinstance(value, str):
            return parse_bool(value)
        if isinstance(value, bool) or type(value).__name__ in ("bool", "bool_"):
            return bool(value)
        raise ValueError(f"expected a bool, got {type(value).__name__} {value!r}")
    return "" if value is None else str(value)


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def build_options(given: dict[str, Any], *, keywords: bool = False) -> RunOptions:
    """RunOptions from explicitly given values (field names), the rest at defaults.

    Errors name the flag; with ``keywords`` (the Python API) they name the keyword too.
    """
    values: dict[str, Any] = {}
    for name, value in given.items():
        spec = OPTIONS_BY_FIELD.get(name)
        if spec is None:
            raise BlisConfigError(f"unknown option {name!r}")
        try:
            values[name] = coerce(spec, value)
        except ValueError as exc:
            if keywords:
                raise BlisConfigError(f"{name}={_short_repr(value)} (--{spec.flag}): {exc}"
                                      ) from None
            raise BlisConfigError(f"--{spec.flag}: invalid value {value!r}: {exc}") from None
    return _run_options_class()(**values, explicit=frozenset(values))


__all__ = [
    "CHECK_ORDER",
    "INT64_MAX",
    "MAX_GPU_HOUR_COST",
    "OPTIONS_BY_FIELD",
    "OPTIONS_BY_FLAG",
    "RUN_OPTIONS",
    "STEP_TIME_FLAGS",
    "TIME_LIMIT_US",
    "Check",
    "OptionSpec",
    "build_options",
    "check_options",
    "coerce",
    "default_options",
    "parse_go_floats",
]
