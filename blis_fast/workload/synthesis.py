"""Workload specs synthesized from CLI distribution flags and from named presets (WL-2).

Both paths build the same one-client v2 spec (client id ``distribution``, constant arrivals,
gaussian input/output lengths, optional shared prefix group); the flag checks of WL-2.4 are
here too so the CLI and the Python API report the same errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from blis_fast.errors import BlisConfigError
from blis_fast.options import OPTIONS_BY_FIELD, OPTIONS_BY_FLAG
from blis_fast.workload.spec import ArrivalSpec, ClientSpec, DistSpec, WorkloadSpec
from blis_fast.workload.validate import MAX_LENGTH_PARAM

PRESET_NAMES = ("chatbot", "summarization", "contentgen", "multidoc")
"""Preset names the reference's error message lists (WL-1.1)."""

PRESET_KEYS = (
    "prefix_tokens",
    "prompt_tokens",
    "prompt_tokens_stdev",
    "prompt_tokens_min",
    "prompt_tokens_max",
    "output_tokens",
    "output_tokens_stdev",
    "output_tokens_min",
    "output_tokens_max",
)
"""Keys of one ``defaults.yaml`` ``workloads.<name>`` entry (a missing key counts as 0)."""


def _flag_default(field_name: str) -> Any:
    """The ``blis run`` row default of a DistributionParams field (its flag is the field's
    name less ``_mean``: ``prompt_tokens_mean`` is ``--prompt-tokens``)."""
    return OPTIONS_BY_FIELD[field_name.removesuffix("_mean")].default


@dataclass
class DistributionParams:
    """The CLI's distribution-mode flags (WL-2.3); each default is its ``blis run`` row's."""

    rate: float = _flag_default("rate")
    num_requests: int = _flag_default("num_requests")
    prefix_tokens: int = _flag_default("prefix_tokens")
    prompt_tokens_mean: int = _flag_default("prompt_tokens_mean")
    prompt_tokens_stdev: int = _flag_default("prompt_tokens_stdev")
    prompt_tokens_min: int = _flag_default("prompt_tokens_min")
    prompt_tokens_max: int = _flag_default("prompt_tokens_max")
    output_tokens_mean: int = _flag_default("output_tokens_mean")
    output_tokens_stdev: int = _flag_default("output_tokens_stdev")
    output_tokens_min: int = _flag_default("output_tokens_min")
    output_tokens_max: int = _flag_default("output_tokens_max")

    @classmethod
    def from_flags(cls, flags: Any) -> DistributionParams:
        """The parameters of an object carrying the distribution flags as attributes named
        like the options (``rate``, ``prompt_tokens``, ``prompt_tokens_stdev``, ...): the parsed
        options of ``blis run`` and of ``blis observe``."""
        return cls(**{f.name: getattr(flags, f.name.removesuffix("_mean")) for f in fields(cls)})


WorkloadSource = Literal["spec", "concurrency", "distribution", "preset"]
"""Where a run's or an observation's requests come from (WL-1, DELTA-29)."""


def workload_source(flags: Any, distribution: str) -> WorkloadSource:
    """The source the workload flags of ``blis run`` and ``blis observe`` choose, in the
    reference's order: ``--workload-spec``; else ``--concurrency`` virtual users (closed
    loop); else the distribution flags when ``--workload`` is ``distribution`` (the command's
    name for them: ``distribution`` for run, ``""`` for observe, which has no such preset);
    else the ``defaults.yaml`` preset ``--workload`` names. ``flags`` carries the options as
    attributes (``workload_spec``, ``concurrency``, ``workload``). Each command makes its own
    checks of the flags before and after."""
    if flags.workload_spec:
        return "spec"
    if flags.concurrency > 0:
        return "concurrency"
    if flags.workload == distribution:
        return "distribution"
    return "preset"


def _gaussian(mean: int, std: int, lo: int, hi: int) -> DistSpec:
    """Gaussian DistSpec with float params, as the reference builds them."""
    return DistSpec(
        type="gaussian",
        params={"mean": float(mean), "std_dev": float(std), "min": float(lo), "max": float(hi)},
    )


def synthesize_from_distribution(params: DistributionParams, seed: int = 42) -> WorkloadSpec:
    """Build the one-client v2 spec of ``--workload distribution`` (WL-2.1); seed = ``--seed``."""
    client = ClientSpec(
        id="distribution",
        rate_fraction=1.0,
        arrival=ArrivalSpec(process="constant"),
        input_dist=_gaussian(
            params.prompt_tokens_mean,
            params.prompt_tokens_stdev,
            params.prompt_tokens_min,
            params.prompt_tokens_max,
        ),
        output_dist=_gaussian(
            params.output_tokens_mean,
            params.output_tokens_stdev,
            params.output_tokens_min,
            params.output_tokens_max,
        ),
    )
    if params.prefix_tokens > 0:
        client.prefix_group = "shared"
        client.prefix_length = int(params.prefix_tokens)
    return WorkloadSpec(
        version="2",
        seed=int(seed),
        category="language",
        clients=[client],
        aggregate_rate=float(params.rate),
        num_requests=int(params.num_requests),
    )


def _preset_value(preset: Mapping[str, Any] | Any, key: str) -> int:
    """Read one preset field from a mapping or an attribute object; missing counts as 0."""
    if isinstance(preset, Mapping):
        v = preset.get(key, 0)
    else:
        v = getattr(preset, key, 0)
    return int(v or 0)


def lookup_preset(workloads: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | Any:
    """Return ``workloads[name]`` from defaults.yaml, or raise the reference's unknown-workload error."""
    if workloads is None or name not in workloads:
        raise BlisConfigError(
            f'Undefined workload "{name}". Use one among '
            f"({', '.join(PRESET_NAMES)}) or --workload-spec"
        )
    return workloads[name]


def preset_to_params(
    preset: Mapping[str, Any] | Any, rate: float, num_requests: int
) -> DistributionParams:
    """Turn a preset entry plus ``--rate``/``--num-requests`` into distribution params (WL-2.5)."""
    return DistributionParams(
        rate=float(rate),
        num_requests=int(num_requests),
        prefix_tokens=_preset_value(preset, "prefix_tokens"),
        prompt_tokens_mean=_preset_value(preset, "prompt_tokens"),
        prompt_tokens_stdev=_preset_value(preset, "prompt_tokens_stdev"),
        prompt_tokens_min=_preset_value(preset, "prompt_tokens_min"),
        prompt_tokens_max=_preset_value(preset, "prompt_tokens_max"),
        output_tokens_mean=_preset_value(preset, "output_tokens"),
        output_tokens_stdev=_preset_value(preset, "output_tokens_stdev"),
        output_tokens_min=_preset_value(preset, "output_tokens_min"),
        output_tokens_max=_preset_value(preset, "output_tokens_max"),
    )


def synthesize_from_preset(
    preset: Mapping[str, Any] | Any, rate: float, num_requests: int, seed: int = 42
) -> WorkloadSpec:
    """Build the spec of ``--workload <preset>`` (WL-2.5): same shape as distribution mode."""
    return synthesize_from_distribution(preset_to_params(preset, rate, num_requests), seed=seed)


def validate_rate(rate: float) -> None:
    """Reject a non-finite or non-positive ``--rate`` (distribution and preset modes, ``blis
    observe`` and ``blis convert preset``): the ``--rate`` row's own check."""
    for check in OPTIONS_BY_FLAG["rate"].checks:
        message = check.error("rate", rate)
        if message is not None:
            raise BlisConfigError(message)


def validate_distribution_params(p: DistributionParams) -> None:
    """Flag bound checks of distribution mode, in the reference's order (WL-2.4)."""
    checks = (
        (p.prompt_tokens_min < 1, f"--prompt-tokens-min must be >= 1, got {p.prompt_tokens_min}"),
        (p.prompt_tokens_max < 1, f"--prompt-tokens-max must be >= 1, got {p.prompt_tokens_max}"),
        (p.output_tokens_min < 1, f"--output-tokens-min must be >= 1, got {p.output_tokens_min}"),
        (p.output_tokens_max < 1, f"--output-tokens-max must be >= 1, got {p.output_tokens_max}"),
        (
            p.prompt_tokens_stdev < 0,
            f"--prompt-tokens-stdev must be >= 0, got {p.prompt_tokens_stdev}",
        ),
        (
            p.output_tokens_stdev < 0,
            f"--output-tokens-stdev must be >= 0, got {p.output_tokens_stdev}",
        ),
        (
            p.prompt_tokens_min > p.prompt_tokens_max,
            f"--prompt-tokens-min ({p.prompt_tokens_min}) must be <= "
            f"--prompt-tokens-max ({p.prompt_tokens_max})",
        ),
        (
            p.output_tokens_min > p.output_tokens_max,
            f"--output-tokens-min ({p.output_tokens_min}) must be <= "
            f"--output-tokens-max ({p.output_tokens_max})",
        ),
        (
            not (p.prompt_tokens_min <= p.prompt_tokens_mean <= p.prompt_tokens_max)
            or not (p.prompt_tokens_min <= p.prompt_tokens_stdev <= p.prompt_tokens_max),
            "prompt-tokens and prompt-tokens-stdev should be in range "
            "[prompt-tokens-min, prompt-tokens-max]",
        ),
        (
            not (p.output_tokens_min <= p.output_tokens_mean <= p.output_tokens_max)
            or not (p.output_tokens_min <= p.output_tokens_stdev <= p.output_tokens_max),
            "output-tokens and output-tokens-stdev should be in range "
            "[output-tokens-min, output-tokens-max]",
        ),
    )
    for failed, msg in checks:
        if failed:
            raise BlisConfigError(msg)
    for flag in ("prompt-tokens", "prompt-tokens-stdev", "prompt-tokens-min", "output-tokens",
                 "output-tokens-stdev", "output-tokens-min"):  # a large max only caps
        value = getattr(p, flag.replace("-", "_") + ("_mean" if flag.endswith("tokens") else ""))
        if value > MAX_LENGTH_PARAM:
            raise BlisConfigError(f"--{flag} {value} is more tokens than blis_fast draws "
                                  "(at most 2^24)")


def synthesize_concurrency(
    params: DistributionParams,
    concurrency: int,
    think_time_ms: int,
    num_requests: int = 0,
    seed: int = 42,
) -> WorkloadSpec:
    """Build the spec of ``--concurrency C`` (DELTA-29): one closed-loop ``distribution`` client.

    ``num_requests`` is ``--num-requests`` only when given explicitly (else 0, so a horizon is
    required); ``params.rate`` and ``params.num_requests`` are ignored. Generation follows
    DELTA-47 (one seed request per virtual user, then the engine drives the sessions).
    """
    spec = synthesize_from_distribution(params, seed=seed)
    client = spec.clients[0]
    client.concurrency = int(concurrency)
    client.think_time_us = int(think_time_ms) * 1000
    client.rate_fraction = 0.0
    spec.aggregate_rate = 0.0
    spec.num_requests = int(num_requests)
    return spec
