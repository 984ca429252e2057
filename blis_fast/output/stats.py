"""Go-exact summary statistics (ENG-7.5, CLU-7.7).

Every function returns the float64 the reference computes, bit for bit:

* ``mean_ms`` / ``percentile_ms``: ``sim/metrics_utils.go`` (values sorted ascending, summed
  left to right in float64, ``(sum / n) / 1000``; percentile by rank interpolation with the
  difference taken in the values' own type — int64 for ITLs — then scaled by 1/1000);
* ``weighted_mean_ms`` / ``weighted_percentile_ms``: the same results for ITL samples given
  as ``(value, count)`` pairs, without expanding them;
* ``Distribution`` / ``distribution``: ``sim/cluster/metrics.go: NewDistribution`` in ticks.

Why the shortcuts are exact. Summing float64 left to right is exact — equal to the integer
sum — as long as every addend and every partial sum is an integer of magnitude below 2**53
(each intermediate result is then representable, so no addition rounds). For integer-valued
inputs whose absolute values sum to less than 2**53 the mean therefore uses an exact integer
sum. Anything else is summed strictly sequentially with ``np.add.accumulate``, whose result
is defined element by element as ``r[i] = r[i-1] + a[i]`` (no pairwise reassociation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "sequential_sum",
    "mean_ms",
    "percentile_ms",
    "weighted_mean_ms",
    "weighted_percentile_ms",
    "Distribution",
    "distribution",
    "go_fixed",
]

_EXACT_LIMIT = 2**53
_CHUNK = 1 << 20


class SortedValues(np.ndarray):
    """An int64/float64 array known to be sorted ascending (``sorted_values`` makes one), so
    the statistics below do not sort it again."""


def sorted_values(values: np.ndarray | list) -> SortedValues:
    """Sort once for several statistics over the same values."""
    return _as_sorted(values).view(SortedValues)


def _as_sorted(values: np.ndarray | list) -> np.ndarray:
    """Return the values as a sorted int64 or float64 array."""
    if isinstance(values, SortedValues):
        return values
    a = np.asarray(values)
    if a.dtype.kind in "iub":
        a = a.astype(np.int64, copy=False)
    else:
        a = a.astype(np.float64, copy=False)
    return np.sort(a)  # equal values are interchangeable: the fast (unstable) sort will do


def _int_sum_if_exact(a: np.ndarray) -> int | None:
    """Integer sum of ``a`` when a left-to-right float64 sum of it is provably exact, else None."""
    n = a.size
    if n == 0:
        return 0
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or not np.array_equal(a, np.trunc(a)):
            return None
        if float(np.max(np.abs(a))) * n >= _EXACT_LIMIT:
            return None
        a = a.astype(np.int64)
    else:
        a = a.astype(np.int64, copy=False)
        amax = int(np.max(np.abs(a)))
        if amax * n >= 2**63:  # the absolute sum below could overflow int64
            return None
        if int(np.sum(np.abs(a))) >= _EXACT_LIMIT:
            return None
    return int(np.sum(a))


def sequential_sum(values: np.ndarray | list) -> float:
    """Left-to-right float64 sum of ``values`` in the given order (Go's ``for`` loop)."""
    a = np.asarray(values)
    exact = _int_sum_if_exact(a if a.dtype.kind in "iuf" else a.astype(np.float64))
    if exact is not None:
        return float(exact)
    a = a.astype(np.float64)
    total = 0.0
    for start in range(0, a.size, _CHUNK):
        chunk = np.empty(min(_CHUNK, a.size - start) + 1, dtype=np.float64)
        chunk[0] = total
        chunk[1:] = a[start : start + _CHUNK]
        total = float(np.add.accumulate(chunk)[-1])
    return total


def mean_ms(values: np.ndarray | list) -> float:
    """``CalculateMean`` over the ascending-sorted values, in ms (0 for no values)."""
    a = _as_sorted(values)
    n = a.size
    if n == 0:
        return 0.0
    return (sequential_sum(a) / float(n)) / 1000


def _rank(p: float, n: int) -> tuple[float, int, int]:
    rank = p / 100.0 * float(n - 1)
    return rank, int(math.floor(rank)), int(math.ceil(rank))


def percentile_ms(values: np.ndarray | list, p: float) -> float:
    """``CalculatePercentile`` over the ascending-sorted values, in ms (0 for no values)."""
    a = _as_sorted(values)
    n = a.size
    if n == 0:
        return 0.0
    rank, lo, hi = _rank(p, n)
    if lo == hi:
        return float(a[lo]) / 1000
    if hi >= n:
        return float(a[n - 1]) / 1000
    if a.dtype.kind == "f":
        lv, hv = float(a[lo]), float(a[hi])
        return lv / 1000 + (hv - lv) * (rank - float(lo)) / 1000
    lv_i, hv_i = int(a[lo]), int(a[hi])  # int64 difference, as in Go
    return float(lv_i) / 1000 + float(hv_i - lv_i) * (rank - float(lo)) / 1000


def _weighted_sorted(values: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values sorted ascending with their counts, zero counts dropped."""
    if isinstance(values, SortedValues):
        return values, counts
    v = np.asarray(values, dtype=np.int64)
    c = np.asarray(counts, dtype=np.int64)
    if v.shape != c.shape:
        raise ValueError("values and counts must have the same shape")
    if np.any(c < 0):
        raise ValueError("counts must be non-negative")
    keep = c > 0
    v, c = v[keep], c[keep]
    order = np.argsort(v)  # equal values may come in any order: only their total count shows
    return v[order], c[order]


def sorted_weighted(values: np.ndarray, counts: np.ndarray) -> tuple[SortedValues, np.ndarray]:
    """Sort (value, count) pairs once for several weighted statistics."""
    v, c = _weighted_sorted(values, counts)
    return v.view(SortedValues), c


def weighted_mean_ms(values: np.ndarray, counts: np.ndarray) -> float:
    """``mean_ms(np.repeat(values, counts))`` without materialising the repeat (int64 ITLs)."""
    v, c = _weighted_sorted(values, counts)
    n = int(np.sum(c)) if c.size else 0
    if n == 0:
        return 0.0
    total: float | None = None
    if int(np.max(np.abs(v))) * n < 2**63:  # int64 products and sums cannot overflow
        if int(np.sum(np.abs(v) * c)) < _EXACT_LIMIT:
            total = float(int(np.sum(v * c)))
    if total is None:  # sequential float64 sum over the expanded samples, chunk by chunk
        total = 0.0
        starts = np.concatenate(([0], np.cumsum(c)))
        for lo in range(0, n, _CHUNK):
            hi = min(lo + _CHUNK, n)
            g0 = int(np.searchsorted(starts, lo, side="right")) - 1
            g1 = int(np.searchsorted(starts, hi, side="left"))
            reps = np.minimum(starts[g0 + 1 : g1 + 1], hi) - np.maximum(starts[g0:g1], lo)
            chunk = np.repeat(v[g0:g1].astype(np.float64), reps)
            total = sequential_sum(np.concatenate(([total], chunk)))
    return (total / float(n)) / 1000


def weighted_percentile_ms(values: np.ndarray, counts: np.ndarray, p: float) -> float:
    """``percentile_ms(np.repeat(values, counts), p)`` without materialising the repeat."""
    v, c = _weighted_sorted(values, counts)
    if c.size == 0:
        return 0.0
    cum = np.cumsum(c)
    n = int(cum[-1])
    rank, lo, hi = _rank(p, n)

    def at(i: int) -> int:
        return int(v[int(np.searchsorted(cum, i, side="right"))])

    if lo == hi:
        return float(at(lo)) / 1000
    if hi >= n:
        return float(at(n - 1)) / 1000
    lv, hv = at(lo), at(hi)
    return float(lv) / 1000 + float(hv - lv) * (rank - float(lo)) / 1000


@dataclass(frozen=True, slots=True)
class Distribution:
    """``cluster.Distribution``: summary of raw values in ticks (all zero when empty)."""

    mean: float = 0.0
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    min: float = 0.0
    max: float = 0.0
    count: int = 0


def _dist_percentile(a: np.ndarray, p: float) -> float:
    n = a.size
    if n == 1:
        return float(a[0])
    rank, lo, hi = _rank(p, n)
    if lo == hi:
        return float(a[lo])
    frac = rank - float(lo)
    lv, hv = float(a[lo]), float(a[hi])
    return lv + frac * (hv - lv)


def distribution(values: np.ndarray | list) -> Distribution:
    """``NewDistribution``: mean, p50, p95, p99, min, max, count of float64 tick values."""
    a = np.sort(np.asarray(values, dtype=np.float64))
    n = a.size
    if n == 0:
        return Distribution()
    return Distribution(
        mean=sequential_sum(a) / float(n),
        p50=_dist_percentile(a, 50),
        p95=_dist_percentile(a, 95),
        p99=_dist_percentile(a, 99),
        min=float(a[0]),
        max=float(a[-1]),
        count=n,
    )


def go_fixed(x: float, prec: int) -> str:
    """Go's ``%.<prec>f`` of a float64 (equal to Python's for finite values)."""
    if x != x:
        return "NaN"
    if x == math.inf:
        return "+Inf"
    if x == -math.inf:
        return "-Inf"
    return f"{x:.{prec}f}"
