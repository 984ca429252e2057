"""Workload-spec validation (WL-4.5 + DELTA-55): the reference's checks in its order.

Each failure is one ``BlisInputError`` line with the reference's wording, followed by the spec
file and line when the spec was loaded from a file. Clients and cohorts share most checks
(``_check_slo``, ``_check_arrival_process``, ``_check_cv``, ``_check_lengths``,
``_check_timeout_rounds``) but run them in their own orders, as the reference does.
"""

from __future__ import annotations

import math

from blis_fast.errors import BlisInputError
from blis_fast.gofmt import go_g, go_pct_f
from blis_fast.options import TIME_LIMIT_US
from blis_fast.workload.spec import (
    ARRIVAL_CODES,
    DIST_CODES,
    MAX_COHORT_POPULATION,
    VALID_CATEGORIES,
    VALID_SLO_CLASSES,
    ClientSpec,
    CohortSpec,
    DistSpec,
    WorkloadSpec,
    has_multi_turn,
)


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


MAX_LENGTH_PARAM = float(1 << 24)
"""Largest token-length parameter of a workload spec: samples (an exponential's tail is
under 40 means) and their sums over any request count stay far inside int64; the
reference turns a draw beyond int64 into 1 token and one just inside into an allocation of
exabytes."""
_LENGTH_PARAMS = ("mean", "std_dev", "min", "value", "xm")  # a large max only caps


def _length_dists(c) -> list[tuple[str, DistSpec]]:
    """A client's token-length distributions, by YAML key (multimodal ones included)."""
    dists = [("input_distribution", c.input_dist), ("output_distribution", c.output_dist)]
    mm = getattr(c, "multimodal", None)
    if mm is not None:
        dists += [(f"multimodal.{k}", getattr(mm, f)) for f, k in (
            ("text_dist", "text_distribution"), ("image_dist", "image_distribution"),
            ("image_count_dist", "image_count_distribution"),
            ("audio_dist", "audio_distribution"),
            ("audio_count_dist", "audio_count_distribution"),
            ("video_dist", "video_distribution"),
            ("video_count_dist", "video_count_distribution"))]
    return dists


_NON_NEGATIVE_PARAMS = ("mean", "std_dev", "sigma")  # bounds and constants: the sampler's own check
_POSITIVE_PARAMS = ("alpha", "xm")


def _check_meaningful(spec, c, path: str, p: str) -> None:
    """Values the reference accepts but that have no meaning (blis_fast is stricter here, see
    the README): negative spreads, means and bounds, a Pareto alpha or scale <= 0, a mixing
    weight outside [0, 1], negative think times and network figures."""
    for key, d in _length_dists(c):
        for name, val in d.params.items():
            where = f"{path}.{key}.params.{name}"
            if name in _LENGTH_PARAMS and d.type != "empirical" and abs(val) > MAX_LENGTH_PARAM:
                raise _fail(spec, where, f"{p}.{key}.params.{name} {go_g(val)} is more "
                                         f"tokens than blis_fast draws (at most 2^24)")
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
                          c.reasoning.multi_turn.think_time_us if has_multi_turn(c) else 0)):
        if think > TIME_LIMIT_US:
            raise _fail(spec, f"{path}.{where}", f"{p}.{where} {think} is beyond the "
                                                 "simulator's time range")
    if has_multi_turn(c) and c.reasoning.multi_turn.think_time_us < 0:
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


def _check_slo(spec, path: str, p: str, c: ClientSpec | CohortSpec) -> None:
    if c.slo_class not in VALID_SLO_CLASSES:
        raise _fail(spec, path + ".slo_class",
                    f'{p}: unknown slo_class "{c.slo_class}"; valid: critical, standard, '
                    "sheddable, batch, background, or empty")


def _check_arrival_process(spec, path: str, p: str, c: ClientSpec | CohortSpec) -> None:
    """A known arrival process, and a Weibull CV in range."""
    if c.arrival.process not in ARRIVAL_CODES:
        raise _fail(spec, path + ".arrival.process",
                    f'{p}: unknown arrival process "{c.arrival.process}"; valid: poisson, '
                    "gamma, weibull, constant")
    if c.arrival.process == "weibull" and c.arrival.cv is not None:
        cv = c.arrival.cv
        if cv < 0.01 or cv > 10.4:
            raise _fail(spec, path + ".arrival.cv",
                        f"{p}: weibull CV must be in [0.01, 10.4], got {go_pct_f(cv)}")


def _check_cv(spec, path: str, p: str, c: ClientSpec | CohortSpec) -> None:
    if c.arrival.cv is not None:
        _check_finite_positive(spec, path + ".arrival.cv", f"{p}.cv", c.arrival.cv)


def _check_prefix_length(spec, path: str, p: str, c: ClientSpec | CohortSpec) -> None:
    if c.prefix_length < 0:
        raise _fail(spec, path + ".prefix_length",
                    f"{p}: prefix_length must be non-negative, got {c.prefix_length}")


def _check_lengths(spec, path: str, p: str, c: ClientSpec | CohortSpec) -> None:
    """Both length distributions, then the values that have no meaning."""
    _check_dist(spec, path + ".input_distribution", f"{p}.input_distribution", c.input_dist)
    _check_dist(spec, path + ".output_distribution", f"{p}.output_distribution", c.output_dist)
    _check_meaningful(spec, c, path, p)


def _check_timeout_rounds(spec, path: str, p: str, c: ClientSpec | CohortSpec) -> None:
    if c.timeout is not None and c.timeout < 0:
        raise _fail(spec, path + ".timeout", f"{p}: timeout must be non-negative, got {c.timeout}")
    if has_multi_turn(c) and c.reasoning.multi_turn.max_rounds < 1:
        raise _fail(spec, path + ".reasoning.multi_turn.max_rounds",
                    f"{p}: reasoning.multi_turn.max_rounds must be >= 1, got "
                    f"{c.reasoning.multi_turn.max_rounds}")


def _validate_client(spec, c: ClientSpec, i: int) -> None:
    p = f"client[{i}]"
    path = f"clients[{i}]"
    _check_slo(spec, path, p, c)
    if c.concurrency < 0:
        raise _fail(spec, path + ".concurrency",
                    f"{p}: concurrency must be non-negative, got {c.concurrency}")
    if c.think_time_us < 0:
        raise _fail(spec, path + ".think_time_us",
                    f"{p}: think_time_us must be non-negative, got {c.think_time_us}")
    if c.concurrency > 0 and c.rate_fraction > 0:
        raise _fail(spec, path + ".concurrency",
                    f"{p}: concurrency and rate_fraction are mutually exclusive")
    if c.concurrency == 0:
        _check_finite_positive(spec, path + ".rate_fraction", f"{p}.rate_fraction",
                               c.rate_fraction)
        if c.arrival_factory is None:
            _check_arrival_process(spec, path, p, c)
        _check_cv(spec, path, p, c)
    _check_prefix_length(spec, path, p, c)
    _check_lengths(spec, path, p, c)
    _check_timeout_rounds(spec, path, p, c)
    if c.lifecycle is not None:
        if not c.lifecycle.windows:
            raise _fail(spec, path + ".lifecycle", f"{p}: lifecycle specified with no windows")
        for j, w in enumerate(c.lifecycle.windows):
            wp = f"{path}.lifecycle.windows[{j}]"
            if w.start_us < 0:
                raise _fail(spec, wp + ".start_us",
                            f"{p}: lifecycle.windows[{j}] has negative start_us ({w.start_us})")
            if w.end_us <= w.start_us:
                raise _fail(spec, wp + ".end_us",
                            f"{p}: lifecycle.windows[{j}] has end_us ({w.end_us}) <= "
                            f"start_us ({w.start_us})")


def _check_windows(spec, path: str, p: str, c: CohortSpec) -> None:
    """A cohort's diurnal, spike and drain shapes."""
    if c.diurnal is not None:
        r = c.diurnal.peak_to_trough_ratio
        if math.isnan(r) or math.isinf(r) or r < 1.0:
            raise _fail(spec, path + ".diurnal.peak_to_trough_ratio",
                        f"{p}: diurnal peak_to_trough_ratio must be a finite number >= 1.0, got "
                        f"{go_pct_f(r)}")
        if c.diurnal.peak_hour < 0 or c.diurnal.peak_hour > 23:
            raise _fail(spec, path + ".diurnal.peak_hour",
                        f"{p}: diurnal peak_hour must be 0-23, got {c.diurnal.peak_hour}")
    for name, shape, start, length in (("spike", c.spike, "start_time_us", "duration_us"),
                                       ("drain", c.drain, "start_time_us", "ramp_duration_us")):
        if shape is None:
            continue
        if getattr(shape, start) < 0:
            raise _fail(spec, f"{path}.{name}.{start}",
                        f"{p}: {name} {start} must be non-negative, got {getattr(shape, start)}")
        if getattr(shape, length) <= 0:
            raise _fail(spec, f"{path}.{name}.{length}",
                        f"{p}: {name} {length} must be > 0, got {getattr(shape, length)}")


def _validate_cohort(spec, c: CohortSpec, i: int) -> None:
    p = f"cohort[{i}]"
    path = f"cohorts[{i}]"
    if c.population <= 0:
        raise _fail(spec, path + ".population",
                    f"{p}: population must be positive, got {c.population}")
    if c.population > MAX_COHORT_POPULATION:
        raise _fail(spec, path + ".population",
                    f"{p}: population {c.population} exceeds maximum {MAX_COHORT_POPULATION}")
    _check_finite_positive(spec, path + ".rate_fraction", f"{p}.rate_fraction", c.rate_fraction)
    _check_slo(spec, path, p, c)
    _check_arrival_process(spec, path, p, c)
    _check_cv(spec, path, p, c)
    _check_lengths(spec, path, p, c)
    _check_windows(spec, path, p, c)
    _check_prefix_length(spec, path, p, c)
    _check_timeout_rounds(spec, path, p, c)


def validate_spec(spec: WorkloadSpec) -> None:
    """Validate a spec in the reference's order (WL-4.5 + DELTA-55); raise on the first failure."""
    if spec.version not in ("", "1", "2"):
        raise _fail(spec, "version", f'version "{spec.version}" is not supported (1 or 2)')
    if spec.category not in VALID_CATEGORIES:
        raise _fail(spec, "category",
                    f'unknown category "{spec.category}"; valid: language, multimodal, '
                    "reasoning")
    rate_based = any(c.concurrency == 0 for c in spec.clients) or bool(spec.cohorts)
    if rate_based:
        _check_finite_positive(spec, "aggregate_rate", "aggregate_rate", spec.aggregate_rate)
    if not spec.clients and spec.servegen_data is None and not spec.cohorts:
        raise _fail(spec, "clients", "at least one client, cohort, or servegen_data path required")
    for i, c in enumerate(spec.clients):
        _validate_client(spec, c, i)
    has_conc = any(c.concurrency > 0 for c in spec.clients)
    has_mt = any(has_multi_turn(c) for c in spec.clients) or any(
        has_multi_turn(c) for c in spec.cohorts
    )
    if has_conc and has_mt:
        raise _fail(spec, "clients",
                    "concurrency clients and multi-turn clients cannot be mixed in the same "
                    "spec: follow-up budget accounting does not support this combination")
    for i, c in enumerate(spec.cohorts):
        _validate_cohort(spec, c, i)
