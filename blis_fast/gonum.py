"""Go's ``strconv`` number parsers, one port per Go function, for every number read from text.

The reference reads flags (pflag), trace CSV fields, ``key:value`` lists and YAML scalars
with these functions, so blis reads them with the same grammar: ASCII digits only, no
surrounding spaces, ``_`` only between digits (and only where Go allows it), hex floats with a
``p`` exponent, ``inf``/``infinity``/``nan`` in any case, and a range error (not ±Inf) when a
value overflows. Errors are :class:`NumError` (a ``ValueError``) whose text is Go's own
(``strconv.ParseFloat: parsing "1e400": value out of range``).

* ``parse_float(s)``            - ``strconv.ParseFloat(s, 64)``;
* ``parse_int(s, base, bits)``  - ``strconv.ParseInt`` (base 0: ``0x``/``0o``/``0b``/``0``
  prefixes and ``_`` separators);
* ``parse_uint(s, base, bits)`` - ``strconv.ParseUint``;
* ``atoi(s)``                   - ``strconv.Atoi`` (base 10, 64-bit ``int``);
* ``parse_bool(s)``             - ``strconv.ParseBool``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

ERR_SYNTAX = "invalid syntax"
ERR_RANGE = "value out of range"
_U64_MAX = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1
"""Go's ``math.MaxInt64``: the default horizon, the bound of the int64 values the reference keeps."""
INT64_MIN = -(1 << 63)
"""Go's ``math.MinInt64``."""


class NumError(ValueError):
    """Go's ``*strconv.NumError``: the function, the input and the kind (syntax or range)."""

    def __init__(self, func: str, num: str, err: str) -> None:
        # the message is formatted when read: decoders try a parse and catch the error often
        # (thousands of times while defaults.yaml is read), and quoting is costly
        super().__init__(func, num, err)
        self.func = func
        self.num = num
        self.err = err

    def __str__(self) -> str:
        from blis_fast.gofmt import go_quote  # lazy: blis --help loads gonum, not gofmt

        return f"strconv.{self.func}: parsing {go_quote(self.num)}: {self.err}"

    @property
    def is_range(self) -> bool:
        """True for ``ErrRange`` (well-formed but out of range), False for ``ErrSyntax``."""
        return self.err == ERR_RANGE


def _lower(c: str) -> str:
    """Go's ``lower(c)``: ``c | 0x20`` (maps ASCII upper-case letters to lower case only)."""
    return chr(ord(c) | 0x20)


def _is_dec(c: str) -> bool:
    return "0" <= c <= "9"


def underscore_ok(s: str) -> bool:
    """Go's ``underscoreOK``: every ``_`` sits between digits (a base prefix counts as one)."""
    saw = "^"
    i = 0
    if s[:1] in ("+", "-"):
        s = s[1:]
    hexa = False
    if len(s) >= 2 and s[0] == "0" and _lower(s[1]) in ("b", "o", "x"):
        i = 2
        saw = "0"
        hexa = _lower(s[1]) == "x"
    while i < len(s):
        c = s[i]
        i += 1
        if _is_dec(c) or (hexa and "a" <= _lower(c) <= "f"):
            saw = "0"
            continue
        if c == "_":
            if saw != "0":
                return False
            saw = "_"
            continue
        if saw == "_":
            return False
        saw = "!"
    return saw != "_"


def _prefix_len_ignore_case(s: str, prefix: str) -> int:
    """Go's ``commonPrefixLenIgnoreCase`` (only ASCII A-Z fold to lower case)."""
    n = min(len(prefix), len(s))
    for i in range(n):
        c = s[i]
        if "A" <= c <= "Z":
            c = chr(ord(c) + 32)
        if c != prefix[i]:
            return i
    return n


def _special(s: str) -> tuple[float, int] | None:
    """Go's ``special``: a leading inf/infinity (optionally signed) or nan, and its length."""
    if not s:
        return None
    c = s[0]
    if c in "+-iI":
        sign = -1.0 if c == "-" else 1.0
        nsign = 1 if c in "+-" else 0
        n = _prefix_len_ignore_case(s[nsign:], "infinity")
        if 3 < n < 8:
            n = 3
        if n in (3, 8):
            return math.copysign(math.inf, sign), nsign + n
    elif c in "nN" and _prefix_len_ignore_case(s, "nan") == 3:
        return math.nan, 3
    return None


def _capped_exponent(digits: str) -> int:
    """The exponent Go accumulates: it stops adding digits once the value reaches 10000."""
    e = 0
    for c in digits:
        if c != "_" and e < 10000:
            e = e * 10 + ord(c) - 48
    return e


def _read_float(s: str) -> tuple[int, float | None]:
    """Go's ``readFloat`` followed by the conversion: (characters consumed, value or None when
    the prefix is not a number). The value is rounded to nearest-even (Python's ``float`` and
    ``float.fromhex`` round correctly, as Go does); ±inf means Go's range error."""
    n = len(s)
    i = 0
    neg = False
    if i < n and s[i] in "+-":
        neg = s[i] == "-"
        i += 1
    hexa = i + 2 < n and s[i] == "0" and _lower(s[i + 1]) == "x"
    if hexa:
        i += 2
    int_part: list[str] = []
    frac_part: list[str] = []
    sawdot = sawdigits = underscores = False
    while i < n:
        c = s[i]
        if c == "_":
            underscores = True
        elif c == ".":
            if sawdot:
                break
            sawdot = True
        elif _is_dec(c) or (hexa and "a" <= _lower(c) <= "f"):
            sawdigits = True
            (frac_part if sawdot else int_part).append(c)
        else:
            break
        i += 1
    if not sawdigits:
        return i, None
    exp = 0
    if i < n and _lower(s[i]) == ("p" if hexa else "e"):
        i += 1
        if i >= n:
            return i, None
        esign = 1
        if s[i] in "+-":
            esign = -1 if s[i] == "-" else 1
            i += 1
        if i >= n or not _is_dec(s[i]):
            return i, None
        start = i
        while i < n and (_is_dec(s[i]) or s[i] == "_"):
            underscores = underscores or s[i] == "_"
            i += 1
        exp = esign * _capped_exponent(s[start:i])
    elif hexa:
        return i, None  # a hex float needs its p exponent
    if underscores and not underscore_ok(s[:i]):
        return i, None
    ints = "".join(int_part) or "0"
    fracs = "".join(frac_part) or "0"
    if hexa:
        try:
            value = float.fromhex(f"0x{ints}.{fracs}p{exp}")
        except OverflowError:
            value = math.inf
    else:
        value = float(f"{ints}.{fracs}e{exp}")
    return i, -value if neg else value


_PLAIN_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]{1,5})?")
"""Decimals without ``_`` whose exponent Go reads in full: Python's ``float`` reads these with
the same grammar and rounding, so they skip the character scan."""


def parse_float(s: str) -> float:
    """``strconv.ParseFloat(s, 64)``: the nearest float64, or NumError (syntax or range)."""
    if _PLAIN_DECIMAL.fullmatch(s):
        value = float(s)
        if math.isinf(value):
            raise NumError("ParseFloat", s, ERR_RANGE)
        return value
    special = _special(s)
    if special is not None:
        value, n = special
        if n == len(s):
            return value
        raise NumError("ParseFloat", s, ERR_SYNTAX)
    n, value = _read_float(s)
    if value is None or n != len(s):
        raise NumError("ParseFloat", s, ERR_SYNTAX)
    if math.isinf(value):
        raise NumError("ParseFloat", s, ERR_RANGE)
    return value


def _check_args(func: str, s: str, base: int, bit_size: int) -> None:
    if not (base == 0 or 2 <= base <= 36):
        raise NumError(func, s, f"invalid base {base}")
    if not 0 <= bit_size <= 64:
        raise NumError(func, s, f"invalid bit size {bit_size}")


def parse_uint(s: str, base: int = 10, bit_size: int = 64) -> int:
    """``strconv.ParseUint(s, base, bitSize)`` (``bitSize`` 0 is Go's 64-bit ``uint``)."""
    if s == "":
        raise NumError("ParseUint", s, ERR_SYNTAX)
    _check_args("ParseUint", s, base, bit_size)
    base0 = base == 0
    body = s
    if base0:
        base = 10
        if s[0] == "0":
            if len(s) >= 3 and _lower(s[1]) in ("b", "o", "x"):
                base = {"b": 2, "o": 8, "x": 16}[_lower(s[1])]
                body = s[2:]
            else:
                base = 8
                body = s[1:]
    max_val = (1 << (bit_size or 64)) - 1
    cutoff = _U64_MAX // base + 1
    underscores = False
    value = 0
    for c in body:
        if c == "_" and base0:
            underscores = True
            continue
        if _is_dec(c):
            d = ord(c) - 48
        elif "a" <= _lower(c) <= "z":
            d = ord(_lower(c)) - ord("a") + 10
        else:
            raise NumError("ParseUint", s, ERR_SYNTAX)
        if d >= base:
            raise NumError("ParseUint", s, ERR_SYNTAX)
        if value >= cutoff:
            raise NumError("ParseUint", s, ERR_RANGE)  # Go stops at the first overflow
        value = value * base + d
        if value > max_val:
            raise NumError("ParseUint", s, ERR_RANGE)
    if underscores and not underscore_ok(s):
        raise NumError("ParseUint", s, ERR_SYNTAX)
    return value


def parse_int(s: str, base: int = 0, bit_size: int = 64) -> int:
    """``strconv.ParseInt(s, base, bitSize)`` (what pflag's int and int64 flags call with
    base 0, bit size 64); ``bitSize`` 0 is Go's 64-bit ``int``."""
    if s == "":
        raise NumError("ParseInt", s, ERR_SYNTAX)
    if base in (0, 10) and bit_size in (0, 64) and len(s) < 19 and s.isascii():
        digits = s[1:] if s[0] in "+-" else s
        if digits.isdigit() and (base == 10 or digits[0] != "0" or len(digits) == 1):
            return int(s)  # Go's fast path: a short plain decimal always fits
    body = s[1:] if s[0] in "+-" else s
    neg = s[0] == "-"
    try:
        un = parse_uint(body, base, bit_size)
    except NumError as exc:
        if not exc.is_range:
            raise NumError("ParseInt", s, exc.err) from None
        un = _U64_MAX
    cutoff = 1 << ((bit_size or 64) - 1)
    if (not neg and un >= cutoff) or (neg and un > cutoff):
        raise NumError("ParseInt", s, ERR_RANGE)
    return -un if neg else un


def atoi(s: str) -> int:
    """``strconv.Atoi``: base 10, optional sign, 64-bit ``int``; errors name ``Atoi``."""
    try:
        return parse_int(s, 10, 64)
    except NumError as exc:
        raise NumError("Atoi", s, exc.err) from None


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(s: str) -> bool:
    """``strconv.ParseBool``: 1, t, T, TRUE, true, True and their false counterparts."""
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise NumError("ParseBool", s, ERR_SYNTAX)


def or_none(parse: Callable[..., T], *args: Any) -> T | None:
    """``parse(*args)``, or None where Go's function returns an error (for callers that
    branch on success, as the reference does with ``err == nil``)."""
    try:
        return parse(*args)
    except NumError:
        return None


__all__ = [
    "ERR_RANGE",
    "ERR_SYNTAX",
    "NumError",
    "atoi",
    "or_none",
    "parse_bool",
    "parse_float",
    "parse_int",
    "parse_uint",
    "underscore_ok",
]
