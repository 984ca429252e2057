"""yaml.v3's resolution of untagged plain scalars (its ``resolve.go``, the YAML 1.2 core schema
as yaml.v3 applies it): the tag and value of ``1e3``, ``0o17``, ``~``, ``.inf``, a timestamp, and
the YAML 1.1 booleans it still accepts in bool fields. Shared by the strict decoders of
``config/strict_yaml.py`` and the workload-spec loader (``workload/spec_yaml.py``)."""

from __future__ import annotations

import math
import re
from typing import Any

from blis_fast.gonum import or_none, parse_float, parse_int, parse_uint

STR, INT, FLOAT, BOOL, NULL, TIMESTAMP, MERGE = (
    "!!str", "!!int", "!!float", "!!bool", "!!null", "!!timestamp", "!!merge",
)

_RESOLVE_MAP: dict[str, tuple[str, Any]] = {}
for _vals, _tag, _v in (
    (("true", "True", "TRUE"), BOOL, True),
    (("false", "False", "FALSE"), BOOL, False),
    (("", "~", "null", "Null", "NULL"), NULL, None),
    ((".nan", ".NaN", ".NAN"), FLOAT, math.nan),
    ((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), FLOAT, math.inf),
    (("-.inf", "-.Inf", "-.INF"), FLOAT, -math.inf),
    (("<<",), MERGE, "<<"),
):
    for _s in _vals:
        _RESOLVE_MAP[_s] = (_tag, _v)

_YAML_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
OLD_BOOLS = {
    "y": True, "Y": True, "yes": True, "Yes": True, "YES": True, "on": True, "On": True,
    "ON": True, "n": False, "N": False, "no": False, "No": False, "NO": False, "off": False,
    "Off": False, "OFF": False,
}
_TS_DATE = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})")
_TS_FULL = re.compile(
    r"(\d{4})-(\d{1,2})-(\d{1,2})(?:[Tt]|[ ])(\d{1,2}):(\d{1,2}):(\d{1,2})(\.\d{1,9})?"
    r"(Z|[+-]\d{2}:\d{2})?"
)


def _is_timestamp(s: str) -> bool:
    """yaml.v3 parseTimestamp: a date, or a date-time in the formats yaml.v3 accepts."""
    if len(s) < 5 or not s[:4].isdigit() or s[4] != "-":
        return False
    m = _TS_DATE.fullmatch(s) or _TS_FULL.fullmatch(s)
    if not m:
        return False
    y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not 1 <= mo <= 12:
        return False
    days = [31, 29 if (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)) else 28, 31, 30, 31,
            30, 31, 31, 30, 31, 30, 31][mo - 1]
    return 1 <= d <= days


def resolve_plain(s: str) -> tuple[str, Any]:
    """Tag and value yaml.v3 gives an untagged plain scalar ``s``."""
    if s in _RESOLVE_MAP:
        return _RESOLVE_MAP[s]
    c = s[0]
    if c == ".":
        v = or_none(parse_float, s)
        if v is not None:
            return FLOAT, v
    elif c in "+-0123456789":
        if _is_timestamp(s):
            return TIMESTAMP, s
        plain = s.replace("_", "")
        for parse in (parse_int, parse_uint):
            v = or_none(parse, plain, 0, 64)
            if v is not None:
                return INT, v
        if _YAML_FLOAT.fullmatch(plain):
            f = or_none(parse_float, plain)
            if f is not None:
                return FLOAT, f
        # yaml.v3's explicit-base fallbacks (they read e.g. "0b-1" as -1 and "0o+7" as 7)
        for prefix, base in (("0b", 2), ("0o", 8)):
            if plain.startswith(prefix):
                for parse in (parse_int, parse_uint):
                    v = or_none(parse, plain[2:], base, 64)
                    if v is not None:
                        return INT, v
            elif plain.startswith("-" + prefix):
                v = or_none(parse_int, "-" + plain[3:], base, 64)
                if v is not None:
                    return INT, v
    return STR, s
