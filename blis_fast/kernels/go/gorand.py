"""Exact Numba port of Go 1.21 ``math/rand`` (v1): ``rand.New(rand.NewSource(seed))``.

The reference draws every random number from this generator (spec WL-14.1, ENG-8), so
bit-exact parity needs the same algorithm, not merely the same distributions.

Generator state is a NumPy ``int64`` array of length :data:`STATE_LEN` (609): the 607 words
of the additive lagged-Fibonacci register, then the ``tap`` and ``feed`` indices. All
methods mutate that array in place and take it as first argument.

Nothing here is pasted from Go:

* the seeding table (Go's ``rngCooked``) is *recomputed* (once; later imports read the result
  kept beside the bytecode). Go defines it as the
  generator register after 7.8e12 steps from a fixed start (``gen_cooked.go``). The register
  obeys the linear recurrence ``s[k] = s[k-607] + s[k-273]`` over Z/2^64, so the state after
  N steps is obtained by computing ``x^N mod (x^607 - x^334 - 1)`` (square-and-multiply on
  polynomials with uint64 coefficients) instead of running 7.8e12 steps;
* the ziggurat tables of ``ExpFloat64``/``NormFloat64`` are rebuilt from Marsaglia & Tsang's
  defining recurrences (J. Stat. Softw. 5(8), 2000) and rounded the way Go stores them
  (uint32 for ``k``, float32 for ``w`` and ``f``). ``tests/test_gorand.py`` checks both
  against literal values of Go's source.

Integer arithmetic relies on int64 wrap-around, which holds for compiled code only (do not
run these kernels with ``NUMBA_DISABLE_JIT``).
"""

from __future__ import annotations

import math

import numpy as np

from blis_fast.kernels.jit import njit
from blis_fast.stored import kept_beside

# --- generator constants (Go's rng.go) -------------------------------------------------
_LEN = 607
_TAP = 273
_FEED0 = _LEN - _TAP  # 334
_M31 = 2147483647  # 2^31 - 1, modulus of the seeding LCG

REGISTER_LEN = _LEN
"""Words of the lagged-Fibonacci register (the state's first words)."""
TAP_INDEX = _LEN
"""State word holding the ``tap`` cursor."""
FEED_INDEX = _LEN + 1
"""State word holding the ``feed`` cursor."""
STATE_LEN = _LEN + 2
"""Length of a generator state array (607 register words, tap, feed)."""

# Steps Go's generator program runs before printing the cooked table.
_COOKED_STEPS = 7_800_000_000_000

# --- ziggurat constants ------------------------------------------------------------------
_RE = 7.69711747013104972  # start of the exponential tail (Go's exp.go)
_RN = 3.442619855899  # start of the normal tail (Go's normal.go)
_INV_RN = 1.0 / _RN  # equals Go's exact constant 1/rn rounded to float64


def _seedrand_py(x: int) -> int:
    """One step of the Park-Miller LCG x <- 48271 x mod (2^31-1), Schrage form (pure Python)."""
    hi, lo = divmod(x, 44488)
    x = 48271 * lo - 3399 * hi
    if x < 0:
        x += _M31
    return x


def _cooked_start() -> np.ndarray:
    """Register filled the way Go's table generator seeds it (seed 1, its own bit layout)."""
    vec = np.zeros(_LEN, dtype=np.uint64)
    x = 1
    for i in range(-20, _LEN):
        x = _seedrand_py(x)
        if i >= 0:
            u = x << 20
            x = _seedrand_py(x)
            u ^= x << 10
            x = _seedrand_py(x)
            u ^= x
            vec[i] = u
    return vec


def _poly_reduce(p: np.ndarray) -> np.ndarray:
    """Reduce a uint64 polynomial modulo x^607 - x^334 - 1 (x^607 == x^334 + 1)."""
    while p.size > _LEN:
        hi = p[_LEN:]
        q = np.zeros(max(_LEN, _FEED0 + hi.size), dtype=np.uint64)
        q[:_LEN] = p[:_LEN]
        q[: hi.size] += hi
        q[_FEED0 : _FEED0 + hi.size] += hi
        p = q
    return p


def _poly_sqr_mod(a: np.ndarray) -> np.ndarray:
    """Square a reduced polynomial modulo the recurrence polynomial (coefficients mod 2^64).

    ``np.convolve`` of uint64 arrays multiplies and adds with uint64 wrap-around, which is
    exactly coefficient arithmetic mod 2^64.
    """
    return _poly_reduce(np.convolve(a, a))


def _x_pow_mod(n: int) -> np.ndarray:
    """Coefficients of x^n modulo x^607 - x^334 - 1, by left-to-right square-and-multiply."""
    r = np.zeros(_LEN, dtype=np.uint64)
    r[0] = 1
    for bit in bin(n)[2:]:
        r = _poly_sqr_mod(r)
        if bit == "1":
            r = _poly_reduce(np.concatenate((np.zeros(1, dtype=np.uint64), r)))
    return r


def _compute_cooked() -> np.ndarray:
    """Recompute Go's rngCooked table: the register after 7.8e12 steps, as int64."""
    start = _cooked_start()
    # Sequence view: t[j] (j = 0..606) is the register word the (j-606)-th step would
    # overwrite; position p holds t[j] with p = (334 - (j - 606)) mod 607.
    t = np.zeros(2 * _LEN, dtype=np.uint64)
    j = np.arange(_LEN)
    t[:_LEN] = start[(_FEED0 - (j - (_LEN - 1))) % _LEN]
    lo = _LEN
    while lo < 2 * _LEN:  # t[j] = t[j-607] + t[j-273], in blocks of 273 (no overlap)
        hi = min(lo + _TAP, 2 * _LEN)
        t[lo:hi] = t[lo - _LEN : hi - _LEN] + t[lo - _TAP : hi - _TAP]
        lo = hi
    c = _x_pow_mod(_COOKED_STEPS)
    windows = np.lib.stride_tricks.sliding_window_view(t, _LEN)[:_LEN]
    vals = (windows * c).sum(axis=1, dtype=np.uint64)  # t[N + j] for j = 0..606
    k = _COOKED_STEPS - (_LEN - 1) + j  # step index that wrote each value
    out = np.empty(_LEN, dtype=np.uint64)
    out[(_FEED0 - k) % _LEN] = vals
    return out.view(np.int64)


def _compute_ziggurat() -> tuple[np.ndarray, ...]:
    """Rebuild Go's ziggurat tables (ke, we, fe, kn, wn, fn) from Marsaglia-Tsang's recurrences."""
    two31 = 2147483648.0
    two32 = 4294967296.0
    # Normal distribution, 128 strips.
    dn = 3.442619855899
    tn = dn
    vn = 9.91256303526217e-3
    kn = np.zeros(128, dtype=np.int64)
    wn = np.zeros(128, dtype=np.float64)
    fn = np.zeros(128, dtype=np.float64)
    q = vn / math.exp(-0.5 * dn * dn)
    kn[0] = int((dn / q) * two31)
    wn[0] = q / two31
    wn[127] = dn / two31
    fn[0] = 1.0
    fn[127] = math.exp(-0.5 * dn * dn)
    for i in range(126, 0, -1):
        dn = math.sqrt(-2.0 * math.log(vn / dn + math.exp(-0.5 * dn * dn)))
        kn[i + 1] = int((dn / tn) * two31)
        tn = dn
        fn[i] = math.exp(-0.5 * dn * dn)
        wn[i] = dn / two31
    # Exponential distribution, 256 strips.
    de = 7.697117470131487
    te = de
    ve = 3.949659822581572e-3
    ke = np.zeros(256, dtype=np.int64)
    we = np.zeros(256, dtype=np.float64)
    fe = np.zeros(256, dtype=np.float64)
    q = ve / math.exp(-de)
    ke[0] = int((de / q) * two32)
    we[0] = q / two32
    we[255] = de / two32
    fe[0] = 1.0
    fe[255] = math.exp(-de)
    for i in range(254, 0, -1):
        de = -math.log(ve / de + math.exp(-de))
        ke[i + 1] = int((de / te) * two32)
        te = de
        fe[i] = math.exp(-de)
        we[i] = de / two32
    f32 = np.float32
    return ke, we.astype(f32), fe.astype(f32), kn, wn.astype(f32), fn.astype(f32)


RNG_COOKED = kept_beside(__file__, "rng-cooked", b"", _compute_cooked, np.ndarray)
"""Go's seeding table rngCooked (607 int64 words), recomputed once and then kept beside the
bytecode (``blis_fast.stored``: the computation is 50 ms of every start-up otherwise)."""

KE, WE, FE, KN, WN, FN = _compute_ziggurat()
"""Ziggurat tables: k as int64 (Go: uint32), w and f as float32 (Go: float32)."""

_COOKED = RNG_COOKED
_KE, _WE, _FE, _KN, _WN, _FN = KE, WE, FE, KN, WN, FN


# --- seeding -----------------------------------------------------------------------------
@njit(cache=True)
def _seedrand(x: int) -> int:
    """One Park-Miller LCG step (x > 0), as Go's seedrand."""
    hi = x // 44488
    lo = x % 44488
    x = 48271 * lo - 3399 * hi
    if x < 0:
        x += 2147483647
    return x


@njit(cache=True)
def seed_source(s: np.ndarray, seed: int) -> None:
    """Re-seed state ``s`` in place exactly as Go's ``rngSource.Seed(seed)``."""
    seed = np.int64(seed) % 2147483647  # floored remainder == Go's remainder, fixed up
    if seed == 0:
        seed = 89482311
    x = seed
    for i in range(-20, REGISTER_LEN):
        x = _seedrand(x)
        if i >= 0:
            u = x << 40
            x = _seedrand(x)
            u ^= x << 20
            x = _seedrand(x)
            u ^= x
            u ^= _COOKED[i]
            s[i] = u
    s[TAP_INDEX] = 0
    s[FEED_INDEX] = _FEED0


@njit(cache=True)
def new_source(seed: int) -> np.ndarray:
    """Return a fresh generator state, as ``rand.New(rand.NewSource(seed))``."""
    s = np.empty(STATE_LEN, dtype=np.int64)
    seed_source(s, seed)
    return s


# --- methods -----------------------------------------------------------------------------
@njit(cache=True)
def int63(s: np.ndarray) -> int:
    """Go ``Int63``: next register word, low 63 bits."""
    tap = s[TAP_INDEX] - 1
    if tap < 0:
        tap += REGISTER_LEN
    feed = s[FEED_INDEX] - 1
    if feed < 0:
        feed += REGISTER_LEN
    x = s[feed] + s[tap]  # wraps mod 2^64
    s[feed] = x
    s[TAP_INDEX] = tap
    s[FEED_INDEX] = feed
    return x & 0x7FFFFFFFFFFFFFFF


@njit(cache=True)
def uint32(s: np.ndarray) -> int:
    """Go ``Uint32``: Int63 >> 31 (returned as a non-negative int64)."""
    return int63(s) >> 31


@njit(cache=True)
def int31(s: np.ndarray) -> int:
    """Go ``Int31``: Int63 >> 32."""
    return int63(s) >> 32


@njit(cache=True)
def int31n(s: np.ndarray, n: int) -> int:
    """Go ``Int31n`` (0 < n < 2^31): mask for powers of two, else rejection then modulo."""
    if n & (n - 1) == 0:
        return int31(s) & (n - 1)
    vmax = 2147483647 - (2147483648 % n)
    v = int31(s)
    while v > vmax:
        v = int31(s)
    return v % n


@njit(cache=True)
def int63n(s: np.ndarray, n: int) -> int:
    """Go ``Int63n`` (n > 0): mask for powers of two, else rejection then modulo."""
    if n & (n - 1) == 0:
        return int63(s) & (n - 1)
    rem = (0x7FFFFFFFFFFFFFFF % n + 1) % n  # 2^63 mod n without overflow
    vmax = 0x7FFFFFFFFFFFFFFF - rem
    v = int63(s)
    while v > vmax:
        v = int63(s)
    return v % n


@njit(cache=True)
def intn(s: np.ndarray, n: int) -> int:
    """Go ``Intn`` (n > 0): Int31n when n fits in 31 bits, else Int63n."""
    if n <= 2147483647:
        return int31n(s, n)
    return int63n(s, n)


@njit(cache=True)
def float64_(s: np.ndarray) -> float:
    """Go ``Float64``: Int63 / 2^63, redrawn in the (rare) case it rounds to 1.0."""
    while True:
        f = float(int63(s)) / 9223372036854775808.0
        if f != 1.0:
            return f


@njit(cache=True)
def exp_float64(s: np.ndarray) -> float:
    """Go ``ExpFloat64``: ziggurat sampler of Exp(1) (256 strips, float32 rejection test)."""
    while True:
        j = uint32(s)
        i = j & 0xFF
        x = float(j) * np.float64(_WE[i])
        if j < _KE[i]:
            return x
        if i == 0:
            return _RE - math.log(float64_(s))
        u = np.float32(float64_(s))
        lhs = _FE[i] + u * (_FE[i - 1] - _FE[i])
        if lhs < np.float32(math.exp(-x)):
            return x


@njit(cache=True)
def norm_float64(s: np.ndarray) -> float:
    """Go ``NormFloat64``: ziggurat sampler of N(0,1) (128 strips, float32 rejection test)."""
    while True:
        j = uint32(s)
        if j >= 2147483648:  # reinterpret as int32
            j -= 4294967296
        i = j & 0x7F
        x = float(j) * np.float64(_WN[i])
        aj = -j if j < 0 else j
        if aj < _KN[i]:
            return x
        if i == 0:
            while True:
                x = -math.log(float64_(s)) * _INV_RN
                y = -math.log(float64_(s))
                if y + y >= x * x:
                    break
            if j > 0:
                return _RN + x
            return -_RN - x
        u = np.float32(float64_(s))
        lhs = _FN[i] + u * (_FN[i - 1] - _FN[i])
        if lhs < np.float32(math.exp(-0.5 * x * x)):
            return x


# --- subsystem seeds (ENG-8) ---------------------------------------------------------------
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_U64 = (1 << 64) - 1


def fnv1a64(name: str) -> int:
    """64-bit FNV-1a of the UTF-8 bytes of ``name``, as an unsigned Python int."""
    h = _FNV_OFFSET
    for b in name.encode("utf-8"):
        h ^= b
        h = (h * _FNV_PRIME) & _U64
    return h


def _to_int64(v: int) -> int:
    """Reinterpret an unsigned 64-bit value as a signed int64."""
    v &= _U64
    return v - (1 << 64) if v >= (1 << 63) else v


def subsystem_seed(seed: int, name: str) -> int:
    """Seed of an RNG subsystem (ENG-8): ``"workload"`` keeps the seed, others XOR fnv1a64(name)."""
    if name == "workload":
        return int(seed)
    return _to_int64(int(seed) ^ fnv1a64(name))
