"""Go ``math`` routines the workload samplers depend on, re-implemented for bit parity.

Python's ``math`` calls the platform libm, whose last-ulp results differ from Go's. The
reference's samplers truncate or round their float results to integers, so an ulp can flip
an inter-arrival time or a token count. This module reproduces the Go functions used by the
generator, as built for linux/amd64 (the reference's platform):

* ``go_log``  - the amd64 assembly ``archLog`` (same algorithm as Go's portable ``log``);
* ``go_exp``  - the amd64 assembly ``archExp`` on an FMA-capable CPU (Shibata's method),
  with the fused multiply-adds emulated exactly (round-to-odd technique);
* ``go_pow``  - Go's portable ``Pow`` (Modf split, ``Exp(yf*Log(x))`` times repeated squaring
  of the ``Frexp`` mantissa; optionally the int8 fast path, see its docstring);
* ``go_gamma`` - Go's Cephes-derived ``Gamma`` (rational approximation on (2, 3), Stirling
  above 33);
* ``go_cos``  - Go's Cephes-derived ``Cos`` for |x| < 2^29;
* ``go_f2i``  - Go's float64 -> int64 conversion on amd64 (out of range and NaN give MinInt64);
* ``go_round``, ``go_max``, ``go_min`` - ``math.Round``/``Max``/``Min`` special cases.

Every function is ``@njit(cache=True)`` and also callable from Python. Evaluation order
follows Go's source; the module must not be compiled with ``fastmath``.
"""

from __future__ import annotations

import math

import numpy as np

from blis_fast.gonum import INT64_MAX as INT64_MAX  # Go's int64 limits, one definition,
from blis_fast.gonum import INT64_MIN as INT64_MIN  # re-exported for the kernels
from blis_fast.kernels.jit import njit

_TWO63 = 9223372036854775808.0
_SPLIT = 134217729.0  # 2^27 + 1 (Dekker)

# --- exp (amd64 assembly constants) --------------------------------------------------------
_LOG2E = 1.4426950408889634073599246810018920
_LN2U = 0.69314718055966295651160180568695068359375
_LN2L = 0.28235290563031577122588448175013436025525412068e-12
_EXP_OVERFLOW = 7.09782712893384e02
_E2 = 1.6666666666666666667e-1
_E3 = 4.1666666666666666667e-2
_E4 = 8.3333333333333333333e-3
_E5 = 1.3888888888888888889e-3
_E6 = 1.9841269841269841270e-4
_E7 = 2.4801587301587301587e-5

# --- log ------------------------------------------------------------------------------------
_HSQRT2 = 7.07106781186547524401e-01
_LN2HI = 6.93147180369123816490e-01
_LN2LO = 1.90821492927058770002e-10
_L1 = 6.666666666666735130e-01
_L2 = 3.999999999940941908e-01
_L3 = 2.857142874366239149e-01
_L4 = 2.222219843214978396e-01
_L5 = 1.818357216161805012e-01
_L6 = 1.531383769920937332e-01
_L7 = 1.479819860511658591e-01

# --- gamma (Cephes) -------------------------------------------------------------------------
_GAM_P = np.array(
    [
        1.60119522476751861407e-04,
        1.19135147006586384913e-03,
        1.04213797561761569935e-02,
        4.76367800457137231464e-02,
        2.07448227648435975150e-01,
        4.94214826801497100753e-01,
        9.99999999999999996796e-01,
    ]
)
_GAM_Q = np.array(
    [
        -2.31581873324120129819e-05,
        5.39605580493303397842e-04,
        -4.45641913851797240494e-03,
        1.18139785222060435552e-02,
        3.58236398605498653373e-02,
        -2.34591795718243348568e-01,
        7.14304917030273074085e-02,
        1.00000000000000000320e00,
    ]
)
_GAM_S = np.array(
    [
        7.87311395793093628397e-04,
        -2.29549961613378126380e-04,
        -2.68132617805781232825e-03,
        3.47222221605458667310e-03,
        8.33333333333482257126e-02,
    ]
)
_EULER = 0.57721566490153286060651209008240243104215933593992
_SQRT_TWO_PI = 2.506628274631000502417
_MAX_STIRLING = 143.01608

# --- cos (Cephes) ---------------------------------------------------------------------------
_PI4A = 7.85398125648498535156e-1
_PI4B = 3.77489470793079817668e-8
_PI4C = 2.69515142907905952645e-15
_FOUR_OVER_PI = 1.2732395447351628  # the float64 nearest to 4/pi (Go's constant 4/Pi)
_SIN = np.array(
    [
        1.58962301576546568060e-10,
        -2.50507477628578072866e-8,
        2.75573136213857245213e-6,
        -1.98412698295895385996e-4,
        8.33333333332211858878e-3,
        -1.66666666666666307295e-1,
    ]
)
_COS = np.array(
    [
        -1.13585365213876817300e-11,
        2.08757008419747316778e-9,
        -2.75573141792967388112e-7,
        2.48015872888517045348e-5,
        -1.38888888888730564116e-3,
        4.16666666666665929218e-2,
    ]
)


# --- conversions ----------------------------------------------------------------------------
@njit(cache=True)
def go_f2i(x: float) -> int:
    """Go ``int64(x)`` on amd64: truncation; NaN and out-of-range values give MinInt64."""
    if x != x or x >= _TWO63 or x < -_TWO63:
        return np.int64(INT64_MIN)
    return np.int64(x)


@njit(cache=True)
def go_round(x: float) -> float:
    """Go ``math.Round``: nearest integer, halves away from zero (NaN and Inf unchanged)."""
    if x != x or math.isinf(x):
        return x
    t = math.trunc(x)
    if abs(x - t) >= 0.5:
        t += math.copysign(1.0, x)
    return t


@njit(cache=True)
def go_max(x: float, y: float) -> float:
    """Go ``math.Max`` (+Inf wins over NaN, NaN wins otherwise, +0 over -0)."""
    if (math.isinf(x) and x > 0) or (math.isinf(y) and y > 0):
        return math.inf
    if x != x or y != y:
        return math.nan
    if x == 0.0 and y == 0.0:
        if math.copysign(1.0, x) < 0:
            return y
        return x
    if x > y:
        return x
    return y


@njit(cache=True)
def go_min(x: float, y: float) -> float:
    """Go ``math.Min`` (-Inf wins over NaN, NaN wins otherwise, -0 over +0)."""
    if (math.isinf(x) and x < 0) or (math.isinf(y) and y < 0):
        return -math.inf
    if x != x or y != y:
        return math.nan
    if x == 0.0 and y == 0.0:
        if math.copysign(1.0, x) < 0:
            return x
        return y
    if x < y:
        return x
    return y


# --- exact fused multiply-add -----------------------------------------------------------------
@njit(cache=True)
def _two_prod(a: float, b: float):
    """Dekker's exact product: a*b = p + e (no overflow assumed)."""
    p = a * b
    t = _SPLIT * a
    ah = t - (t - a)
    al = a - ah
    t = _SPLIT * b
    bh = t - (t - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


@njit(cache=True)
def _two_sum(a: float, b: float):
    """Knuth's exact sum: a+b = s + e."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@njit(cache=True)
def _add_round_odd(a: float, b: float) -> float:
    """a+b rounded to odd: the nearest float toward zero, made odd if inexact."""
    s, e = _two_sum(a, b)
    if e == 0.0 or s == 0.0 or math.isinf(s):
        return s
    m, ex = math.frexp(s)
    if np.int64(m * 9007199254740992.0) & 1 == 0:  # even significand: step toward e
        if (e > 0.0) == (s > 0.0):
            s = np.nextafter(s, math.copysign(math.inf, s))
        else:
            s = np.nextafter(s, 0.0)
        # stepping away from zero to an even neighbour is never needed: s was even,
        # so both neighbours are odd.
    return s


@njit(cache=True)
def fma(a: float, b: float, c: float) -> float:
    """Correctly rounded a*b + c (Boldo-Melquiond emulation; finite, non-extreme inputs)."""
    if a == 0.0 or b == 0.0 or math.isinf(a) or math.isinf(b) or math.isinf(c):
        return a * b + c
    ph, pl = _two_prod(a, b)
    if math.isinf(ph) or ph != ph:
        return a * b + c
    th, tl = _two_sum(c, ph)
    v = _add_round_odd(tl, pl)
    return th + v


# --- exp / log --------------------------------------------------------------------------------
@njit(cache=True)
def _round_half_even_i32(x: float) -> int:
    """CVTSD2SL: float64 -> int32 with round-half-even; out of range gives -2^31."""
    if x != x or x >= 2147483647.5 or x < -2147483648.5:
        return np.int64(-2147483648)
    r = math.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and np.int64(r) % 2 != 0):
        r += 1.0
    return np.int64(r)


@njit(cache=True)
def go_exp(x: float) -> float:
    """Go ``math.Exp`` as the amd64 assembly computes it on an FMA-capable CPU."""
    if x != x:
        return x
    if math.isinf(x):
        return math.inf if x > 0 else 0.0
    if x > _EXP_OVERFLOW:
        return math.inf
    k = _round_half_even_i32(_LOG2E * x)
    fk = float(k)
    x0 = fma(-fk, _LN2U, x)
    x0 = fma(-fk, _LN2L, x0)
    x0 = x0 * 0.0625
    x1 = _E7
    x1 = fma(x1, x0, _E6)
    x1 = fma(x1, x0, _E5)
    x1 = fma(x1, x0, _E4)
    x1 = fma(x1, x0, _E3)
    x1 = fma(x1, x0, _E2)
    x1 = fma(x1, x0, 0.5)
    x1 = fma(x1, x0, 1.0)
    x0 = x0 * x1
    x1 = x0 + 2.0
    x0 = x0 * x1
    x1 = x0 + 2.0
    x0 = x0 * x1
    x1 = x0 + 2.0
    x0 = x0 * x1
    x1 = x0 + 2.0
    x0 = fma(x0, x1, 1.0)
    b = k + 0x3FF
    if b <= 0:
        if b < -52:
            return 0.0
        x0 = x0 * math.ldexp(1.0, b + 0x3FE - 0x3FF)
        return x0 * math.ldexp(1.0, -1022)
    if b >= 0x7FF:
        return math.inf
    return x0 * math.ldexp(1.0, b - 0x3FF)


@njit(cache=True)
def go_log(x: float) -> float:
    """Go ``math.Log`` (amd64 ``archLog``; identical to the portable algorithm for normals)."""
    if x == 0.0:
        return -math.inf
    if x < 0.0 or x != x:
        return math.nan if x < 0.0 else x
    if math.isinf(x):
        return x
    if x < 2.2250738585072014e-308:
        # The assembly reads the exponent field directly, so subnormals are not normalized.
        f1 = 0.5 + x * 2.0**1021
        k = -1022.0
    else:
        f1, ki = math.frexp(x)
        k = float(ki)
    if f1 < _HSQRT2:
        k -= 1.0
        f1 *= 2.0
    f = f1 - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (_L1 + s4 * (_L3 + s4 * (_L5 + s4 * _L7)))
    t2 = s4 * (_L2 + s4 * (_L4 + s4 * _L6))
    r = t1 + t2
    hfsq = 0.5 * f * f
    return k * _LN2HI - ((hfsq - (s * (hfsq + r) + k * _LN2LO)) - f)


# --- pow --------------------------------------------------------------------------------------
@njit(cache=True)
def _is_odd_int(x: float) -> bool:
    """Go's isOddInt: integral and odd (as int64)."""
    if math.isinf(x) or x != x:
        return False
    xi = math.trunc(x)
    if xi != x:
        return False
    if abs(xi) >= _TWO63:
        return False
    return np.int64(xi) & 1 == 1


@njit(cache=True, error_model="numpy")
def _pow_zero_base(x: float, y: float) -> float:
    """Go's Pow for x = ±0 and y ≠ 0, ±1."""
    if y < 0:
        if _is_odd_int(y):
            return math.copysign(math.inf, x)
        return math.inf
    if _is_odd_int(y):
        return x
    return 0.0


@njit(cache=True, error_model="numpy")
def _pow_small_int(x: float, y: float) -> float:
    """x**y for an integral ``y`` in [-128, 127] by the repeated squaring of the int8 fast path
    (golang/go PR #29457): the largest power of two first, then the rest."""
    neg = y < 0
    n = np.int64(-y if neg else y)
    r = 1.0
    while n > 1:
        tmp = x
        c = np.int64(1)
        while c <= n // 2:
            tmp *= tmp
            c *= 2
        n = n - c
        r *= tmp
    for _ in range(n):
        r *= x
    if neg:
        return 1.0 / r
    return r


@njit(cache=True, error_model="numpy")
def go_pow(x: float, y: float, small_int_fast_path: bool = True) -> float:
    """Go ``math.Pow`` (the portable algorithm, which amd64 runs; ``go_exp``/``go_log`` for the
    fractional part of ``y``, then the ``Frexp`` mantissa squared along the bits of the integral
    part with the exponent tracked apart).

    ``small_int_fast_path`` selects the one behaviour in which the two ports this project had
    differ: for an integral ``y`` in [-128, 127] (``float64(int8(y)) == y``) the int8 fast path
    multiplies powers in another order, and about a third of such powers differ in the last
    ulp (x**7 = (x**4 * x**2) * x there, (x * x**2) * x**4 in the general path). Go's released
    ``math.Pow`` has no such path (it comes from golang/go PR #29457, closed unmerged; issue
    #29456 is still open), so the latency backends pass False. The workload samplers, whose
    outputs were pinned with it, keep the default True: with their exponents (1/shape) it
    matters only for a shape whose reciprocal is an integer with three set bits or more, which
    no parity case draws. ``tests/test_gomath_pow.py`` compares both on many inputs.
    """
    if y == 0.0 or x == 1.0:
        return 1.0
    if y == 1.0:
        return x
    if x != x or y != y:
        return math.nan
    if x == 0.0:
        return _pow_zero_base(x, y)
    if math.isinf(y):
        if x == -1.0:
            return 1.0
        if (abs(x) < 1.0) == (y > 0):
            return 0.0
        return math.inf
    if math.isinf(x):
        if x < 0:
            return _pow_zero_base(1.0 / x, -y)  # Pow(-Inf, y) = Pow(-0, -y)
        if y < 0:
            return 0.0
        return math.inf
    if y == 0.5:
        return math.sqrt(x)
    if y == -0.5:
        return 1.0 / math.sqrt(x)
    if small_int_fast_path and -128.0 <= y <= 127.0 and math.trunc(y) == y:
        return _pow_small_int(x, y)
    ay = abs(y)
    yi = math.trunc(ay)
    yf = ay - yi
    if yf != 0.0 and x < 0:
        return math.nan
    if yi >= _TWO63:
        if x == -1.0:
            return 1.0
        if (abs(x) < 1.0) == (y > 0):
            return 0.0
        return math.inf
    a1 = 1.0
    ae = np.int64(0)
    if yf != 0.0:
        if yf > 0.5:
            yf -= 1.0
            yi += 1.0
        a1 = go_exp(yf * go_log(x))
    x1, xe0 = math.frexp(x)
    xe = np.int64(xe0)
    i = np.int64(yi)
    while i != 0:
        if xe < -(1 << 12) or (1 << 12) < xe:
            ae += xe
            break
        if i & 1 == 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1 = 1.0 / a1
        ae = -ae
    return _go_ldexp(a1, ae)


@njit(cache=True)
def _go_ldexp(frac: float, e: int) -> float:
    """Go ``math.Ldexp`` (exponent clamped before the libm call; results agree for normals)."""
    if frac == 0.0 or math.isinf(frac) or frac != frac:
        return frac
    if e > 5000:
        e = 5000
    elif e < -5000:
        e = -5000
    return math.ldexp(frac, e)


# --- gamma ------------------------------------------------------------------------------------
@njit(cache=True)
def _stirling(x: float):
    """Go's stirling(x): the two factors of Gamma(x) for x > 33."""
    if x > 200.0:
        return math.inf, 1.0
    w = 1.0 / x
    w = 1.0 + w * ((((_GAM_S[0] * w + _GAM_S[1]) * w + _GAM_S[2]) * w + _GAM_S[3]) * w + _GAM_S[4])
    y1 = go_exp(x)
    y2 = 1.0
    if x > _MAX_STIRLING:
        v = go_pow(x, 0.5 * x - 0.25)
        y1, y2 = v, v / y1
    else:
        y1 = go_pow(x, x - 0.5) / y1
    return y1, _SQRT_TWO_PI * w * y2


@njit(cache=True)
def go_gamma(x: float) -> float:
    """Go ``math.Gamma`` for x > 0 (the workload only evaluates it on (1, 21])."""
    if x != x:
        return math.nan
    if math.isinf(x):
        return math.inf if x > 0 else math.nan
    if x == 0.0:
        return math.copysign(math.inf, x)
    if x < 0.0:
        if math.trunc(x) == x:
            return math.nan
        return math.gamma(x)  # reflection branch: never reached by the workload
    q = abs(x)
    if q > 33.0:
        y1, y2 = _stirling(x)
        return y1 * y2
    z = 1.0
    while x >= 3.0:
        x = x - 1.0
        z = z * x
    while x < 2.0:
        if x < 1e-09:
            if x == 0.0:
                return math.inf
            return z / ((1.0 + _EULER * x) * x)
        z = z / x
        x = x + 1.0
    if x == 2.0:
        return z
    x = x - 2.0
    p = (((((x * _GAM_P[0] + _GAM_P[1]) * x + _GAM_P[2]) * x + _GAM_P[3]) * x + _GAM_P[4]) * x
         + _GAM_P[5]) * x + _GAM_P[6]
    q = ((((((x * _GAM_Q[0] + _GAM_Q[1]) * x + _GAM_Q[2]) * x + _GAM_Q[3]) * x + _GAM_Q[4]) * x
          + _GAM_Q[5]) * x + _GAM_Q[6]) * x + _GAM_Q[7]
    return z * p / q


# --- cos --------------------------------------------------------------------------------------
@njit(cache=True)
def go_cos(x: float) -> float:
    """Go ``math.Cos`` for |x| < 2^29 (larger arguments fall back to libm)."""
    if x != x or math.isinf(x):
        return math.nan
    x = abs(x)
    if x >= 536870912.0:
        return math.cos(x)
    sign = False
    j = np.uint64(x * _FOUR_OVER_PI)
    y = float(j)
    if j & np.uint64(1) == np.uint64(1):
        j += np.uint64(1)
        y += 1.0
    j &= np.uint64(7)
    z = ((x - y * _PI4A) - y * _PI4B) - y * _PI4C
    if j > np.uint64(3):
        j -= np.uint64(4)
        sign = not sign
    if j > np.uint64(1):
        sign = not sign
    zz = z * z
    if j == np.uint64(1) or j == np.uint64(2):
        r = z + z * zz * ((((((_SIN[0] * zz) + _SIN[1]) * zz + _SIN[2]) * zz + _SIN[3]) * zz
                           + _SIN[4]) * zz + _SIN[5])
    else:
        r = 1.0 - 0.5 * zz + zz * zz * ((((((_COS[0] * zz) + _COS[1]) * zz + _COS[2]) * zz
                                          + _COS[3]) * zz + _COS[4]) * zz + _COS[5])
    if sign:
        r = -r
    return r
