"""Byte-exact reproduction of Go ``encoding/json`` output (ENG-7.8, CLU-7.23).

Python ``int`` values print as integers and Python ``float`` values as Go prints a
``float64``: the shortest digits that round-trip, plain decimal when
``1e-6 <= |x| < 1e21`` (so ``100.0`` prints ``100``), exponent form otherwise with
Go's clean-up of a ``e-0X`` exponent (``1e-07`` becomes ``1e-7``, ``1.5e+21`` stays).
Strings are escaped as Go does with HTML escaping on (``<``, ``>``, ``&`` become
``\\u003c``, ``\\u003e``, ``\\u0026``; U+2028/U+2029 are escaped; ``\\b \\f \\n \\r \\t``
use their short forms and other control characters ``\\u00XX``). The short ``\\b``/``\\f``
forms are Go >= 1.22 behaviour: the reference's go.mod says 1.21, but the order of tied
records in the parity results files is only reproduced by the sort of Go >= 1.24 (see
``blis_fast/kernels/go/gosort.py``), so the binary was built with a newer toolchain.
Invalid UTF-8 (a lone surrogate in a Python string) becomes ``\\ufffd``.

Which fields exist, which are omitted (``omitempty``) and whether a slice is empty or
``null`` are decisions of the caller: :func:`marshal_indent` writes exactly the dict it
is given, in its insertion order.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["format_go_float", "quote_go_string", "needs_escape", "marshal_indent", "marshal_value"]


def _digits_and_point(r: str) -> tuple[str, int]:
    """Split a positive ``repr`` into significant digits and decimal-point position."""
    if "e" in r:
        mant, exp_s = r.split("e")
        exp = int(exp_s)
    else:
        mant, exp = r, 0
    if "." in mant:
        ip, fp = mant.split(".")
    else:
        ip, fp = mant, ""
    digits = ip + fp
    point = len(ip) + exp
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0") or "0"
    return digits, point


def format_go_float(x: float) -> str:
    """Format a float64 exactly as Go's ``encoding/json`` does."""
    x = float(x)
    ax = abs(x)
    # Fast path: Python's repr is plain decimal for 1e-4 <= |x| < 1e16 and has the same
    # shortest round-trip digits as Go's strconv; only a trailing ".0" differs.
    if 1e-4 <= ax < 1e16:
        r = repr(x)
        return r[:-2] if r.endswith(".0") else r
    if x != x or ax == math.inf:
        raise ValueError(f"json: unsupported value: {x!r}")
    if ax == 0.0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign = "-" if x < 0 else ""
    digits, point = _digits_and_point(repr(ax))
    if 1e-6 <= ax < 1e21:  # Go chooses 'f' format
        if point <= 0:
            body = "0." + "0" * (-point) + digits
        elif point >= len(digits):
            body = digits + "0" * (point - len(digits))
        else:
            body = digits[:point] + "." + digits[point:]
        return sign + body
    # 'e' format: d[.ddd]e±XX (at least two exponent digits), then Go's json clean-up
    exp = point - 1
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    if exp < 0:
        exp_s = "e-" + str(-exp)  # Go writes "e-07"; json trims it to "e-7"
    else:
        exp_s = f"e+{exp:02d}"
    return sign + mant + exp_s


# Characters needing escape in Go's encoder with escapeHTML=true.
_ESCAPE_RE = re.compile('[\\x00-\\x1f"\\\\<>&\u2028\u2029\ud800-\udfff]')
_SIMPLE = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _escape_char(m: re.Match[str]) -> str:
    c = m.group(0)
    s = _SIMPLE.get(c)
    if s is not None:
        return s
    o = ord(c)
    if 0xD800 <= o <= 0xDFFF:  # lone surrogate = invalid UTF-8 in Go's view
        return "\\ufffd"
    return f"\\u{o:04x}"


def quote_go_string(s: str) -> str:
    """Return the JSON string literal Go's ``encoding/json`` writes for ``s``."""
    return '"' + _ESCAPE_RE.sub(_escape_char, s) + '"'


def needs_escape(s: str) -> bool:
    """True when Go would write ``s`` with at least one escape sequence."""
    return _ESCAPE_RE.search(s) is not None


def marshal_value(v: Any) -> str:
    """Encode one scalar (bool, int, float, str, None) as Go does."""
    if v is None:
        return "null"
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return format_go_float(float(v))
    if isinstance(v, str):
        return quote_go_string(v)
    raise TypeError(f"json: unsupported type: {type(v).__name__}")


def _encode(v: Any, level: int, indent: str, out: list[str]) -> None:
    if isinstance(v, Mapping):
        if not v:
            out.append("{}")
            return
        inner = "\n" + indent * (level + 1)
        out.append("{")
        first = True
        for k, item in v.items():
            if not isinstance(k, str):
                raise TypeError("json: object keys must be str")
            out.append(inner if first else "," + inner)
            first = False
            out.append(quote_go_string(k))
            out.append(": ")
            _encode(item, level + 1, indent, out)
        out.append("\n" + indent * level + "}")
    elif isinstance(v, (list, tuple, np.ndarray)) or (
        isinstance(v, Sequence) and not isinstance(v, str)
    ):
        if len(v) == 0:
            out.append("[]")
            return
        inner = "\n" + indent * (level + 1)
        out.append("[")
        first = True
        for item in v:
            out.append(inner if first else "," + inner)
            first = False
            _encode(item, level + 1, indent, out)
        out.append("\n" + indent * level + "]")
    else:
        out.append(marshal_value(v))


def marshal_indent(obj: Any, indent: str = "  ") -> str:
    """Return Go's ``json.MarshalIndent(obj, "", indent)`` text (no trailing newline)."""
    out: list[str] = []
    _encode(obj, 0, indent, out)
    return "".join(out)
