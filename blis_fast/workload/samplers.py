"""Building length, arrival and think-time samplers from a spec (WL-5.2, WL-5.3, DELTA-52/59).

A length sampler is described by an integer ``code`` and a float64 parameter vector (see
:class:`SamplerSpec`); the kernels in :mod:`blis_fast.kernels.generation.samplers` draw from it exactly as
the reference's ``LengthSampler.Sample`` does. Building a sampler from a :class:`DistSpec`
(:func:`build_sampler`) reproduces ``NewLengthSampler``'s checks; a failed build is kept as an
error message so generation can report it at the moment the reference would (the first time
that sampler is constructed). Arrival samplers are parameterised the same way
(:func:`arrival_params`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from blis_fast.gofmt import go_pct_f, go_quote, go_sscanf_int
from blis_fast.gonum import or_none, parse_float
from blis_fast.kernels.generation.samplers import (
    ARRIVAL_CONSTANT,
    ARRIVAL_GAMMA,
    ARRIVAL_POISSON,
    ARRIVAL_WEIBULL,
    DIST_CONSTANT,
    DIST_EMPIRICAL,
    DIST_LOGNORMAL,
)
from blis_fast.kernels.go.gomath import (
    go_f2i,
    go_gamma,
    go_log,
)
from blis_fast.workload.spec import (
    DIST_REQUIRED_PARAMS,
    SAMPLER_CODES,
    DistSpec,
)

log = logging.getLogger("blis_fast")

SAMPLER_ABSENT = -1
"""No sampler (distribution type ``""``)."""
SAMPLER_INVALID = -2
"""The reference's sampler constructor would fail; :attr:`SamplerSpec.error` says how."""

MAX_TOKEN_ID = 128000


@dataclass(frozen=True)
class SamplerSpec:
    """A length sampler: ``code`` (``DIST_*``), ``params`` (float64) and ``error`` if invalid.

    Parameter layouts: gaussian ``[mean, std_dev, min, max]`` (min/max already truncated to
    int), exponential ``[mean]``, constant ``[value]`` (truncated), pareto_lognormal
    ``[alpha, xm, mu, sigma, mix_weight]``, lognormal ``[mu, sigma, min, max]`` (0 = no
    bound), empirical ``[n, values..., cdf...]``.
    """

    code: int
    params: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    error: str = ""

    @property
    def valid(self) -> bool:
        """True when the sampler can be drawn from."""
        return self.code >= 0


ABSENT = SamplerSpec(SAMPLER_ABSENT)


def _f2i(v: float) -> float:
    """Go ``int(v)`` of a parameter, kept as float64 for the kernel."""
    return float(go_f2i(v))


def build_sampler(d: DistSpec) -> SamplerSpec:
    """The reference's ``NewLengthSampler(d)``: a sampler, or an invalid one with its error."""
    t = d.type
    if t not in SAMPLER_CODES:
        return SamplerSpec(SAMPLER_INVALID, error=f"unknown distribution type {go_quote(t)}")
    for key in DIST_REQUIRED_PARAMS[t]:
        if key not in d.params:
            return SamplerSpec(
                SAMPLER_INVALID, error=f"distribution requires parameter {go_quote(key)}"
            )
    p = d.params
    code = SAMPLER_CODES[t]
    if t == "gaussian":
        vec = [p["mean"], p["std_dev"], _f2i(p["min"]), _f2i(p["max"])]
    elif t == "exponential":
        vec = [p["mean"]]
    elif t == "pareto_lognormal":
        vec = [p["alpha"], p["xm"], p["mu"], p["sigma"], p["mix_weight"]]
    elif t == "lognormal":
        vec = [p["mu"], p["sigma"], _f2i(p["min"]) if "min" in p else 0.0,
               _f2i(p["max"]) if "max" in p else 0.0]
    elif t == "constant":
        vec = [_f2i(p["value"])]
    else:  # empirical
        if d.file == "" and not p:
            return SamplerSpec(
                SAMPLER_INVALID, error="empirical distribution requires a file path or inline params"
            )
        pdf: dict[int, float] = {}
        for k, v in p.items():
            val, err = go_sscanf_int(k)
            if val is None:
                return SamplerSpec(
                    SAMPLER_INVALID, error=f"empirical PDF key {go_quote(k)} is not an integer: {err}"
                )
            pdf[val] = v
        if not pdf:
            return SamplerSpec(SAMPLER_INVALID, error="empirical distribution has no valid bins")
        return SamplerSpec(DIST_EMPIRICAL, empirical_params(pdf))
    return SamplerSpec(code, np.asarray(vec, dtype=np.float64))


def empirical_params(pdf: dict[int, float]) -> np.ndarray:
    """``NewEmpiricalPDFSampler``: sorted values and their normalized CDF (last entry 1.0)."""
    keys = sorted(pdf)
    total = 0.0
    for k in keys:
        total += pdf[k]
    values: list[float] = []
    cdf: list[float] = []
    cum = 0.0
    for k in keys:
        prob = pdf[k]
        if prob <= 0:
            continue
        cum += prob / total
        values.append(float(k))
        cdf.append(cum)
    if cdf:
        cdf[-1] = 1.0
    return np.asarray([float(len(values))] + values + cdf, dtype=np.float64)


def constant_sampler(value: int) -> SamplerSpec:
    """A constant sampler (floor 1 at sampling time)."""
    return SamplerSpec(DIST_CONSTANT, np.asarray([float(value)], dtype=np.float64))





# --- arrival processes ------------------------------------------------------------------------




def weibull_shape_from_cv(target_cv: float) -> float:
    """Bisection for the Weibull shape k with the given CV (WL-5.2), Go's Gamma inside."""
    lo, hi = 0.1, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        g1 = go_gamma(1.0 + 1.0 / mid)
        g2 = go_gamma(1.0 + 2.0 / mid)
        cv = math.sqrt(g2 / (g1 * g1) - 1.0)
        if abs(cv - target_cv) < 0.001:
            return mid
        if cv > target_cv:
            lo = mid
        else:
            hi = mid
    log.warning(
        "weibullShapeFromCV: bisection did not converge for CV=%.3f after 100 iterations; "
        "using k=%.3f", target_cv, (lo + hi) / 2.0,
    )
    return (lo + hi) / 2.0


def arrival_params(process: str, cv: float | None, rate_us: float) -> tuple[int, int, float, float, float]:
    """``NewArrivalSampler``: (code, constant iat, rate, p1, p2) for a client rate in req/µs."""
    if rate_us < 1e-15:
        rate_us = 1e-15
    if process == "constant":
        return ARRIVAL_CONSTANT, max(1, int(go_f2i(1.0 / rate_us))), rate_us, 0.0, 0.0
    if process in ("gamma", "weibull"):
        c = 1.0 if cv is None else cv
        if c <= 0:
            c = 1.0
        mean = 1.0 / rate_us
        if process == "gamma":
            shape = 1.0 / (c * c)
            scale = mean * c * c
            if shape < 0.01:
                log.warning(
                    "Gamma shape %.4f (CV=%.1f) is very small; falling back to Poisson", shape, c
                )
                return ARRIVAL_POISSON, 0, rate_us, 0.0, 0.0
            return ARRIVAL_GAMMA, 0, rate_us, shape, scale
        k = weibull_shape_from_cv(c)
        return ARRIVAL_WEIBULL, 0, rate_us, k, mean / float(go_gamma(1.0 + 1.0 / k))
    return ARRIVAL_POISSON, 0, rate_us, 0.0, 0.0


# --- think-time distributions (DELTA-59) ------------------------------------------------------
def _parse_time_us(v: str) -> int:
    """``parseTimeToMicros``: suffix us, ms, s, or bare milliseconds; non-negative finite."""
    num, mult = v, 1_000.0
    for suffix, factor in (("us", 1.0), ("ms", 1_000.0), ("s", 1_000_000.0)):
        if v.endswith(suffix):
            num, mult = v[: -len(suffix)], factor
            break
    f = parse_float(num)  # NumError (a ValueError) reads as Go's error
    if f < 0 or math.isnan(f) or math.isinf(f):
        raise ValueError(f"time value must be a non-negative finite number, got {go_quote(v)}")
    return int(go_f2i(f * mult) if mult != 1.0 else go_f2i(f))


def parse_think_time_dist(text: str) -> SamplerSpec:
    """``ParseThinkTimeDist``: ``lognormal:mu=..,sigma=..[,min=..,max=..]`` or
    ``constant:value=<time>``, as a sampler of µs. Raises ValueError with the reference's text.
    """
    colon = text.find(":")
    if colon < 0:
        raise ValueError(f"think-time-dist must have format type:key=value,...; got {go_quote(text)}")
    kind, rest = text[:colon], text[colon + 1 :]
    params: dict[str, str] = {}
    if rest.strip():
        for kv in rest.split(","):
            kv = kv.strip()
            if not kv:
                continue
            eq = kv.find("=")
            if eq < 0:
                raise ValueError(
                    f"think-time-dist {go_quote(kind)}: invalid parameter {go_quote(kv)}: "
                    "expected key=value"
                )
            if kv[:eq] in params:
                raise ValueError(
                    f"think-time-dist {go_quote(kind)}: invalid parameter string: duplicate key "
                    f"{go_quote(kv[:eq])}"
                )
            params[kv[:eq]] = kv[eq + 1 :]
    if kind == "lognormal":
        for key in ("mu", "sigma"):
            if key not in params:
                raise ValueError(f'think-time-dist lognormal requires parameter "{key}"')
        mu = or_none(parse_float, params["mu"])
        if mu is None or math.isnan(mu) or math.isinf(mu):
            raise ValueError(
                f"think-time-dist lognormal: mu must be a finite number, got {go_quote(params['mu'])}"
            )
        sigma = or_none(parse_float, params["sigma"])
        if sigma is None or math.isnan(sigma) or math.isinf(sigma) or sigma <= 0:
            raise ValueError(
                "think-time-dist lognormal: sigma must be a finite positive number, got "
                f"{go_quote(params['sigma'])}"
            )
        lo = _parse_time_us(params["min"]) if "min" in params else 0
        hi = _parse_time_us(params["max"]) if "max" in params else 0
        if lo > 0 and hi > 0 and lo > hi:
            raise ValueError(
                f"think-time-dist lognormal: min ({lo} µs) must be <= max ({hi} µs)"
            )
        mu_us = mu + float(go_log(1e6))
        return SamplerSpec(DIST_LOGNORMAL, np.asarray([mu_us, sigma, float(lo), float(hi)]))
    if kind == "constant":
        if "value" not in params:
            raise ValueError('think-time-dist constant requires parameter "value"')
        return constant_sampler(_parse_time_us(params["value"]))
    raise ValueError(
        f"unsupported think-time-dist type {go_quote(kind)}; supported: lognormal, constant"
    )


__all__ = [
    "ABSENT",
    "SAMPLER_ABSENT",
    "SAMPLER_INVALID",
    "SamplerSpec",
    "arrival_params",
    "build_sampler",
    "constant_sampler",
    "empirical_params",
    "go_pct_f",
    "parse_think_time_dist",
    "weibull_shape_from_cv",
]


