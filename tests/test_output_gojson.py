"""Go encoding/json formatting (ENG-7.8, CLU-7.23) and Go %.Nf formatting."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blis_fast.output.gojson import format_go_float, marshal_indent, quote_go_string
from blis_fast.output.stats import go_fixed


@pytest.mark.parametrize(
    ("x", "expected"),
    [
        (0.0, "0"),
        (-0.0, "-0"),
        (100.0, "100"),
        (1.0, "1"),
        (0.1 + 0.2, "0.30000000000000004"),
        (2712.3763000000004, "2712.3763000000004"),
        (3047.7536999999998, "3047.7536999999998"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (9.99e-7, "9.99e-7"),
        (1.2345e-10, "1.2345e-10"),
        (1e-100, "1e-100"),
        (5e-324, "5e-324"),
        (1e21, "1e+21"),
        (1.5e21, "1.5e+21"),
        (1e20, "100000000000000000000"),
        (123456789012345678901.0, "123456789012345680000"),
        (float(2**60), "1152921504606847000"),
        (1e16, "10000000000000000"),
        (float(2**53 + 2), "9007199254740994"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (-1e-5, "-0.00001"),
        (0.0001, "0.0001"),
        (-2.5, "-2.5"),
        (101.506603, "101.506603"),
        (0.9851575862508176, "0.9851575862508176"),
    ],
)
def test_format_go_float_tricky(x: float, expected: str) -> None:
    assert format_go_float(x) == expected


@pytest.mark.parametrize("x", [math.nan, math.inf, -math.inf])
def test_format_go_float_rejects_non_finite(x: float) -> None:
    with pytest.raises(ValueError):
        format_go_float(x)


def _go_rule(x: float) -> str:
    """Independent restatement of encoding/json floatEncoder via '%r' digits."""
    ax = abs(x)
    digits, exp10 = np.format_float_scientific(ax, unique=True, trim="-").split("e")
    mant = digits.replace(".", "")
    e = int(exp10)
    sign = "-" if math.copysign(1, x) < 0 else ""
    if ax == 0:
        return sign + "0"
    if ax < 1e-6 or ax >= 1e21:
        body = mant[0] + ("." + mant[1:] if len(mant) > 1 else "")
        es = f"e-{-e}" if e < 0 else f"e+{e:02d}"
        return sign + body + es
    point = e + 1
    if point <= 0:
        return sign + "0." + "0" * (-point) + mant
    if point >= len(mant):
        return sign + mant + "0" * (point - len(mant))
    return sign + mant[:point] + "." + mant[point:]


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_format_go_float_round_trips_and_follows_rule(x: float) -> None:
    s = format_go_float(x)
    assert float(s) == x
    assert s == _go_rule(x)
    assert not s.endswith(".0")


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_format_go_float_any_bit_pattern(bits: int) -> None:
    x = struct.unpack("<d", struct.pack("<Q", bits))[0]
    if math.isfinite(x):
        assert float(format_go_float(x)) == x
        assert format_go_float(x) == _go_rule(x)


def test_quote_go_string() -> None:
    assert quote_go_string("instance_0") == '"instance_0"'
    assert quote_go_string("a<b>&c") == '"a\\u003cb\\u003e\\u0026c"'
    assert quote_go_string("\u2028\u2029") == '"\\u2028\\u2029"'
    assert quote_go_string('q"\\') == '"q\\"\\\\"'
    assert quote_go_string("\n\r\t\b\f") == '"\\n\\r\\t\\b\\f"'
    assert quote_go_string("\x00\x01\x1f\x7f") == '"\\u0000\\u0001\\u001f\x7f"'
    assert quote_go_string("é日本\U0001f600") == '"é日本\U0001f600"'
    assert quote_go_string("bad\ud800x") == '"bad\\ufffdx"'


def test_marshal_indent_shapes() -> None:
    obj = {"a": 1, "b": 2.0, "c": [], "d": {}, "e": [True, False, None, "x<"], "f": {"g": [1, 0.5]}}
    expected = (
        "{\n"
        '  "a": 1,\n'
        '  "b": 2,\n'
        '  "c": [],\n'
        '  "d": {},\n'
        '  "e": [\n'
        "    true,\n"
        "    false,\n"
        "    null,\n"
        '    "x\\u003c"\n'
        "  ],\n"
        '  "f": {\n'
        '    "g": [\n'
        "      1,\n"
        "      0.5\n"
        "    ]\n"
        "  }\n"
        "}"
    )
    assert marshal_indent(obj) == expected
    assert marshal_indent([]) == "[]"
    assert marshal_indent({}) == "{}"
    assert marshal_indent(np.int64(7)) == "7"
    assert marshal_indent(np.float64(7)) == "7"
    assert marshal_indent(True) == "true"


def test_marshal_indent_bool_is_not_int() -> None:
    assert marshal_indent({"x": True, "y": 1}) == '{\n  "x": true,\n  "y": 1\n}'


@pytest.mark.parametrize(
    ("x", "prec", "expected"),
    [
        # Go's strconv rounds the exact binary value, half to even: same as Python.
        (0.125, 2, "0.12"),
        (0.375, 2, "0.38"),
        (2.675, 2, "2.67"),  # binary value is just below 2.675
        (0.5, 0, "0"),
        (1.5, 0, "2"),
        (2.5, 0, "2"),
        (5e-05, 4, "0.0001"),
        (0.00005, 6, "0.000050"),
        (0.237877, 6, "0.237877"),
        (1.0, 4, "1.0000"),
        (-0.0, 4, "-0.0000"),
        (-1e-9, 4, "-0.0000"),
        (1e22, 2, "10000000000000000000000.00"),
        (137707.0, 2, "137707.00"),
        (math.nan, 4, "NaN"),
        (math.inf, 4, "+Inf"),
        (-math.inf, 2, "-Inf"),
    ],
)
def test_go_fixed(x: float, prec: int, expected: str) -> None:
    assert go_fixed(x, prec) == expected
