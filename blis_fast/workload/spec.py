"""Workload-spec model (spec WL-4): dataclasses mirroring the reference's v2 WorkloadSpec.

Only the fields the generator supports today are modelled; the integer codes below leave room
for the remaining arrival processes (gamma, weibull) and length distributions
(pareto_lognormal, empirical) without changing the kernel's signature.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from blis_fast.errors import BlisInputError

# --- integer codes used by the generation kernel -----------------------------------------
ARRIVAL_CONSTANT = 0
ARRIVAL_POISSON = 1
ARRIVAL_GAMMA = 2
ARRIVAL_WEIBULL = 3

ARRIVAL_CODES: dict[str, int] = {
    "constant": ARRIVAL_CONSTANT,
    "poisson": ARRIVAL_POISSON,
    "gamma": ARRIVAL_GAMMA,
    "weibull": ARRIVAL_WEIBULL,
}
"""Every arrival process the reference accepts (WL-4.5), by name."""

IMPLEMENTED_ARRIVALS = frozenset({"constant", "poisson"})
"""Arrival processes the generator implements so far."""

DIST_GAUSSIAN = 0
DIST_EXPONENTIAL = 1
DIST_CONSTANT = 2
DIST_PARETO_LOGNORMAL = 3
DIST_EMPIRICAL = 4

DIST_CODES: dict[str, int] = {
    "gaussian": DIST_GAUSSIAN,
    "exponential": DIST_EXPONENTIAL,
    "constant": DIST_CONSTANT,
    "pareto_lognormal": DIST_PARETO_LOGNORMAL,
    "empirical": DIST_EMPIRICAL,
}
"""Every length distribution the reference accepts (WL-4.5), by name."""

IMPLEMENTED_DISTS = frozenset({"gaussian", "exponential", "constant"})
"""Length distributions the generator implements so far."""

DIST_REQUIRED_PARAMS: dict[str, tuple[str, ...]] = {
    "gaussian": ("mean", "std_dev", "min", "max"),
    "exponential": ("mean",),
    "constant": ("value",),
    "pareto_lognormal": ("alpha", "xm", "mu", "sigma", "mix_weight"),
    "empirical": (),
}
"""Parameters each distribution requires when its sampler is built (WL-5.3)."""

VALID_CATEGORIES = frozenset({"", "language", "multimodal", "reasoning"})
VALID_SLO_CLASSES = frozenset({"", "critical", "standard", "sheddable", "batch", "background"})
V1_SLO_RENAMES = {"realtime": "critical", "interactive": "standard"}

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
    """A token-length distribution: ``type`` name, float ``params`` and (unused) ``file``."""

    type: str = ""
    params: dict[str, float] = field(default_factory=dict)
    file: str = ""


@dataclass
class ActiveWindow:
    """One lifecycle window: the client is active for ``start_us <= t < end_us``."""

    start_us: int
    end_us: int


@dataclass
class LifecycleSpec:
    """Activity windows of a client (arrivals outside every window are skipped)."""

    windows: list[ActiveWindow] = field(default_factory=list)


@dataclass
class ClientSpec:
    """One traffic source of a workload spec (WL-4.4, the subset the generator supports)."""

    id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    model: str = ""
    rate_fraction: float = 0.0
    arrival: ArrivalSpec = field(default_factory=ArrivalSpec)
    input_dist: DistSpec = field(default_factory=DistSpec)
    output_dist: DistSpec = field(default_factory=DistSpec)
    prefix_group: str = ""
    prefix_length: int = 0
    streaming: bool = False
    lifecycle: LifecycleSpec | None = None
    timeout: int | None = None  # µs; None = default rule, 0 = no deadline
    closed_loop: bool | None = None


@dataclass
class WorkloadSpec:
    """A v2 workload spec: seed, rate, request cap, horizon and clients (WL-4.3)."""

    version: str = "2"
    seed: int = 0
    category: str = ""
    clients: list[ClientSpec] = field(default_factory=list)
    aggregate_rate: float = 0.0
    horizon: int = 0
    num_requests: int = 0


def _go_float(v: float) -> str:
    """Format a float like Go's ``%f`` (NaN, +Inf, -Inf spelled the Go way)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:f}"


def _check_finite_positive(name: str, v: float) -> None:
    """Raise unless ``v`` is finite and > 0 (reference message wording)."""
    if math.isnan(v) or math.isinf(v):
        raise BlisInputError(f"{name} must be a finite number, got {_go_float(v)}")
    if v <= 0:
        raise BlisInputError(f"{name} must be positive, got {_go_float(v)}")


def _check_dist(prefix: str, d: DistSpec) -> None:
    """Validate a distribution's type and the finiteness of its params (WL-4.5 step 4.7)."""
    if d.type not in DIST_CODES:
        raise BlisInputError(
            f'{prefix}: unknown distribution type "{d.type}"; valid: gaussian, exponential, '
            "pareto_lognormal, empirical, constant"
        )
    for name, val in d.params.items():
        if math.isnan(val) or math.isinf(val):
            raise BlisInputError(
                f"{prefix}.params.{name} must be a finite number, got {_go_float(val)}"
            )


def upgrade_v1_to_v2(spec: WorkloadSpec) -> None:
    """Map a v1 spec to v2 in place (WL-4.2): version and deprecated client SLO names."""
    if spec.version in ("", "1"):
        spec.version = "2"
        for c in spec.clients:
            c.slo_class = V1_SLO_RENAMES.get(c.slo_class, c.slo_class)


def validate_spec(spec: WorkloadSpec) -> None:
    """Validate a spec in the reference's order (WL-4.5); raise BlisInputError on the first failure."""
    if spec.category not in VALID_CATEGORIES:
        raise BlisInputError(
            f'unknown category "{spec.category}"; valid: language, multimodal, reasoning'
        )
    if spec.clients:
        _check_finite_positive("aggregate_rate", spec.aggregate_rate)
    if not spec.clients:
        raise BlisInputError("at least one client, cohort, or servegen_data path required")
    for i, c in enumerate(spec.clients):
        p = f"client[{i}]"
        if c.slo_class not in VALID_SLO_CLASSES:
            raise BlisInputError(
                f'{p}: unknown slo_class "{c.slo_class}"; valid: critical, standard, '
                "sheddable, batch, background, or empty"
            )
        _check_finite_positive(f"{p}.rate_fraction", c.rate_fraction)
        if c.arrival.process not in ARRIVAL_CODES:
            raise BlisInputError(
                f'{p}: unknown arrival process "{c.arrival.process}"; valid: poisson, gamma, '
                "weibull, constant"
            )
        if c.arrival.process == "weibull" and c.arrival.cv is not None:
            if c.arrival.cv < 0.01 or c.arrival.cv > 10.4:
                raise BlisInputError(
                    f"{p}: weibull CV must be in [0.01, 10.4], got {_go_float(c.arrival.cv)}"
                )
        if c.arrival.cv is not None:
            _check_finite_positive(f"{p}.cv", c.arrival.cv)
        if c.prefix_length < 0:
            raise BlisInputError(f"{p}: prefix_length must be non-negative, got {c.prefix_length}")
        _check_dist(f"{p}.input_distribution", c.input_dist)
        _check_dist(f"{p}.output_distribution", c.output_dist)
        if c.timeout is not None and c.timeout < 0:
            raise BlisInputError(f"{p}: timeout must be non-negative, got {c.timeout}")
        if c.lifecycle is not None:
            if not c.lifecycle.windows:
                raise BlisInputError(f"{p}: lifecycle specified with no windows")
            for j, w in enumerate(c.lifecycle.windows):
                if w.start_us < 0:
                    raise BlisInputError(
                        f"{p}: lifecycle.windows[{j}] has negative start_us ({w.start_us})"
                    )
                if w.end_us <= w.start_us:
                    raise BlisInputError(
                        f"{p}: lifecycle.windows[{j}] has end_us ({w.end_us}) <= "
                        f"start_us ({w.start_us})"
                    )


def apply_timeout_to_spec(spec: WorkloadSpec, timeout_s: int) -> None:
    """Set every client's timeout from ``--timeout`` seconds (DELTA-28): T*1e6 µs, or 0 if T < 0."""
    if timeout_s == 0:
        raise ValueError("timeout 0 must be rejected by the caller (use a negative value)")
    us = int(timeout_s) * 1_000_000 if timeout_s > 0 else 0
    for c in spec.clients:
        c.timeout = us
