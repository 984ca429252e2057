"""Go-exact statistics (ENG-7.5, CLU-7.7): compared with literal translations of the Go loops
(``naive.mean_ms``, ``naive.percentile_ms``, ``naive.distribution``: sim/metrics_utils.go and
sim/cluster/metrics.go)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import distribution as go_distribution
from naive import mean_ms as naive_mean_ms
from naive import percentile_ms as naive_percentile_ms

from blis_fast.output import stats
from blis_fast.output.stats import (
    Distribution,
    distribution,
    mean_ms,
    percentile_ms,
    sequential_sum,
    weighted_mean_ms,
    weighted_percentile_ms,
)


def naive_distribution(values: list[float]) -> Distribution:
    """The Go ``NewDistribution`` twin as the package's record type."""
    return Distribution(*go_distribution(values))


def same(a: float, b: float) -> bool:
    return math.copysign(1, a) == math.copysign(1, b) and (a == b or (a != a and b != b))


ticks_f = st.integers(min_value=0, max_value=10**12).map(float)
any_f = st.floats(min_value=-1e15, max_value=1e15, allow_nan=False)
ticks_i = st.integers(min_value=0, max_value=10**11)
percent = st.sampled_from([0.0, 50.0, 90.0, 95.0, 99.0, 99.9, 100.0])


@given(st.lists(st.one_of(ticks_f, any_f), max_size=300), percent)
def test_float_mean_and_percentile_match_go(values: list[float], p: float) -> None:
    arr = np.array(values, dtype=np.float64)
    assert same(mean_ms(arr), naive_mean_ms(values))
    assert same(percentile_ms(arr, p), naive_percentile_ms(values, p))


@given(st.lists(ticks_i, max_size=300), percent)
def test_int_mean_and_percentile_match_go(values: list[int], p: float) -> None:
    arr = np.array(values, dtype=np.int64)
    assert same(mean_ms(arr), naive_mean_ms(values))
    assert same(percentile_ms(arr, p), naive_percentile_ms(values, p))


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2**40), st.integers(min_value=0, max_value=40)
        ),
        max_size=60,
    ),
    percent,
)
def test_weighted_itl_stats_equal_expanded(pairs: list[tuple[int, int]], p: float) -> None:
    # ENG-7.5 on AllITLs given as (value, multiplicity): bit-identical to expanding them.
    values = np.array([v for v, _ in pairs], dtype=np.int64)
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    expanded = np.repeat(values, counts)
    assert same(weighted_mean_ms(values, counts), mean_ms(expanded))
    assert same(weighted_percentile_ms(values, counts, p), percentile_ms(expanded, p))
    as_list = expanded.tolist()
    assert same(weighted_mean_ms(values, counts), naive_mean_ms(as_list))
    assert same(weighted_percentile_ms(values, counts, p), naive_percentile_ms(as_list, p))


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=2**49, max_value=2**52), st.integers(min_value=1, max_value=9)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_weighted_mean_inexact_path(pairs: list[tuple[int, int]]) -> None:
    # Sums beyond 2**53 round: the fallback must add sample by sample, in order.
    old = stats._CHUNK
    stats._CHUNK = 5  # force several chunks
    try:
        values = np.array([v for v, _ in pairs], dtype=np.int64)
        counts = np.array([c for _, c in pairs], dtype=np.int64)
        expanded = np.repeat(values, counts).tolist()
        assert same(weighted_mean_ms(values, counts), naive_mean_ms(expanded))
    finally:
        stats._CHUNK = old


@given(st.lists(st.floats(min_value=-1e300, max_value=1e300, allow_nan=False), max_size=200))
def test_sequential_sum_is_left_to_right(values: list[float]) -> None:
    total = 0.0
    for v in values:
        total += v
    assert same(sequential_sum(np.array(values, dtype=np.float64)), total)


def test_sequential_sum_differs_from_pairwise() -> None:
    rng = np.random.default_rng(1)
    x = np.sort(rng.random(5000) * 1e3)
    total = 0.0
    for v in x.tolist():
        total += v
    assert sequential_sum(x) == total
    stats_chunk = stats._CHUNK
    stats._CHUNK = 7
    try:
        assert sequential_sum(x) == total
    finally:
        stats._CHUNK = stats_chunk


@given(st.lists(st.one_of(ticks_f, any_f), max_size=200))
def test_distribution_matches_go(values: list[float]) -> None:
    got = distribution(np.array(values, dtype=np.float64))
    exp = naive_distribution(values)
    for f in ("mean", "p50", "p95", "p99", "min", "max", "count"):
        assert same(float(getattr(got, f)), float(getattr(exp, f))), f


def test_empty_inputs() -> None:
    assert mean_ms([]) == 0.0
    assert percentile_ms([], 99) == 0.0
    assert weighted_mean_ms(np.array([5]), np.array([0])) == 0.0
    assert (
        weighted_percentile_ms(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 9) == 0
    )
    assert distribution([]) == Distribution()


def test_itl_difference_in_int64() -> None:
    # Go takes upperVal-lowerVal in int64 for ITLs: exact even where float64 would round.
    big = 2**53
    vals = np.array([big + 1, big + 4], dtype=np.int64)
    got = percentile_ms(vals, 50)
    assert got == float(big + 1) / 1000 + float(3) * 0.5 / 1000


def test_weighted_rejects_bad_counts() -> None:
    with pytest.raises(ValueError):
        weighted_mean_ms(np.array([1, 2]), np.array([1, -1]))
    with pytest.raises(ValueError):
        weighted_mean_ms(np.array([1, 2]), np.array([1]))
