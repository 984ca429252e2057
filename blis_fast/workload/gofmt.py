"""Go text formatting and parsing helpers used by workload messages and outputs.

* ``go_quote``  - ``%q`` of a string (``strconv.Quote``);
* ``go_pct_f``  - ``%f`` (six decimals; ``NaN``, ``+Inf``, ``-Inf``);
* ``go_g``      - ``strconv.FormatFloat(v, 'g', -1, 64)`` (also what ``%v`` prints);
* ``go_f``      - ``strconv.FormatFloat(v, 'f', -1, 64)`` (shortest digits, no exponent);
* ``go_parse_float`` - ``strconv.ParseFloat(s, 64)`` (``None`` where Go returns an error);
* ``go_sscanf_int``  - ``fmt.Sscanf(s, "%d", &n)`` for an ``int`` (value or error text);
* ``go_atoi``        - ``strconv.Atoi(s)`` for a 64-bit ``int`` (``None`` where Go errs).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_U64 = (1 << 64) - 1


def go_quote(s: str) -> str:
    """Go ``strconv.Quote``: double-quoted with Go escapes for non-printable runes."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\a":
            out.append("\\a")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\v":
            out.append("\\v")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)


def go_pct_f(v: float) -> str:
    """Go ``%f``: six decimals; NaN/Inf spelled as Go prints them."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:f}"


def _shortest(v: float) -> tuple[bool, str, int]:
    """Shortest round-trip digits of a finite non-zero |v|: (negative, digits, decimal point)."""
    sign, digits, exponent = Decimal(repr(v)).normalize().as_tuple()
    ds = "".join(map(str, digits))
    return bool(sign), ds, len(ds) + int(exponent)


def go_g(v: float) -> str:
    """Go ``strconv.FormatFloat(v, 'g', -1, 64)``: exponent form below 1e-4 and from 1e6 on
    (Go's shortest 'g' uses precision 6 for that switch)."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    neg, ds, dp = _shortest(v)
    exp = dp - 1
    sgn = "-" if neg else ""
    if exp < -4 or exp >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{sgn}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if dp <= 0:
        return f"{sgn}0.{'0' * -dp}{ds}"
    if dp >= len(ds):
        return f"{sgn}{ds}{'0' * (dp - len(ds))}"
    return f"{sgn}{ds[:dp]}.{ds[dp:]}"


def go_f(v: float) -> str:
    """Go ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest round-trip digits, no exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    neg, ds, dp = _shortest(v)
    sgn = "-" if neg else ""
    if dp <= 0:
        return f"{sgn}0.{'0' * -dp}{ds}"
    if dp >= len(ds):
        return f"{sgn}{ds}{'0' * (dp - len(ds))}"
    return f"{sgn}{ds[:dp]}.{ds[dp:]}"


_DEC_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HEX_FLOAT = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+")
_INF = re.compile(r"[+-]?(?:inf|infinity)", re.IGNORECASE)


def go_parse_float(s: str) -> float | None:
    """Go ``strconv.ParseFloat(s, 64)``; ``None`` where Go reports an error (syntax, overflow)."""
    if _INF.fullmatch(s):
        return -math.inf if s.startswith("-") else math.inf
    if s.lower() == "nan":
        return math.nan
    if _DEC_FLOAT.fullmatch(s):
        v = float(s)
    elif _HEX_FLOAT.fullmatch(s):
        neg = s.startswith("-")
        body = s.lstrip("+-")
        try:
            v = float.fromhex(body)
        except (ValueError, OverflowError):
            return None
        v = -v if neg else v
    else:
        return None
    if math.isinf(v):
        return None  # out of range: Go returns ±Inf with ErrRange
    return v


_ATOI = re.compile(r"[+-]?[0-9]+", re.ASCII)


def go_atoi(s: str) -> int | None:
    """Go ``strconv.Atoi(s)`` (optional sign, ASCII digits, no spaces or underscores, int64
    range); ``None`` where Go returns an error."""
    if not _ATOI.fullmatch(s):
        return None
    v = int(s)
    return v if -(1 << 63) <= v < (1 << 63) else None


_SCAN_SPACE = " \t\n\r\v\f\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


def go_sscanf_int(s: str) -> tuple[int | None, str]:
    """``fmt.Sscanf(s, "%d", &n)`` with a 64-bit ``int``: (value, "") or (None, error text)."""
    i = 0
    while i < len(s) and s[i] in _SCAN_SPACE:
        i += 1
    if i >= len(s):
        return None, "unexpected EOF"
    j = i
    if s[j] in "+-":
        j += 1
    if j >= len(s):
        return None, "unexpected EOF"
    k = j
    while k < len(s) and "0" <= s[k] <= "9":
        k += 1
    if k == j:
        return None, "expected integer"
    tok = s[i:k]
    v = int(tok)
    if v >= (1 << 63) or v < -(1 << 63):
        return None, f'strconv.ParseInt: parsing {go_quote(tok)}: value out of range'
    return v, ""
