"""The statistics of a calibration report (CAL-4): means, percentiles, MAPE, bias, Pearson r.

Everything is computed in plain Python floats, summing left to right in pair order, because
the reference's numbers depend on that order (a compensated or pairwise sum, as ``math.fsum``,
NumPy or Python >= 3.12's ``sum`` do, changes the last bits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["compare_metric", "mape_and_bias", "pearson_r", "percentile_sorted", "quality_grade"]

PERCENTILES = (50, 90, 95, 99)


def _seq_sum(values: Sequence[float]) -> float:
    """Left-to-right float sum (the order Go's loop adds in)."""
    total = 0.0
    for v in values:
        total += v
    return total


def percentile_sorted(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolation percentile of ascending values: rank ``p/100*(n-1)``; 0 when empty."""
    n = len(sorted_values)
    if n == 0:
        return 0.0
    if n == 1:
        return float(sorted_values[0])
    rank = p / 100.0 * float(n - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    if lo == hi:
        return float(sorted_values[lo])
    return sorted_values[lo] + (rank - lo) * (sorted_values[hi] - sorted_values[lo])


def mape_and_bias(real: Sequence[float], sim: Sequence[float]) -> tuple[float, str]:
    """Mean of ``|real - sim| / real`` over pairs with ``real != 0`` (a fraction) and the sign of
    ``sum(sim - real)`` over the same pairs; ``(0.0, "")`` when every real value is 0."""
    err_sum = 0.0
    bias_sum = 0.0
    count = 0
    for r, s in zip(real, sim, strict=True):
        if r == 0:
            continue
        err_sum += abs(r - s) / r
        bias_sum += s - r
        count += 1
    if count == 0:
        return 0.0, ""
    if bias_sum > 0:
        direction = "over-predict"
    elif bias_sum < 0:
        direction = "under-predict"
    else:
        direction = "neutral"
    return err_sum / count, direction


def pearson_r(x: Sequence[float], y: Sequence[float]) -> float:
    """Single-pass Pearson correlation as the reference computes it; 0 when fewer than 3 pairs
    or when the denominator is exactly 0.

    A (nearly) constant side can leave a tiny negative residue under the square root; that
    gives NaN, as in the reference, and the caller decides what to do with it.
    """
    n = len(x)
    if n < 3:
        return 0.0
    sx = sy = sxy = sx2 = sy2 = 0.0
    for a, b in zip(x, y, strict=True):
        sx += a
        sy += b
        sxy += a * b
        sx2 += a * a
        sy2 += b * b
    fn = float(n)
    num = fn * sxy - sx * sy
    var_product = (fn * sx2 - sx * sx) * (fn * sy2 - sy * sy)
    den = math.sqrt(var_product) if var_product >= 0 else math.nan
    if den == 0:
        return 0.0
    return num / den


def quality_grade(mape: float, r: float) -> str:
    """``excellent`` / ``good`` / ``fair`` / ``poor`` from MAPE (a fraction) and Pearson r."""
    if mape < 0.10 and r > 0.95:
        return "excellent"
    if mape < 0.20 and r > 0.85:
        return "good"
    if mape < 0.35 and r > 0.70:
        return "fair"
    return "poor"


def compare_metric(real: Sequence[float], sim: Sequence[float]) -> dict:
    """One metric's report entry: ``workload_level`` (means, median, P50-P99, errors),
    ``request_level`` (MAPE, Pearson r, bias, quality) and ``count``, in the report's key order.
    """
    if len(real) != len(sim) or not real:
        raise ValueError(f"need equal, non-empty vectors (real {len(real)}, sim {len(sim)})")
    n = float(len(real))
    real_mean = _seq_sum(real) / n
    sim_mean = _seq_sum(sim) / n
    real_sorted, sim_sorted = sorted(real), sorted(sim)
    rp = {p: percentile_sorted(real_sorted, p) for p in PERCENTILES}
    sp = {p: percentile_sorted(sim_sorted, p) for p in PERCENTILES}
    mean_error = sim_mean - real_mean
    median_error = sp[50] - rp[50]
    workload = {
        "real_mean": real_mean,
        "sim_mean": sim_mean,
        "mean_error": mean_error,
        "mean_percent_error": abs(mean_error) / real_mean if real_mean != 0 else 0.0,
        "real_median": rp[50],
        "sim_median": sp[50],
        "median_error": median_error,
        "median_percent_error": abs(median_error) / rp[50] if rp[50] != 0 else 0.0,
    }
    for p in PERCENTILES:
        workload[f"real_p{p}"] = rp[p]
        workload[f"sim_p{p}"] = sp[p]
    mape, bias = mape_and_bias(real, sim)
    r = pearson_r(real, sim)
    return {
        "workload_level": workload,
        "request_level": {"mape": mape, "pearson_r": r, "bias_direction": bias,
                          "quality": quality_grade(mape, r)},
        "count": len(real),
    }
