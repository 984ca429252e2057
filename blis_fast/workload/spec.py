"""Workload-spec model (spec WL-4, DELTA-47/53/54/55/59): the reference's v2 WorkloadSpec.

The dataclasses are the reference's YAML schema field for field, each field with its yaml.v3
tag (``tag``): ``spec_yaml`` derives its decoder table from them and loads specs strictly,
``yaml_writer`` writes them back. Validation: ``validate.validate_spec``.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any

from blis_fast.kernels.generation.samplers import (  # the generation kernel's integer codes
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


def tag(default: Any = MISSING, *, key: str = "", go_int: str = "int64", omitempty: bool = False,
        factory: Any = MISSING) -> Any:
    """A dataclass field with its yaml.v3 struct tag: YAML ``key`` (default: the attribute
    name), the Go type of an integer field (``int`` or ``int64``, named in decode errors) and
    ``omitempty``. A field without ``tag`` is keyed by its name, ``int64``, not omitempty."""
    md = {"key": key, "go_int": go_int, "omitempty": omitempty}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=md)
    return field(default=default, metadata=md)


NOT_YAML = {"yaml": False}
"""Field metadata of a field that is no part of the YAML schema."""


# The reference's workload structs, fields in declaration order (the order yaml.v3 writes).
# ``spec_yaml.SCHEMA`` is derived from these declarations: the schema is stated only here.
@dataclass
class ArrivalSpec:
    """Inter-arrival process of one client: ``process`` name and optional ``cv``."""

    process: str = ""
    cv: float | None = tag(None, omitempty=True)


@dataclass
class DistSpec:
    """A token-length distribution: ``type``, float ``params`` (string keys) and ``file``."""

    type: str = ""
    params: dict[str, float] = tag(factory=dict, omitempty=True)
    file: str = tag("", omitempty=True)


@dataclass
class NetworkSpec:
    """Client network characteristics; parsed but inert in ``run`` (WL-7.4)."""

    rtt_ms: float = 0.0
    bandwidth_mbps: float = tag(0.0, omitempty=True)


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

    text_dist: DistSpec = tag(factory=DistSpec, key="text_distribution")
    image_dist: DistSpec = tag(factory=DistSpec, key="image_distribution")
    image_count_dist: DistSpec = tag(factory=DistSpec, key="image_count_distribution")
    audio_dist: DistSpec = tag(factory=DistSpec, key="audio_distribution")
    audio_count_dist: DistSpec = tag(factory=DistSpec, key="audio_count_distribution")
    video_dist: DistSpec = tag(factory=DistSpec, key="video_distribution")
    video_count_dist: DistSpec = tag(factory=DistSpec, key="video_count_distribution")


@dataclass
class MultiTurnSpec:
    """Multi-turn session shape (WL-6.2)."""

    max_rounds: int = tag(0, go_int="int")
    think_time_us: int = 0
    context_growth: str = ""
    single_session: bool = tag(False, omitempty=True)


@dataclass
class ReasoningSpec:
    """Reason-ratio distribution and optional multi-turn sessions (WL-6.2)."""

    reason_ratio_dist: DistSpec = tag(factory=DistSpec, key="reason_ratio_distribution")
    multi_turn: MultiTurnSpec | None = tag(None, omitempty=True)


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
    model: str = tag("", omitempty=True)
    adapter: str = tag("", omitempty=True)  # LoRA adapter id (LORA-1.7); "" = base model
    rate_fraction: float = 0.0
    concurrency: int = tag(0, go_int="int", omitempty=True)
    think_time_us: int = tag(0, omitempty=True)
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    input_dist: DistSpec = tag(factory=DistSpec, key="input_distribution")
    output_dist: DistSpec = tag(factory=DistSpec, key="output_distribution")
    prefix_group: str = tag("", omitempty=True)
    prefix_length: int = tag(0, go_int="int", omitempty=True)
    streaming: bool = False
    network: NetworkSpec | None = tag(None, omitempty=True)
    lifecycle: LifecycleSpec | None = tag(None, omitempty=True)
    multimodal: MultimodalSpec | None = tag(None, omitempty=True)
    reasoning: ReasoningSpec | None = tag(None, omitempty=True)
    timeout: int | None = tag(None, omitempty=True)  # µs; None = default rule, 0 = no deadline
    closed_loop: bool | None = tag(None, omitempty=True)
    arrival_factory: ArrivalFactory | None = field(default=None, metadata=NOT_YAML)


@dataclass
class DiurnalSpec:
    """24 hourly on/off windows following a cosine (WL-7.2)."""

    peak_hour: int = tag(0, go_int="int")
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
    population: int = tag(0, go_int="int")
    tenant_id: str = tag("", omitempty=True)
    slo_class: str = tag("", omitempty=True)
    model: str = tag("", omitempty=True)
    adapter: str = tag("", omitempty=True)  # LoRA adapter id (LORA-1.7); "" = base model
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    input_dist: DistSpec = tag(factory=DistSpec, key="input_distribution")
    output_dist: DistSpec = tag(factory=DistSpec, key="output_distribution")
    prefix_group: str = tag("", omitempty=True)
    streaming: bool = tag(False, omitempty=True)
    rate_fraction: float = 0.0
    diurnal: DiurnalSpec | None = tag(None, omitempty=True)
    spike: SpikeSpec | None = tag(None, omitempty=True)
    drain: DrainSpec | None = tag(None, omitempty=True)
    prefix_length: int = tag(0, go_int="int", omitempty=True)
    reasoning: ReasoningSpec | None = tag(None, omitempty=True)
    closed_loop: bool | None = tag(None, omitempty=True)
    timeout: int | None = tag(None, omitempty=True)
    network: NetworkSpec | None = tag(None, omitempty=True)
    multimodal: MultimodalSpec | None = tag(None, omitempty=True)


@dataclass
class ServeGenDataSpec:
    """ServeGen native data directory (WL-8.2); span bounds are compared in seconds."""

    path: str = ""
    span_start: int = tag(0, omitempty=True)
    span_end: int = tag(0, omitempty=True)


@dataclass
class StageSpec:
    """One inference-perf stage: ``rate`` req/s for ``duration`` seconds."""

    rate: float = 0.0
    duration: int = 0


@dataclass
class SharedPrefixSpec:
    """inference-perf shared-prefix data shape (WL-8.1)."""

    num_unique_system_prompts: int = tag(0, go_int="int")
    num_users_per_system_prompt: int = tag(0, go_int="int")
    system_prompt_len: int = tag(0, go_int="int")
    question_len: int = tag(0, go_int="int")
    output_len: int = tag(0, go_int="int")
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
    cohorts: list[CohortSpec] = tag(factory=list, omitempty=True)
    aggregate_rate: float = 0.0
    horizon: int = tag(0, omitempty=True)
    num_requests: int = tag(0, omitempty=True)
    servegen_data: ServeGenDataSpec | None = tag(None, omitempty=True)
    inference_perf: InferencePerfSpec | None = tag(None, omitempty=True)
    source: str = field(default="", compare=False, metadata=NOT_YAML)
    positions: dict[str, int] = field(default_factory=dict, compare=False, repr=False,
                                      metadata=NOT_YAML)


def has_multi_turn(c: ClientSpec | CohortSpec) -> bool:
    """Whether the client or cohort has multi-turn sessions."""
    return c.reasoning is not None and c.reasoning.multi_turn is not None


def is_closed_loop(c: ClientSpec) -> bool:
    """``isClosedLoop``: the explicit flag, else whether the client is multi-turn (WL-6.3)."""
    if c.closed_loop is not None:
        return bool(c.closed_loop)
    return has_multi_turn(c)


def upgrade_v1_to_v2(spec: WorkloadSpec) -> None:
    """Map a v1 spec to v2 in place (WL-4.2): version and deprecated client SLO names."""
    if spec.version in ("", "1"):
        spec.version = "2"
        for c in spec.clients:
            c.slo_class = V1_SLO_RENAMES.get(c.slo_class, c.slo_class)


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
