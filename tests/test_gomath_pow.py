"""The one Go ``math.Pow`` port (``kernels/go/gomath.py: go_pow``) against plain-Python
transcriptions of its two behaviours, on many inputs.

Go's released ``math.Pow`` raises the Frexp mantissa to the integral part of the exponent by
squaring along its bits; the int8 fast path (golang/go PR #29457, never merged) multiplies
the largest power of two first for an integral exponent in [-128, 127]. The latency backends
use Go's algorithm (``small_int_fast_path=False``), the workload samplers the fast path (the
default), and the two do differ in the last ulp for about a third of such exponents.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.kernels.go.gomath import go_pow
from tests.naive import go_pow as naive_go_pow


def _int8_fast_path(x: float, y: float) -> float:
    """The PR's branch for an integral y in [-128, 127]."""
    n = int(abs(y))
    r = 1.0
    while n > 1:
        tmp, c = x, 1
        while c <= n // 2:
            tmp *= tmp
            c *= 2
        n -= c
        r *= tmp
    for _ in range(n):
        r *= x
    if y < 0:
        return 1.0 / r if r != 0.0 else math.inf
    return r


def _bases(rng: random.Random) -> float:
    return rng.choice([rng.random(), rng.uniform(0.5, 2.0), rng.uniform(0.9, 1.0),
                       rng.lognormvariate(0.0, 3.0), 0.75, 7 / 8, 120 / 128, 56 / 64])


def test_go_algorithm_on_integral_exponents():
    """The latency backends' calls: x = (E - k) / E and other bases, every token count."""
    rng = random.Random(11)
    for _ in range(20000):
        x = _bases(rng)
        y = float(rng.choice([rng.randint(-140, 140), rng.randint(-40, 20000)]))
        assert go_pow(x, y, False) == naive_go_pow(x, y), (x, y)
    for e, k in ((8, 2), (64, 8), (128, 8), (16, 1), (60, 4), (256, 8)):
        for tokens in range(1, 4097):
            x = (e - k) / e
            assert go_pow(x, float(tokens), False) == naive_go_pow(x, float(tokens))


def test_fast_path_on_small_integral_exponents():
    rng = random.Random(12)
    for _ in range(20000):
        x = _bases(rng)
        y = float(rng.randint(-128, 127))
        assert go_pow(x, y) == _int8_fast_path(x, y), (x, y)
    # outside [-128, 127] both behaviours are Go's general algorithm
    for y in (128.0, -129.0, 1000.0, 4096.0):
        assert go_pow(0.75, y) == go_pow(0.75, y, False) == naive_go_pow(0.75, y)


def test_the_two_behaviours_really_differ():
    """Why the switch exists: x**7 is (x**4 * x**2) * x on the fast path, (x * x**2) * x**4 in
    Go's algorithm; exponents with at most two set bits agree."""
    x = 0.75
    differ = [t for t in range(1, 128) if go_pow(x, float(t)) != go_pow(x, float(t), False)]
    assert differ and all(bin(t).count("1") >= 3 for t in differ)
    for t in (1, 2, 3, 4, 5, 6, 8, 12, 64, 96):
        assert go_pow(x, float(t)) == go_pow(x, float(t), False)


@settings(max_examples=300, deadline=None)
@given(x=st.floats(1e-3, 1e3), y=st.floats(-60.0, 60.0))
def test_fractional_exponents_agree_between_behaviours(x, y):
    """Non-integral exponents take the same Exp(yf*Log(x)) path either way, close to x**y."""
    if math.trunc(y) == y:
        y += 0.25
    a = go_pow(x, y)
    assert a == go_pow(x, y, False)
    assert math.isclose(a, x**y, rel_tol=1e-13)


@pytest.mark.parametrize("fast", [True, False])
def test_special_cases(fast):
    assert go_pow(0.0, 5.0, fast) == 0.0 and go_pow(0.0, -1.0, fast) == math.inf
    assert go_pow(-0.0, -3.0, fast) == -math.inf
    assert go_pow(2.0, 0.5, fast) == math.sqrt(2.0)
    assert math.isnan(go_pow(-2.0, 0.5, fast))
    assert go_pow(0.75, 100000.0, fast) == 0.0  # the exponent tracking underflows to 0
    assert go_pow(-math.inf, 3.0, fast) == -math.inf and go_pow(-math.inf, 2.0, fast) == math.inf
    assert go_pow(1e-300, -127.0, fast) == math.inf  # 1/0: no exception in the kernel
