"""The options of ``blis run``: one table shared by the CLI and the Python API.

Each entry names the flag, its Python field, its kind (how a command-line string is parsed,
with Go's ``strconv`` rules so ``0x10`` or ``NaN`` mean what they mean to the reference) and
its default (the reference's defaults, ENG-10.1, CLU-9, DELTA-27).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from blis_fast.gonum import parse_bool, parse_float, parse_int

INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class OptionSpec:
    """One flag of ``blis run``."""

    flag: str
    kind: str  # "int", "float", "floats", "str", "bool"
    default: Any
    help: str

    @property
    def field(self) -> str:
        """The RunOptions attribute holding this flag's value."""
        return self.flag.replace("-", "_")


RUN_OPTIONS: tuple[OptionSpec, ...] = (
    # model, hardware, latency
    OptionSpec("model", "str", "", "LLM name (required), e.g. meta-llama/llama-3.1-8b-instruct"),
    OptionSpec("hardware", "str", "", "GPU type (default from defaults.yaml)"),
    OptionSpec("tp", "int", 0, "tensor parallelism (default from defaults.yaml)"),
    OptionSpec("vllm-version", "str", "", "vLLM version (default from defaults.yaml)"),
    OptionSpec("latency-model", "str", "roofline",
               "roofline, blackbox, trained-physics, crossmodel or trained-roofline"),
    OptionSpec("alpha-coeffs", "floats", (0.0, 0.0, 0.0), "alpha coefficients (comma-separated)"),
    OptionSpec("beta-coeffs", "floats", (0.0, 0.0, 0.0), "beta coefficients (comma-separated)"),
    OptionSpec("model-config-folder", "str", "", "folder holding the model's config.json"),
    OptionSpec("hardware-config", "str", "", "hardware_config.json to use"),
    OptionSpec("defaults-filepath", "str", "",
               "defaults.yaml to use (default: the bundled copy)"),
    OptionSpec("max-model-len", "int", 0, "max sequence length; 0 = derived or unlimited"),
    OptionSpec("gpu-memory-utilization", "float", 0.9, "GPU memory fraction for the KV cache"),
    # KV cache and batching
    OptionSpec("total-kv-blocks", "int", 1_000_000, "KV blocks per instance (default: derived)"),
    OptionSpec("block-size-in-tokens", "int", 16, "tokens per KV block"),
    OptionSpec("max-num-running-reqs", "int", 256, "max requests in a running batch"),
    OptionSpec("max-num-scheduled-tokens", "int", 2048, "token budget per step"),
    OptionSpec("long-prefill-token-threshold", "int", 0, "chunked-prefill chunk size; 0 = off"),
    OptionSpec("kv-cpu-blocks", "int", 0, "CPU-tier KV blocks; > 0 enables tiered KV"),
    OptionSpec("kv-offload-threshold", "float", 0.9, "deprecated; validated and ignored"),
    OptionSpec("kv-transfer-bandwidth", "float", 100.0, "CPU->GPU transfer rate (tokens/tick)"),
    OptionSpec("kv-transfer-base-latency", "int", 0, "fixed ticks per reloaded block"),
    # simulation control
    OptionSpec("seed", "int", 42, "random seed"),
    OptionSpec("horizon", "int", INT64_MAX, "simulation horizon in ticks (µs)"),
    OptionSpec("log", "str", "warn", "log level for stderr diagnostics"),
    # cluster and policies
    OptionSpec("num-instances", "int", 1, "number of instances"),
    OptionSpec("admission-policy", "str", "always-admit", "admission policy"),
    OptionSpec("admission-latency", "int", 0, "admission latency (µs)"),
    OptionSpec("routing-latency", "int", 0, "routing latency (µs)"),
    OptionSpec("token-bucket-capacity", "float", 10000.0, "token bucket capacity"),
    OptionSpec("token-bucket-refill-rate", "float", 1000.0, "token bucket refill (tokens/s)"),
    OptionSpec("routing-policy", "str", "round-robin", "routing policy"),
    OptionSpec("routing-scorers", "str", "", "weighted-routing scorers, name:weight,..."),
    OptionSpec("priority-policy", "str", "constant", "priority policy"),
    OptionSpec("scheduler", "str", "fcfs", "instance scheduler"),
    OptionSpec("policy-config", "str", "", "policy bundle YAML"),
    OptionSpec("fitness-weights", "str", "", "fitness weights, key:value,..."),
    OptionSpec("trace-level", "str", "none", "decision trace level: none or decisions"),
    OptionSpec("counterfactual-k", "int", 0, "counterfactual candidates per routing decision"),
    OptionSpec("summarize-trace", "bool", False, "print the decision-trace summary"),
    OptionSpec("snapshot-refresh-interval", "int", 0, "routing snapshot refresh interval (µs)"),
    OptionSpec("cache-signal-delay", "int", 50_000, "prefix-cache signal delay (µs)"),
    # workload
    OptionSpec("workload", "str", "distribution", "distribution or a preset name"),
    OptionSpec("workload-spec", "str", "", "workload spec YAML"),
    OptionSpec("rate", "float", 1.0, "requests per second"),
    OptionSpec("num-requests", "int", 100, "number of requests"),
    OptionSpec("concurrency", "int", 0, "closed-loop virtual users"),
    OptionSpec("think-time-ms", "int", 0, "think time between a response and the next request"),
    OptionSpec("prefix-tokens", "int", 0, "shared prefix length"),
    OptionSpec("prompt-tokens", "int", 512, "mean prompt length"),
    OptionSpec("prompt-tokens-stdev", "int", 256, "prompt length standard deviation"),
    OptionSpec("prompt-tokens-min", "int", 2, "min prompt length"),
    OptionSpec("prompt-tokens-max", "int", 7000, "max prompt length"),
    OptionSpec("output-tokens", "int", 512, "mean output length"),
    OptionSpec("output-tokens-stdev", "int", 256, "output length standard deviation"),
    OptionSpec("output-tokens-min", "int", 2, "min output length"),
    OptionSpec("output-tokens-max", "int", 7000, "max output length"),
    OptionSpec("timeout", "int", 300, "per-request deadline (s); negative disables"),
    # outputs
    OptionSpec("trace-output", "str", "", "export the workload as <prefix>.yaml + <prefix>.csv"),
    OptionSpec("metrics-path", "str", "", "write the summary + per-request JSON here"),
    OptionSpec("results-path", "str", "", "same as --metrics-path (the older name)"),
    OptionSpec("output-dir", "str", "", "write summary.parquet and requests.parquet here"),
    # blis replay
    OptionSpec("trace-header", "str", "", "replay: the trace v2 header YAML"),
    OptionSpec("trace-data", "str", "", "replay: the trace v2 data CSV"),
    OptionSpec("session-mode", "str", "fixed",
               "replay: fixed (trace arrivals) or closed-loop (follow-ups after completions)"),
    OptionSpec("think-time-dist", "str", "",
               "replay closed-loop: think time, lognormal:mu=..,sigma=..[,min=..,max=..] or "
               "constant:value=<time>"),
)

WORKLOAD_FLAGS = frozenset({
    "workload", "workload-spec", "rate", "num-requests", "concurrency", "think-time-ms",
    "prefix-tokens", "prompt-tokens", "prompt-tokens-stdev", "prompt-tokens-min",
    "prompt-tokens-max", "output-tokens", "output-tokens-stdev", "output-tokens-min",
    "output-tokens-max", "timeout", "metrics-path"})
"""Flags of ``blis run`` that ``blis replay`` does not take (the trace is the workload)."""
REPLAY_ONLY_FLAGS = frozenset({"trace-header", "trace-data", "session-mode", "think-time-dist"})

OPTIONS_BY_FIELD = {spec.field: spec for spec in RUN_OPTIONS}


@dataclass
class RunOptions:
    """Values of every ``blis run`` flag plus the set of flags given explicitly."""

    values: dict[str, Any] = field(default_factory=dict)
    explicit: set[str] = field(default_factory=set)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        raise AttributeError(name)

    def given(self, name: str) -> bool:
        """True when the flag (field name, e.g. ``"num_requests"``) was set explicitly."""
        return name in self.explicit


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
    values = default_options()
    explicit: set[str] = set()
    for name, value in given.items():
        spec = OPTIONS_BY_FIELD.get(name)
        if spec is None:
            from blis_fast.errors import BlisConfigError

            raise BlisConfigError(f"unknown option {name!r}")
        try:
            values[name] = coerce(spec, value)
        except ValueError as exc:
            from blis_fast.errors import BlisConfigError

            if keywords:
                raise BlisConfigError(f"{name}={_short_repr(value)} (--{spec.flag}): {exc}"
                                      ) from None
            raise BlisConfigError(f"--{spec.flag}: invalid value {value!r}: {exc}") from None
        explicit.add(name)
    return RunOptions(values=values, explicit=explicit)


def is_finite(x: float) -> bool:
    """True for a finite float."""
    return not (math.isnan(x) or math.isinf(x))


__all__ = [
    "RUN_OPTIONS",
    "OPTIONS_BY_FIELD",
    "OptionSpec",
    "RunOptions",
    "build_options",
    "coerce",
    "default_options",
    "parse_go_floats",
]
