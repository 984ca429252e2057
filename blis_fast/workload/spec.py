"""Workload-spec model (spec WL-4, DELTA-47/53/54/55/59): the reference's v2 WorkloadSpec.

The dataclasses mirror the reference's YAML schema field for field (``spec_yaml`` loads them
strictly, ``convert`` writes them back). ``validate_spec`` runs the reference's checks in its
order; each failure is one ``BlisInputError`` line with the reference's wording, followed by
the spec file and line when the spec was loaded from a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blis_fast.errors import BlisInputError
from blis_fast.kernels.samplers import (  # the generation kernel's integer codes
    ARRIVAL_CONSTANT,
    ARRIVAL_GAMMA,
    ARRIVAL_POISSON,
    ARRIVAL_WEIBULL,
    DIST_CONSTANT,
    DIST_EMPIRICAL,
    DIST_EXPONENTIAL,
    DIST_GAUSSIAN,
    DIST_LOGNORMAL,
    DIST_PARETO_LOGNORMAL,
)
from blis_fast.workload.gofmt import go_pct_f

ARRIVAL_CODES: dict[str, int] = {
    "constant": ARRIVAL_CONSTANT,
    "poisson": ARRIVAL_POISSON,
    "gamma": ARRIVAL_GAMMA,
    "weibull": ARRIVAL_WEIBULL,
}
"""Every arrival process the reference accepts (WL-4.5), by name."""

IMPLEMENTED_ARRIVALS = frozenset(ARRIVAL_CODES)
"""Arrival processes the generator implements (all of them)."""

DIST_CODES: dict[str, int] = {
    "gaussian": DIST_GAUSSIAN,
    "exponential": DIST_EXPONENTIAL,
    "constant": DIST_CONSTANT,
    "pareto_lognormal": DIST_PARETO_LOGNORMAL,
    "empirical": DIST_EMPIRICAL,
}
"""Every length distribution spec validation accepts (WL-4.5), by name."""

SAMPLER_CODES: dict[str, int] = {**DIST_CODES, "lognormal": DIST_LOGNORMAL}
"""Every type the sampler factory builds (DELTA-59 adds ``lognormal``, unvalidated)."""

IMPLEMENTED_DISTS = frozenset(SAMPLER_CODES)
"""Length distributions the generator implements (all of them)."""

DIST_REQUIRED_PARAMS: dict[str, tuple[str, ...]] = {
    "gaussian": ("mean", "std_dev", "min", "max"),
    "exponential": ("mean",),
    "constant": ("value",),
    "pareto_lognormal": ("alpha", "xm", "mu", "sigma", "mix_weight"),
    "lognormal": ("mu", "sigma"),
    "empirical": (),
}
"""Parameters each distribution requires when its sampler is built (WL-5.3)."""

VALID_CATEGORIES = frozenset({"", "language", "multimodal", "reasoning"})
VALID_SLO_CLASSES = frozenset({"", "critical", "standard", "sheddable", "batch", "background"})
V1_SLO_RENAMES = {"realtime": "critical", "interactive": "standard"}
MAX_COHORT_POPULATION = 100_000

DEFAULT_PREFIX_LENGTH = 50
"""Group prefix length when the first client of a group gives none (WL-5.4)."""

DEFAULT_TIMEOUT_US = 300_000_000
"""Deadline offset for session clients without an explicit timeout (WL-5.7)."""


@dataclass
class ArrivalSpec:
    """Inter-arrival process of one client: ``process`` name and optional ``cv``."""

    process: str = ""
    cv: float | None = None


@dataclass
class DistSpec:
    """A token-length distribution: ``type``, float ``params`` (string keys) and ``file``."""

    type: str = ""
    params: dict[str, float] = field(default_factory=dict)
    file: str = ""


@dataclass
class NetworkSpec:
    """Client network characteristics; parsed but inert in ``run`` (WL-7.4)."""

    rtt_ms: float = 0.0
    bandwidth_mbps: float = 0.0


@dataclass
class ActiveWindow:
    """One lifecycle window: the client is active for ``start_us <= t < end_us``."""

    start_us: int = 0
    end_us: int = 0


@dataclass
class LifecycleSpec:
    """Activity windows of a client (arrivals outside every window are skipped)."""

    windows: list[ActiveWindow] = field(default_factory=list)


@dataclass
class MultimodalSpec:
    """Per-modality length distributions (WL-6.1); a modality needs size and count types."""

    text_dist: DistSpec = field(default_factory=DistSpec)
    image_dist: DistSpec = field(default_factory=DistSpec)
    image_count_dist: DistSpec = field(default_factory=DistSpec)
    audio_dist: DistSpec = field(default_factory=DistSpec)
    audio_count_dist: DistSpec = field(default_factory=DistSpec)
    video_dist: DistSpec = field(default_factory=DistSpec)
    video_count_dist: DistSpec = field(default_factory=DistSpec)


@dataclass
class MultiTurnSpec:
    """Multi-turn session shape (WL-6.2)."""

    max_rounds: int = 0
    think_time_us: int = 0
    context_growth: str = ""
    single_session: bool = False


@dataclass
class ReasoningSpec:
    """Reason-ratio distribution and optional multi-turn sessions (WL-6.2)."""

    reason_ratio_dist: DistSpec = field(default_factory=DistSpec)
    multi_turn: MultiTurnSpec | None = None


@dataclass
class ArrivalFactory:
    """A programmatic arrival sampler (DELTA-52), set only by the inference-perf expansion.

    ``kind`` is ``"normalized_exponential"`` (``count`` intervals summing to ``duration_us``)
    or ``"poisson"`` (``rate_us`` requests per µs). Not part of the YAML schema.
    """

    kind: str
    count: int = 0
    duration_us: int = 0
    rate_us: float = 0.0


@dataclass
class ClientSpec:
    """One traffic source of a workload spec (WL-4.4, DELTA-47)."""

    id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    rate_fraction: float = 0.0
    concurrency: int = 0
    think_time_us: int = 0
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    input_dist: DistSpec = field(default_factory=DistSpec)
    output_dist: DistSpec = field(default_factory=DistSpec)
    prefix_group: str = ""
    prefix_length: int = 0
    streaming: bool = False
    network: NetworkSpec | None = None
    lifecycle: LifecycleSpec | None = None
    multimodal: MultimodalSpec | None = None
    reasoning: ReasoningSpec | None = None
    timeout: int | None = None  # µs; None = default rule, 0 = no deadline
    closed_loop: bool | None = None
    arrival_factory: ArrivalFactory | None = None


@dataclass
class DiurnalSpec:
    """24 hourly on/off windows following a cosine (WL-7.2)."""

    peak_hour: int = 0
    peak_to_trough_ratio: float = 0.0


@dataclass
class SpikeSpec:
    """One window ``[start_time_us, start_time_us + duration_us)``."""

    start_time_us: int = 0
    duration_us: int = 0


@dataclass
class DrainSpec:
    """Ten shrinking windows approximating a linear ramp-down (WL-7.2)."""

    start_time_us: int = 0
    ramp_duration_us: int = 0


@dataclass
class CohortSpec:
    """A population of identical clients (WL-7.1, DELTA-54)."""

    id: str = ""
    population: int = 0
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    input_dist: DistSpec = field(default_factory=DistSpec)
    output_dist: DistSpec = field(default_factory=DistSpec)
    prefix_group: str = ""
    streaming: bool = False
    rate_fraction: float = 0.0
    diurnal: DiurnalSpec | None = None
    spike: SpikeSpec | None = None
    drain: DrainSpec | None = None
    prefix_length: int = 0
    reasoning: ReasoningSpec | None = None
    closed_loop: bool | None = None
    timeout: int | None = None
    network: NetworkSpec | None = None
    multimodal: MultimodalSpec | None = None


@dataclass
class ServeGenDataSpec:
    """ServeGen native data directory (WL-8.2); span bounds are compared in seconds."""

    path: str = ""
    span_start: int = 0
    span_end: int = 0


@dataclass
class StageSpec:
    """One inference-perf stage: ``rate`` req/s for ``duration`` seconds."""

    rate: float = 0.0
    duration: int = 0


@dataclass
class SharedPrefixSpec:
    """inference-perf shared-prefix data shape (WL-8.1)."""

    num_unique_system_prompts: int = 0
    num_users_per_system_prompt: int = 0
    system_prompt_len: int = 0
    question_len: int = 0
    output_len: int = 0
    enable_multi_turn_chat: bool = False


@dataclass
class InferencePerfSpec:
    """Compact inference-perf workload, expanded into clients (WL-8.1, DELTA-53)."""

    stages: list[StageSpec] = field(default_factory=list)
    shared_prefix: SharedPrefixSpec | None = None


@dataclass
class WorkloadSpec:
    """A v2 workload spec (WL-4.3). ``source``/``positions`` locate keys of a loaded file."""

    version: str = "2"
    seed: int = 0
    category: str = ""
    clients: list[ClientSpec] = field(default_factory=list)
    cohorts: list[CohortSpec] = field(default_factory=list)
    aggregate_rate: float = 0.0
    horizon: int = 0
    num_requests: int = 0
    servegen_data: ServeGenDataSpec | None = None
    inference_perf: InferencePerfSpec | None = None
    source: str = field(default="", compare=False)
    positions: dict[str, int] = field(default_factory=dict, compare=False, repr=False)


# --- validation -------------------------------------------------------------------------------
def _where(spec: WorkloadSpec | None, path: str) -> str:
    """`` (file, line N)`` for the key at ``path`` (or its nearest located parent)."""
    if spec is None or not spec.source:
        return ""
    p = path
    while p:
        line = spec.positions.get(p)
        if line is not None:
            return f" ({spec.source}, line {line})"
        cut = max(p.rfind("."), p.rfind("["))
        p = p[:cut] if cut > 0 else ""
    return f" ({spec.source})"


def _fail(spec: WorkloadSpec | None, path: str, msg: str) -> BlisInputError:
    """The error for one failed check: the reference's message, then the location if known."""
    return BlisInputError(msg + _where(spec, path))


def _check_finite_positive(spec, path: str, name: str, v: float) -> None:
    """Raise unless ``v`` is finite and > 0 (reference wording)."""
    if math.isnan(v) or math.isinf(v):
        raise _fail(spec, path, f"{name} must be a finite number, got {go_pct_f(v)}")
    if v <= 0:
        raise _fail(spec, path, f"{name} must be positive, got {go_pct_f(v)}")


def _check_dist(spec, path: str, prefix: str, d: DistSpec) -> None:
    """Validate a distribution's type and the finiteness of its params (WL-4.5 step 4.7)."""
    if d.type not in DIST_CODES:
        raise _fail(
            spec,
            path + ".type",
            f'{prefix}: unknown distribution type "{d.type}"; valid: gaussian, exponential, '
            "pareto_lognormal, empirical, constant",
        )
    for name, val in d.params.items():
        if math.isnan(val) or math.isinf(val):
            raise _fail(
                spec,
                f"{path}.params.{name}",
                f"{prefix}.params.{name} must be a finite number, got {go_pct_f(val)}",
            )


_TIME_LIMIT_US = 1 << 61
"""Longest think time accepted (µs): event times stay far from int64 overflow."""
_NON_NEGATIVE_PARAMS = ("mean", "std_dev", "sigma")  # bounds and constants: the sampler's own check
_POSITIVE_PARAMS = ("alpha", "xm")


def _check_meaningful(spec, c, path: str, p: str) -> None:
    """Values the reference accepts but that have no meaning (blis_fast is stricter here, see
    the README): negative spreads, means and bounds, a Pareto alpha or scale <= 0, a mixing
    weight outside [0, 1], negative think times and network figures."""
    for key, d in (("input_distribution", c.input_dist), ("output_distribution", c.output_dist)):
        for name, val in d.params.items():
            where = f"{path}.{key}.params.{name}"
            if name in _NON_NEGATIVE_PARAMS and val < 0:
                raise _fail(spec, where, f"{p}.{key}.params.{name} must be non-negative, "
                                         f"got {go_pct_f(val)}")
            if name in _POSITIVE_PARAMS and d.type == "pareto_lognormal" and val <= 0:
                raise _fail(spec, where, f"{p}.{key}.params.{name} must be positive, "
                                         f"got {go_pct_f(val)}")
            if name == "mix_weight" and not 0 <= val <= 1:
                raise _fail(spec, where, f"{p}.{key}.params.{name} must be in [0, 1], "
                                         f"got {go_pct_f(val)}")
    for where, think in (("think_time_us", getattr(c, "think_time_us", 0)),
                         ("reasoning.multi_turn.think_time_us",
                          c.reasoning.multi_turn.think_time_us if _has_multi_turn(c) else 0)):
        if think > _TIME_LIMIT_US:
            raise _fail(spec, f"{path}.{where}", f"{p}.{where} {think} is beyond the "
                                                 "simulator's time range")
    if _has_multi_turn(c) and c.reasoning.multi_turn.think_time_us < 0:
        raise _fail(spec, path + ".reasoning.multi_turn.think_time_us",
                    f"{p}.reasoning.multi_turn.think_time_us must be non-negative, "
                    f"got {c.reasoning.multi_turn.think_time_us}")
    net = getattr(c, "network", None)
    if net is not None:
        for name in ("rtt_ms", "bandwidth_mbps"):
            val = getattr(net, name)
            if not (val >= 0) or math.isinf(val):
                raise _fail(spec, f"{path}.network.{name}", f"{p}.network.{name} must be a "
                                                            f"finite value >= 0, got {go_pct_f(val)}")


def _has_multi_turn(c) -> bool:
    return c.reasoning is not None and c.reasoning.multi_turn is not None


def upgrade_v1_to_v2(spec: WorkloadSpec) -> None:
    """Map a v1 spec to v2 in place (WL-4.2): version and deprecated client SLO names."""
    if spec.version in ("", "1"):
        spec.version = "2"
        for c in spec.clients:
            c.slo_class = V1_SLO_RENAMES.get(c.slo_class, c.slo_class)


def _validate_client(spec, c: ClientSpec, i: int) -> None:
    p = f"client[{i}]"
    path = f"clients[{i}]"
    if c.slo_class not in VALID_SLO_CLASSES:
        raise _fail(spec, path + ".slo_class",
                    f'{p}: unknown slo_class "{c.slo_class}"; valid: critical, standard, '
                    "sheddable, batch, background, or empty")  # fmt: skip
    if c.concurrency < 0:
        raise _fail(spec, path + ".concurrency",
                    f"{p}: concurrency must be non-negative, got {c.concurrency}")  # fmt: skip
    if c.think_time_us < 0:
        raise _fail(spec, path + ".think_time_us",
                    f"{p}: think_time_us must be non-negative, got {c.think_time_us}")  # fmt: skip
    if c.concurrency > 0 and c.rate_fraction > 0:
        raise _fail(spec, path + ".concurrency",
                    f"{p}: concurrency and rate_fraction are mutually exclusive")  # fmt: skip
    if c.concurrency == 0:
        _check_finite_positive(spec, path + ".rate_fraction", f"{p}.rate_fraction",
                               c.rate_fraction)  # fmt: skip
    if c.concurrency == 0 and c.arrival_factory is None:
        if c.arrival.process not in ARRIVAL_CODES:
            raise _fail(spec, path + ".arrival.process",
                        f'{p}: unknown arrival process "{c.arrival.process}"; valid: poisson, '
                        "gamma, weibull, constant")  # fmt: skip
        if c.arrival.process == "weibull" and c.arrival.cv is not None:
            cv = c.arrival.cv
            if cv < 0.01 or cv > 10.4:
                raise _fail(spec, path + ".arrival.cv",
                            f"{p}: weibull CV must be in [0.01, 10.4], got {go_pct_f(cv)}")  # fmt: skip
    if c.concurrency == 0 and c.arrival.cv is not None:
        _check_finite_positive(spec, path + ".arrival.cv", f"{p}.cv", c.arrival.cv)
    if c.prefix_length < 0:
        raise _fail(spec, path + ".prefix_length",
                    f"{p}: prefix_length must be non-negative, got {c.prefix_length}")  # fmt: skip
    _check_dist(spec, path + ".input_distribution", f"{p}.input_distribution", c.input_dist)
    _check_dist(spec, path + ".output_distribution", f"{p}.output_distribution", c.output_dist)
    _check_meaningful(spec, c, path, p)
    if c.timeout is not None and c.timeout < 0:
        raise _fail(spec, path + ".timeout", f"{p}: timeout must be non-negative, got {c.timeout}")
    if _has_multi_turn(c) and c.reasoning.multi_turn.max_rounds < 1:
        raise _fail(spec, path + ".reasoning.multi_turn.max_rounds",
                    f"{p}: reasoning.multi_turn.max_rounds must be >= 1, got "
                    f"{c.reasoning.multi_turn.max_rounds}")  # fmt: skip
    if c.lifecycle is not None:
        if not c.lifecycle.windows:
            raise _fail(spec, path + ".lifecycle", f"{p}: lifecycle specified with no windows")
        for j, w in enumerate(c.lifecycle.windows):
            wp = f"{path}.lifecycle.windows[{j}]"
            if w.start_us < 0:
                raise _fail(spec, wp + ".start_us",
                            f"{p}: lifecycle.windows[{j}] has negative start_us ({w.start_us})")  # fmt: skip
            if w.end_us <= w.start_us:
                raise _fail(spec, wp + ".end_us",
                            f"{p}: lifecycle.windows[{j}] has end_us ({w.end_us}) <= "
                            f"start_us ({w.start_us})")  # fmt: skip


def _validate_cohort(spec, c: CohortSpec, i: int) -> None:
    p = f"cohort[{i}]"
    path = f"cohorts[{i}]"
    if c.population <= 0:
        raise _fail(spec, path + ".population",
                    f"{p}: population must be positive, got {c.population}")  # fmt: skip
    if c.population > MAX_COHORT_POPULATION:
        raise _fail(spec, path + ".population",
                    f"{p}: population {c.population} exceeds maximum {MAX_COHORT_POPULATION}")  # fmt: skip
    _check_finite_positive(spec, path + ".rate_fraction", f"{p}.rate_fraction", c.rate_fraction)
    if c.slo_class not in VALID_SLO_CLASSES:
        raise _fail(spec, path + ".slo_class",
                    f'{p}: unknown slo_class "{c.slo_class}"; valid: critical, standard, '
                    "sheddable, batch, background, or empty")  # fmt: skip
    if c.arrival.process not in ARRIVAL_CODES:
        raise _fail(spec, path + ".arrival.process",
                    f'{p}: unknown arrival process "{c.arrival.process}"; valid: poisson, gamma, '
                    "weibull, constant")  # fmt: skip
    if c.arrival.process == "weibull" and c.arrival.cv is not None:
        cv = c.arrival.cv
        if cv < 0.01 or cv > 10.4:
            raise _fail(spec, path + ".arrival.cv",
                        f"{p}: weibull CV must be in [0.01, 10.4], got {go_pct_f(cv)}")  # fmt: skip
    if c.arrival.cv is not None:
        _check_finite_positive(spec, path + ".arrival.cv", f"{p}.cv", c.arrival.cv)
    _check_dist(spec, path + ".input_distribution", f"{p}.input_distribution", c.input_dist)
    _check_dist(spec, path + ".output_distribution", f"{p}.output_distribution", c.output_dist)
    _check_meaningful(spec, c, path, p)
    if c.diurnal is not None:
        r = c.diurnal.peak_to_trough_ratio
        if math.isnan(r) or math.isinf(r) or r < 1.0:
            raise _fail(spec, path + ".diurnal.peak_to_trough_ratio",
                        f"{p}: diurnal peak_to_trough_ratio must be a finite number >= 1.0, got "
                        f"{go_pct_f(r)}")  # fmt: skip
        if c.diurnal.peak_hour < 0 or c.diurnal.peak_hour > 23:
            raise _fail(spec, path + ".diurnal.peak_hour",
                        f"{p}: diurnal peak_hour must be 0-23, got {c.diurnal.peak_hour}")  # fmt: skip
    if c.spike is not None:
        if c.spike.start_time_us < 0:
            raise _fail(spec, path + ".spike.start_time_us",
                        f"{p}: spike start_time_us must be non-negative, got "
                        f"{c.spike.start_time_us}")  # fmt: skip
        if c.spike.duration_us <= 0:
            raise _fail(spec, path + ".spike.duration_us",
                        f"{p}: spike duration_us must be > 0, got {c.spike.duration_us}")  # fmt: skip
    if c.drain is not None:
        if c.drain.start_time_us < 0:
            raise _fail(spec, path + ".drain.start_time_us",
                        f"{p}: drain start_time_us must be non-negative, got "
                        f"{c.drain.start_time_us}")  # fmt: skip
        if c.drain.ramp_duration_us <= 0:
            raise _fail(spec, path + ".drain.ramp_duration_us",
                        f"{p}: drain ramp_duration_us must be > 0, got "
                        f"{c.drain.ramp_duration_us}")  # fmt: skip
    if c.prefix_length < 0:
        raise _fail(spec, path + ".prefix_length",
                    f"{p}: prefix_length must be non-negative, got {c.prefix_length}")  # fmt: skip
    if c.timeout is not None and c.timeout < 0:
        raise _fail(spec, path + ".timeout", f"{p}: timeout must be non-negative, got {c.timeout}")
    if _has_multi_turn(c) and c.reasoning.multi_turn.max_rounds < 1:
        raise _fail(spec, path + ".reasoning.multi_turn.max_rounds",
                    f"{p}: reasoning.multi_turn.max_rounds must be >= 1, got "
                    f"{c.reasoning.multi_turn.max_rounds}")  # fmt: skip


def validate_spec(spec: WorkloadSpec) -> None:
    """Validate a spec in the reference's order (WL-4.5 + DELTA-55); raise on the first failure."""
    if spec.version not in ("", "1", "2"):
        raise _fail(spec, "version", f'version "{spec.version}" is not supported (1 or 2)')
    if spec.category not in VALID_CATEGORIES:
        raise _fail(spec, "category",
                    f'unknown category "{spec.category}"; valid: language, multimodal, '
                    "reasoning")  # fmt: skip
    rate_based = any(c.concurrency == 0 for c in spec.clients) or bool(spec.cohorts)
    if rate_based:
        _check_finite_positive(spec, "aggregate_rate", "aggregate_rate", spec.aggregate_rate)
    if not spec.clients and spec.servegen_data is None and not spec.cohorts:
        raise _fail(spec, "clients", "at least one client, cohort, or servegen_data path required")
    for i, c in enumerate(spec.clients):
        _validate_client(spec, c, i)
    has_conc = any(c.concurrency > 0 for c in spec.clients)
    has_mt = any(_has_multi_turn(c) for c in spec.clients) or any(
        _has_multi_turn(c) for c in spec.cohorts
    )
    if has_conc and has_mt:
        raise _fail(spec, "clients",
                    "concurrency clients and multi-turn clients cannot be mixed in the same "
                    "spec: follow-up budget accounting does not support this combination")  # fmt: skip
    for i, c in enumerate(spec.cohorts):
        _validate_cohort(spec, c, i)


def apply_timeout_to_spec(spec: WorkloadSpec, timeout_s: int) -> None:
    """Set every client's and cohort's timeout from ``--timeout`` seconds (DELTA-28).

    ``T > 0`` gives ``T*1e6`` µs; ``T < 0`` an explicit 0 (no deadline); 0 is the caller's
    error to report.
    """
    if timeout_s == 0:
        raise ValueError("timeout 0 must be rejected by the caller (use a negative value)")
    us = int(timeout_s) * 1_000_000 if timeout_s > 0 else 0
    for c in spec.clients:
        c.timeout = us
    for c in spec.cohorts:
        c.timeout = us
