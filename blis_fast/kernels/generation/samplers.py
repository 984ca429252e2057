"""Length and inter-arrival samplers of the workload generator (WL-5.2, WL-5.3, DELTA-52/59).

Each draws from a Go ``math/rand`` state exactly as the reference's ``LengthSampler.Sample`` /
``ArrivalSampler.SampleIAT`` do. A length sampler is an integer ``code`` and a float64
parameter vector (layouts in :class:`blis_fast.workload.samplers.SamplerSpec`, which builds
them from a spec); arrival processes take ``(code, iat_const, rate, p1, p2)``.
"""

from __future__ import annotations

import math

import numpy as np

from blis_fast.kernels.go.gomath import go_exp, go_f2i, go_log, go_max, go_min, go_pow, go_round
from blis_fast.kernels.go.gorand import exp_float64, float64_, new_source, norm_float64
from blis_fast.kernels.jit import njit

# --- arrival process codes --------------------------------------------------------------------
ARRIVAL_CONSTANT = 0
ARRIVAL_POISSON = 1
ARRIVAL_GAMMA = 2
ARRIVAL_WEIBULL = 3
ARRIVAL_NORMALIZED_EXP = 4  # inference-perf factory (DELTA-52), not expressible in YAML
ARRIVAL_FACTORY_POISSON = 5  # inference-perf multi-stage factory (DELTA-53)

# --- length distribution codes ----------------------------------------------------------------
DIST_GAUSSIAN = 0
DIST_EXPONENTIAL = 1
DIST_CONSTANT = 2
DIST_PARETO_LOGNORMAL = 3
DIST_EMPIRICAL = 4
DIST_LOGNORMAL = 5
DIST_SEQUENCE = 6
"""Replays ``params`` in order, wrapping (a cursor per session: closed-loop replay only)."""

# parameter layout of a gaussian sampler (``workload.samplers.SamplerSpec``)
GAUSSIAN_MEAN = 0
GAUSSIAN_STD = 1
GAUSSIAN_MIN = 2
GAUSSIAN_MAX = 3

SMALLEST_NONZERO = 5e-324


@njit(cache=True)
def _clamp_pos(r: int) -> int:
    return r if r >= 1 else np.int64(1)


@njit(cache=True)
def sample_length_at(s: np.ndarray, code: int, sp: np.ndarray, off: int) -> int:
    """One length sample; the sampler's parameters start at ``sp[off]``."""
    if code == DIST_GAUSSIAN:
        lo = sp[off + GAUSSIAN_MIN]
        hi = sp[off + GAUSSIAN_MAX]
        if lo == hi:
            return np.int64(lo)  # no draw and no floor
        v = norm_float64(s) * sp[off + GAUSSIAN_STD] + sp[off + GAUSSIAN_MEAN]
        c = go_min(hi, go_max(lo, v))
        return _clamp_pos(go_f2i(go_round(c)))
    if code == DIST_EXPONENTIAL:
        return _clamp_pos(go_f2i(go_round(exp_float64(s) * sp[off])))
    if code == DIST_CONSTANT:
        return _clamp_pos(np.int64(sp[off]))
    if code == DIST_PARETO_LOGNORMAL:
        if float64_(s) < sp[off + 4]:
            u = float64_(s)
            if u == 0.0:
                u = SMALLEST_NONZERO
            v = sp[off + 1] / go_pow(u, 1.0 / sp[off])
        else:
            z = norm_float64(s)
            v = go_exp(sp[off + 2] + sp[off + 3] * z)
        if math.isinf(v) or v != v:
            return np.int64(1)
        return _clamp_pos(go_f2i(go_round(v)))
    if code == DIST_LOGNORMAL:
        z = norm_float64(s)
        v = go_exp(sp[off] + sp[off + 1] * z)
        lo = np.int64(sp[off + 2])
        hi = np.int64(sp[off + 3])
        if math.isinf(v) or v != v:
            if lo > 0:
                return lo
            return np.int64(1)
        r = go_f2i(go_round(v))
        if lo > 0 and r < lo:
            r = lo
        if hi > 0 and r > hi:
            r = hi
        return _clamp_pos(r)
    if code == DIST_EMPIRICAL:
        n = np.int64(sp[off])
        if n == 0:
            return np.int64(1)
        if n == 1:
            return np.int64(sp[off + 1])
        u = float64_(s)
        base = off + 1 + n
        lo_i = np.int64(0)
        hi_i = n
        while lo_i < hi_i:  # sort.SearchFloat64s: first cdf[i] >= u
            mid = (lo_i + hi_i) // 2
            if sp[base + mid] < u:
                lo_i = mid + 1
            else:
                hi_i = mid
        if lo_i >= n:
            lo_i = n - 1
        return np.int64(sp[off + 1 + lo_i])
    return np.int64(1)


@njit(cache=True)
def sample_length(s: np.ndarray, code: int, params: np.ndarray) -> int:
    """One draw of the sampler ``(code, params)`` from Go RNG state ``s`` (for the engine)."""
    return sample_length_at(s, code, params, 0)


@njit(cache=True)
def gamma_rand(s: np.ndarray, shape: float, scale: float) -> float:
    """Go ``gammaRand``: Marsaglia-Tsang, with the U^(1/shape) boost for shape < 1."""
    boost = 1.0
    if shape < 1.0:
        # Go draws U first, then samples Gamma(shape + 1) and scales it by U^(1/shape);
        # multiplying by the exact 1.0 of the other branch leaves its value unchanged.
        boost = go_pow(float64_(s), 1.0 / shape)
        shape = shape + 1.0
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = 0.0
        v = 0.0
        while True:
            x = norm_float64(s)
            v = 1.0 + c * x
            if v > 0:
                break
        v = v * v * v
        u = float64_(s)
        if u < 1.0 - 0.0331 * (x * x) * (x * x):
            return d * v * scale * boost
        if go_log(u) < 0.5 * x * x + d * (1.0 - v + go_log(v)):
            return d * v * scale * boost


@njit(cache=True)
def _iat_floor(x: float) -> int:
    r = go_f2i(x)
    return r if r >= 1 else np.int64(1)


@njit(cache=True)
def sample_iat(s: np.ndarray, code: int, iat_const: int, rate: float, p1: float, p2: float) -> int:
    """One inter-arrival time (µs, >= 1) of a stateless arrival process (WL-5.2)."""
    if code == ARRIVAL_CONSTANT:
        return iat_const
    if code == ARRIVAL_GAMMA:
        return _iat_floor(gamma_rand(s, p1, p2))
    if code == ARRIVAL_WEIBULL:
        u = float64_(s)
        if u == 0.0:
            u = SMALLEST_NONZERO
        return _iat_floor(p2 * go_pow(-go_log(u), 1.0 / p1))
    # ARRIVAL_POISSON and ARRIVAL_FACTORY_POISSON
    return _iat_floor(exp_float64(s) / rate)


@njit(cache=True)
def normalized_exp_intervals(s: np.ndarray, count: int, duration_us: int) -> np.ndarray:
    """NewNormalizedExponentialSampler: ``count`` intervals scaled to sum to ``duration_us``."""
    rate = float(count) / float(duration_us)
    raw = np.empty(count, dtype=np.float64)
    for i in range(count):
        raw[i] = exp_float64(s) / rate
    total = 0.0
    for i in range(count):
        total += raw[i]
    scale = float(duration_us) / total
    out = np.empty(count, dtype=np.int64)
    for i in range(count):
        out[i] = _iat_floor(raw[i] * scale)
    return out


@njit(cache=True)
def sample_lengths(seed: int, code: int, params: np.ndarray, count: int) -> np.ndarray:
    """``count`` successive draws of one length sampler from ``NewSource(seed)`` (tests, tools)."""
    s = new_source(seed)
    out = np.empty(count, dtype=np.int64)
    for i in range(count):
        out[i] = sample_length_at(s, code, params, 0)
    return out


@njit(cache=True)
def sample_iats(seed: int, code: int, iat_const: int, rate: float, p1: float, p2: float,
                count: int) -> np.ndarray:
    """``count`` successive inter-arrival times of one arrival process from ``NewSource(seed)``."""
    s = new_source(seed)
    out = np.empty(count, dtype=np.int64)
    for i in range(count):
        out[i] = sample_iat(s, code, iat_const, rate, p1, p2)
    return out
