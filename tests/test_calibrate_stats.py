"""The statistics of ``blis calibrate`` (CAL-4) against hand-computed values and NumPy twins.

NumPy sums pairwise and sorts differently inside, so the twins agree to ~1e-12 relative, not
bit for bit; the bit-exact agreement with the reference is the parity cases' job.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.calibrate.stats import (
    compare_metric,
    mape_and_bias,
    pearson_r,
    percentile_sorted,
    quality_grade,
)

latencies = st.lists(st.floats(min_value=0.0, max_value=1e7, allow_nan=False), min_size=3,
                     max_size=60)


def test_percentile_hand_values():
    xs = [10.0, 20.0, 30.0, 40.0]
    assert percentile_sorted(xs, 50) == 25.0  # rank 1.5
    assert percentile_sorted(xs, 90) == pytest.approx(37.0, rel=1e-15)  # rank 2.7
    assert percentile_sorted(xs, 99) == pytest.approx(39.7, rel=1e-15)  # rank 2.97
    assert percentile_sorted([10.0, 20.0, 30.0], 50) == 20.0  # integer rank: no interpolation
    assert percentile_sorted([7.0], 99) == 7.0
    assert percentile_sorted([], 50) == 0.0


@settings(max_examples=60, deadline=None)
@given(latencies, st.sampled_from([50, 90, 95, 99]))
def test_percentile_matches_numpy_linear(values, p):
    expected = float(np.percentile(np.array(values), p, method="linear"))
    assert percentile_sorted(sorted(values), p) == pytest.approx(expected, rel=1e-12, abs=1e-9)


def test_pearson_hand_value():
    # dx = (-1, 0, 1), dy = (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114/9)
    assert pearson_r([1.0, 2.0, 3.0], [2.0, 4.0, 7.0]) == pytest.approx(
        5 / math.sqrt(2 * 114 / 9), rel=1e-14)
    assert pearson_r([1.0, 2.0, 3.0], [6.0, 4.0, 2.0]) == pytest.approx(-1.0, rel=1e-15)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 1e6), st.floats(1.0, 1e6)), min_size=3, max_size=50))
def test_pearson_matches_numpy(pairs):
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    if np.ptp(x) < 1e-3 * x.max() or np.ptp(y) < 1e-3 * y.max():
        return  # near-constant sides: the single-pass formula loses digits by design
    expected = float(np.corrcoef(x, y)[0, 1])
    assert pearson_r(x.tolist(), y.tolist()) == pytest.approx(expected, rel=1e-7, abs=1e-7)


def test_pearson_fewer_than_three_pairs_and_constant_side_are_zero():
    assert pearson_r([1.0, 2.0], [3.0, 5.0]) == 0.0
    assert pearson_r([1.0, 2.0, 4.0], [25000.0, 25000.0, 25000.0]) == 0.0  # den exactly 0


def test_pearson_negative_rounding_residue_is_nan_like_the_reference():
    # Five 0.7s: n*sum(y^2) - sum(y)^2 = -1.8e-15 in float64 (case cal-invalid-pearson-nan-residue)
    assert math.isnan(pearson_r([1.0, 2.0, 3.0, 4.0, 5.0], [0.7] * 5))


def test_mape_and_bias_skip_zero_real_values():
    mape, bias = mape_and_bias([100.0, 200.0, 0.0], [110.0, 150.0, 5.0])
    assert mape == pytest.approx((0.1 + 0.25) / 2, rel=1e-15)
    assert bias == "under-predict"  # +10 - 50 (the 0-real pair is left out)
    assert mape_and_bias([100.0], [120.0]) == (pytest.approx(0.2), "over-predict")
    assert mape_and_bias([100.0, 100.0], [90.0, 110.0]) == (pytest.approx(0.1), "neutral")
    assert mape_and_bias([0.0, 0.0], [1.0, 2.0]) == (0.0, "")


@pytest.mark.parametrize(("mape", "r", "grade"), [
    (0.0999, 0.951, "excellent"), (0.10, 0.99, "good"), (0.05, 0.95, "good"),
    (0.1999, 0.851, "good"), (0.20, 0.99, "fair"), (0.3499, 0.701, "fair"),
    (0.35, 0.99, "poor"), (0.01, 0.70, "poor"), (0.01, math.nan, "poor"),
])
def test_quality_grade_thresholds(mape, r, grade):
    assert quality_grade(mape, r) == grade


def test_compare_metric_workload_and_request_levels():
    real = [100.0, 200.0, 300.0, 400.0]
    sim = [110.0, 190.0, 330.0, 380.0]
    m = compare_metric(real, sim)
    w = m["workload_level"]
    assert list(w) == ["real_mean", "sim_mean", "mean_error", "mean_percent_error",
                       "real_median", "sim_median", "median_error", "median_percent_error",
                       "real_p50", "sim_p50", "real_p90", "sim_p90", "real_p95", "sim_p95",
                       "real_p99", "sim_p99"]
    assert (w["real_mean"], w["sim_mean"]) == (250.0, 252.5)
    assert w["mean_error"] == 2.5 and w["mean_percent_error"] == 2.5 / 250
    assert (w["real_median"], w["sim_median"]) == (250.0, 260.0)  # sorted sim 110,190,330,380
    assert w["median_percent_error"] == 10 / 250
    assert w["real_p90"] == pytest.approx(370.0, rel=1e-15)
    assert m["request_level"]["mape"] == pytest.approx((0.1 + 0.05 + 0.1 + 0.05) / 4)
    assert m["request_level"]["bias_direction"] == "over-predict"
    assert m["request_level"]["quality"] == "excellent"
    assert m["count"] == 4


def test_means_sum_left_to_right_like_the_reference():
    # 1e16 + 1 rounds back to 1e16, so a left-to-right sum gives 0 where an exact one gives 1.
    m = compare_metric([1e16, 1.0, -1e16], [1.0, 1.0, 1.0])
    assert m["workload_level"]["real_mean"] == 0.0
    assert math.fsum([1e16, 1.0, -1e16]) == 1.0


def test_compare_metric_rejects_unequal_or_empty_vectors():
    with pytest.raises(ValueError):
        compare_metric([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        compare_metric([], [])
