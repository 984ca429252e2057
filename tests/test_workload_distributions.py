"""Arrival processes and length distributions (WL-5.2, WL-5.3, DELTA-52, DELTA-59): 100,000-sample
statistics against the analytic distributions, Go math ports, sampler edge rules, windows."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from blis_fast.gofmt import go_f, go_g, go_sscanf_int
from blis_fast.kernels.generation.samplers import (
    normalized_exp_intervals,
    sample_iats,
    sample_lengths,
)
from blis_fast.kernels.go import gomath as gm
from blis_fast.kernels.go.gorand import new_source
from blis_fast.workload.expand import diurnal_windows, drain_windows, expand_cohorts
from blis_fast.workload.samplers import (
    arrival_params,
    build_sampler,
    parse_think_time_dist,
    weibull_shape_from_cv,
)
from blis_fast.workload.spec import (
    ArrivalSpec,
    CohortSpec,
    DistSpec,
    DiurnalSpec,
    DrainSpec,
    SpikeSpec,
)

N = 100_000
RATE = 1e-4  # requests per µs: mean inter-arrival 10 ms


def _iats(process: str, cv: float | None, seed: int = 11) -> np.ndarray:
    code, iat, rate, p1, p2 = arrival_params(process, cv, RATE)
    return sample_iats(seed, code, iat, rate, p1, p2, N).astype(np.float64)


def _cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def _ecdf(x: np.ndarray, v: float) -> float:
    return float(np.mean(x <= v))


# --- arrival processes ------------------------------------------------------------------------
def test_poisson_arrivals():
    """Exponential IATs: mean 1/rate (truncation loses ~0.5 µs), CV 1, exponential quantiles."""
    x = _iats("poisson", None)
    assert abs(x.mean() / 1e4 - 1) < 0.015
    assert abs(_cv(x) - 1) < 0.02
    for q in (0.1, 0.5, 0.9, 0.99):
        v = -math.log(1 - q) / RATE
        assert abs(_ecdf(x, v) - q) < 0.006, q


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.5, 5.0])
def test_gamma_arrivals(cv):
    """Gamma IATs (Marsaglia-Tsang; boosted for shape < 1): mean, CV and quantiles."""
    x = _iats("gamma", cv)
    assert abs(x.mean() / 1e4 - 1) < 0.02 * max(1.0, cv)
    assert abs(_cv(x) / cv - 1) < 0.03 * max(1.0, cv)
    stats = pytest.importorskip("scipy.stats")
    shape, scale = 1 / (cv * cv), 1e4 * cv * cv
    for q in (0.25, 0.5, 0.75, 0.95):
        v = float(stats.gamma.ppf(q, shape, scale=scale))
        if v >= 2:  # below that the max(1, trunc) floor dominates
            assert abs(_ecdf(x, math.floor(v)) - q) < 0.008, (cv, q)


def test_gamma_cv_above_ten_falls_back_to_poisson():
    """Shape < 0.01 (cv > 10) uses the Poisson sampler (WL-5.2)."""
    assert arrival_params("gamma", 12.0, RATE)[0] == arrival_params("poisson", None, RATE)[0]
    assert arrival_params("gamma", None, RATE)[3] == 1.0  # nil cv -> 1
    assert arrival_params("gamma", -2.0, RATE)[3] == 1.0  # cv <= 0 -> 1


@pytest.mark.parametrize("cv", [0.3, 1.0, 1.5, 3.0])
def test_weibull_arrivals(cv):
    """Weibull IATs: shape from the CV bisection, scale from Go's Gamma; mean, CV, quantiles."""
    k = weibull_shape_from_cv(cv)
    g1, g2 = math.gamma(1 + 1 / k), math.gamma(1 + 2 / k)
    assert abs(math.sqrt(g2 / (g1 * g1) - 1) - cv) < 0.0011
    x = _iats("weibull", cv)
    assert abs(x.mean() / 1e4 - 1) < 0.02 * max(1.0, cv)
    assert abs(_cv(x) / cv - 1) < 0.03 * max(1.0, cv)
    lam = 1e4 / g1
    for q in (0.1, 0.5, 0.9):
        v = lam * (-math.log(1 - q)) ** (1 / k)
        assert abs(_ecdf(x, math.floor(v)) - q) < 0.008, (cv, q)


def test_weibull_low_cv_does_not_converge():
    """cv 0.01 is unreachable on [0.1, 100]: bisection ends near k = 100."""
    assert weibull_shape_from_cv(0.01) > 99.0


def test_constant_arrivals():
    """Constant process: trunc(1/rate), floored at 1, no draws (rate 10/s -> 99,999 µs)."""
    code, iat, rate, _p1, _p2 = arrival_params("constant", None, 10.0 * 1.0 / 1e6)
    assert iat == 99_999
    x = sample_iats(3, code, iat, rate, 0.0, 0.0, 1000)
    assert (x == 99_999).all()
    assert arrival_params("constant", None, 5.0)[1] == 1
    assert arrival_params("constant", None, 0.0)[1] == 999_999_999_999_999  # 1/1e-15, truncated


def test_normalized_exponential_sampler():
    """DELTA-52: n intervals scaled to the duration (sum <= D, each >= 1), exponential shape."""
    iv = normalized_exp_intervals(new_source(5), 10_000, 600_000_000)
    assert iv.shape == (10_000,) and iv.min() >= 1
    assert 600_000_000 - 10_000 <= iv.sum() <= 600_000_000
    assert abs(_cv(iv.astype(float)) - 1) < 0.03


# --- length distributions ---------------------------------------------------------------------
def _lengths(dist: DistSpec, seed: int = 21, n: int = N) -> np.ndarray:
    s = build_sampler(dist)
    assert s.valid, s.error
    return sample_lengths(seed, s.code, s.params, n)


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def test_gaussian_lengths():
    """Clamped, rounded half away from zero, floored at 1; min == max returns min undrawn."""
    x = _lengths(DistSpec("gaussian", {"mean": 500, "std_dev": 100, "min": 100, "max": 900}))
    assert abs(x.mean() - 500) < 1.5 and abs(x.std() - 100) < 1.5
    assert x.min() >= 100 and x.max() <= 900
    for v in (400, 500, 650):
        assert abs(_ecdf(x, v) - _phi((v + 0.5 - 500) / 100)) < 0.006
    clamp = _lengths(DistSpec("gaussian", {"mean": 0, "std_dev": 50, "min": -10, "max": 5}))
    assert clamp.min() == 1 and clamp.max() == 5  # floor at 1 after the clamp
    same = _lengths(DistSpec("gaussian", {"mean": 0, "std_dev": 50, "min": -3.7, "max": -3.2}), n=5)
    assert (same == -3).all()  # trunc(min) == trunc(max): no draw, no floor


def test_exponential_lengths():
    """round(Exp*mean), floor 1, no upper clamp."""
    x = _lengths(DistSpec("exponential", {"mean": 400}))
    assert abs(x.mean() / 400 - 1) < 0.015 and x.min() >= 1
    for q in (0.25, 0.5, 0.9):
        v = -math.log(1 - q) * 400
        assert abs(_ecdf(x, math.floor(v)) - q) < 0.006


def test_pareto_lognormal_lengths():
    """Mixture: Pareto(alpha, xm) with probability mix_weight, else LogNormal(mu, sigma)."""
    p = {"alpha": 1.8, "xm": 40, "mu": 5.0, "sigma": 1.0, "mix_weight": 0.4}
    x = _lengths(DistSpec("pareto_lognormal", p))

    def cdf(v: float) -> float:
        par = 1 - (p["xm"] / v) ** p["alpha"] if v >= p["xm"] else 0.0
        ln = _phi((math.log(v) - p["mu"]) / p["sigma"])
        return p["mix_weight"] * par + (1 - p["mix_weight"]) * ln

    for v in (30, 60, 100, 150, 300, 1000, 5000):
        assert abs(_ecdf(x, v) - cdf(v + 0.5)) < 0.006, v
    assert x.min() >= 1


def test_empirical_lengths():
    """Keys parsed as leading integers and sorted, probabilities normalized; bisect_left."""
    x = _lengths(DistSpec("empirical", {"256": 0.5, "64": 0.2, "1024": 0.3}))
    for v, prob in ((64, 0.2), (256, 0.5), (1024, 0.3)):
        assert abs(np.mean(x == v) - prob) < 0.006
    w = _lengths(DistSpec("empirical", {"10x": 2.0, "20": 0.0, "30": 6.0}))  # "10x" -> 10
    assert set(np.unique(w)) == {10, 30} and abs(np.mean(w == 10) - 0.25) < 0.006
    one = _lengths(DistSpec("empirical", {"0": 1.0}), n=4)
    assert (one == 0).all()  # single bin: no draw, no floor
    assert not build_sampler(DistSpec("empirical", {})).valid
    assert build_sampler(DistSpec("empirical", {}, file="x.json")).error == (
        "empirical distribution has no valid bins")


def test_constant_and_lognormal_lengths():
    """constant: trunc, floor 1, no draw; lognormal (DELTA-59): round, clamps, floor."""
    assert (_lengths(DistSpec("constant", {"value": 0}), n=3) == 1).all()
    assert (_lengths(DistSpec("constant", {"value": 7.9}), n=3) == 7).all()
    x = _lengths(DistSpec("lognormal", {"mu": 5.0, "sigma": 0.5, "min": 50, "max": 400}))
    assert abs(np.median(x) - round(math.exp(5.0))) <= 2
    assert x.min() >= 50 and x.max() <= 400
    assert abs(_ecdf(x, 200) - _phi((math.log(200.5) - 5.0) / 0.5)) < 0.006
    assert not build_sampler(DistSpec("lognormal", {"mu": 1.0})).valid


def test_sampler_build_errors():
    """NewLengthSampler's messages (reported later with the client id)."""
    assert build_sampler(DistSpec("gaussian", {"mean": 1})).error == (
        'distribution requires parameter "std_dev"')
    assert build_sampler(DistSpec("zipf")).error == 'unknown distribution type "zipf"'
    assert build_sampler(DistSpec("empirical", {"a": 1})).error == (
        'empirical PDF key "a" is not an integer: expected integer')


def test_think_time_dist_parsing():
    """DELTA-59 think-time strings: lognormal in log-seconds (µs out), constant with units."""
    s = parse_think_time_dist("constant:value=500ms")
    assert s.params.tolist() == [500_000.0]
    s = parse_think_time_dist("lognormal:mu=0,sigma=0.5,min=100ms,max=3s")
    assert s.params[2:].tolist() == [100_000.0, 3_000_000.0]
    assert abs(s.params[0] - math.log(1e6)) < 1e-12
    x = sample_lengths(1, s.code, s.params, N)
    assert abs(np.median(x) - 1e6) / 1e6 < 0.02
    with pytest.raises(ValueError, match="duplicate key"):
        parse_think_time_dist("lognormal:mu=1,mu=2,sigma=1")
    with pytest.raises(ValueError, match="sigma must be a finite positive number"):
        parse_think_time_dist("lognormal:mu=1,sigma=0")


# --- Go math ports ----------------------------------------------------------------------------
def test_go_math_ports_are_close_to_libm():
    """The ports differ from libm by a few ulp at most (they exist to match Go's last ulp)."""
    rng = np.random.default_rng(0)
    for x in rng.uniform(-700, 700, 2000):
        assert math.isclose(gm.go_exp(x), math.exp(x), rel_tol=4e-16)
    for x in rng.uniform(1e-300, 1e300, 2000):
        assert math.isclose(gm.go_log(x), math.log(x), rel_tol=4e-16)
    for x, y in zip(rng.uniform(0, 1, 2000), rng.uniform(0.01, 12, 2000), strict=True):
        assert math.isclose(gm.go_pow(x, y), x**y, rel_tol=2e-15)
    for x in rng.uniform(1.0, 30.0, 2000):
        assert math.isclose(gm.go_gamma(x), math.gamma(x), rel_tol=3e-15)
    for x in rng.uniform(-7, 7, 2000):
        assert abs(gm.go_cos(x) - math.cos(x)) < 3e-16
    assert gm.go_exp(709.8) == math.inf and gm.go_exp(-800.0) == 0.0
    assert gm.go_pow(0.0, -1.0) == math.inf and gm.go_pow(2.0, 3.0) == 8.0
    assert gm.go_gamma(2.0) == 1.0 and gm.go_gamma(5.0) == 24.0


def test_emulated_fma_is_correctly_rounded():
    """The amd64 Exp uses fused multiply-adds; the emulation rounds a*b+c exactly once."""
    rng = np.random.default_rng(1)
    for a, b, c in rng.uniform(-10, 10, (5000, 3)):
        exact = Fraction(a) * Fraction(b) + Fraction(c)
        assert gm.fma(a, b, c) == float(exact)


def test_go_conversions_and_rounding():
    """int64(x) on amd64, math.Round halves away from zero, Min/Max NaN rules."""
    assert gm.go_f2i(float("nan")) == -(1 << 63) and gm.go_f2i(1e19) == -(1 << 63)
    assert gm.go_f2i(-2.9) == -2
    assert gm.go_round(2.5) == 3.0 and gm.go_round(-2.5) == -3.0 and gm.go_round(0.49999) == 0.0
    assert math.isnan(gm.go_max(1.0, math.nan)) and gm.go_max(math.nan, math.inf) == math.inf
    assert gm.go_min(-math.inf, math.nan) == -math.inf


def test_go_text_helpers():
    """FormatFloat 'g'/-1 and 'f'/-1 and Sscanf("%d") as Go behaves (ParseFloat:
    tests/test_go_numbers.py)."""
    assert [go_g(v) for v in (1.0, 1e6, 123456.0, 1e-5, 0.3)] == ["1", "1e+06", "123456",
                                                                   "1e-05", "0.3"]
    assert [go_f(v) for v in (0.01, 1e-7, 0.0, 1.0, 0.72)] == ["0.01", "0.0000001", "0", "1",
                                                               "0.72"]
    assert go_sscanf_int(" -12abc") == (-12, "")
    assert go_sscanf_int("x")[1] == "expected integer"


# --- windows (WL-7.2) -------------------------------------------------------------------------
def test_cohort_windows_and_expansion():
    """Diurnal duty cycles, spike and drain windows; members split the cohort's fraction."""
    d = diurnal_windows(DiurnalSpec(peak_hour=14, peak_to_trough_ratio=3.0))
    assert len(d) == 24 and d[14].end_us - d[14].start_us == 3_600_000_000
    assert d[2].end_us - d[2].start_us == 1_200_000_000  # trough: 1/R of the hour
    dr = drain_windows(DrainSpec(start_time_us=5_000_000, ramp_duration_us=4_000_000))
    assert dr[0].start_us == 0 and dr[0].end_us == 5_000_000 and len(dr) == 11
    assert [w.end_us - w.start_us for w in dr[1:]] == [400_000 * (10 - i) // 10 for i in range(10)]
    cohort = CohortSpec(id="c", population=4, rate_fraction=0.2, arrival=ArrivalSpec("poisson"),
                        spike=SpikeSpec(100, 50), prefix_length=64)
    members = expand_cohorts([cohort])
    assert [m.id for m in members] == ["c-0", "c-1", "c-2", "c-3"]
    assert members[0].rate_fraction == 0.05 and members[0].prefix_length == 64
    assert members[0].lifecycle.windows[0].start_us == 100
    assert members[0].lifecycle.windows[0].end_us == 150
