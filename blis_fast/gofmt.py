"""Go text formatting and parsing helpers used by messages and outputs everywhere (a leaf).

* ``go_quote``  - ``%q`` of a string (``strconv.Quote``), on ``quote_escaped``;
* ``go_pct_f``  - ``%f`` (six decimals; ``NaN``, ``+Inf``, ``-Inf``);
* ``go_g``      - ``strconv.FormatFloat(v, 'g', -1, 64)`` (also what ``%v`` prints);
* ``go_f``      - ``strconv.FormatFloat(v, 'f', -1, 64)`` (shortest digits, no exponent);
* ``go_trim_space``  - ``strings.TrimSpace``;
* ``go_sscanf_int``  - ``fmt.Sscanf(s, "%d", &n)`` for an ``int`` (value or error text).

Numbers in text are parsed by ``blis_fast.gonum`` (the ``strconv`` ports).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import Decimal


def quote_escaped(s: str, escapes: Mapping[str, str], other: Callable[[str], str]) -> str:
    """``s`` double-quoted: each rune from ``escapes`` replaced by its escape, every other
    rune by ``other(rune)`` (itself or a numeric escape). The one quoting loop behind Go's
    ``strconv.Quote`` and yaml.v3's double-quoted scalars (``yaml_writer``)."""
    out = ['"']
    for ch in s:
        e = escapes.get(ch)
        out.append(e if e is not None else other(ch))
    out.append('"')
    return "".join(out)


_STRCONV_ESCAPES = {'"': '\\"', "\\": "\\\\", "\a": "\\a", "\b": "\\b", "\f": "\\f",
                    "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def _strconv_other(ch: str) -> str:
    """``strconv.Quote`` of a rune without a named escape: itself if printable, else
    ``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH``."""
    o = ord(ch)
    if o < 0x20 or o == 0x7F:
        return f"\\x{o:02x}"
    if ch.isprintable() or ch == " ":
        return ch
    if o < 0x10000:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def go_quote(s: str) -> str:
    """Go ``strconv.Quote``: double-quoted with Go escapes for non-printable runes."""
    return quote_escaped(s, _STRCONV_ESCAPES, _strconv_other)


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


def _positional(sgn: str, ds: str, dp: int) -> str:
    """Digits ``ds`` with the decimal point after ``dp`` of them, without an exponent."""
    if dp <= 0:
        return f"{sgn}0.{'0' * -dp}{ds}"
    if dp >= len(ds):
        return f"{sgn}{ds}{'0' * (dp - len(ds))}"
    return f"{sgn}{ds[:dp]}.{ds[dp:]}"


def _special(v: float) -> str | None:
    """How Go's shortest formats print NaN, the infinities and the zeros; None for the rest."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    return None


def go_g(v: float) -> str:
    """Go ``strconv.FormatFloat(v, 'g', -1, 64)``: exponent form below 1e-4 and from 1e6 on
    (Go's shortest 'g' uses precision 6 for that switch)."""
    special = _special(v)
    if special is not None:
        return special
    neg, ds, dp = _shortest(v)
    exp = dp - 1
    sgn = "-" if neg else ""
    if exp < -4 or exp >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{sgn}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    return _positional(sgn, ds, dp)


def go_f(v: float) -> str:
    """Go ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest round-trip digits, no exponent."""
    special = _special(v)
    if special is not None:
        return special
    neg, ds, dp = _shortest(v)
    return _positional("-" if neg else "", ds, dp)


_GO_SPACE = (" \t\n\v\f\r\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
             "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
"""The runes Go's ``unicode.IsSpace`` reports (what ``strings.TrimSpace`` removes)."""


def go_trim_space(s: str) -> str:
    """Go ``strings.TrimSpace``: strip ``unicode.IsSpace`` runes from both ends."""
    return s.strip(_GO_SPACE)


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
