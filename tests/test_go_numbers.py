"""``blis_fast.gonum`` reads numbers exactly as Go's ``strconv`` does.

Two independent checks:

* a golden table of Go's own answers, taken from the Go standard library's tests
  (``src/strconv/atof_test.go``: ``atoftests``; ``src/strconv/atoi_test.go``:
  ``parseInt64Tests``, ``parseInt64BaseTests``, ``parseUint64BaseTests``) plus cases worked
  out from ``atof.go``/``atoi.go`` (marked "derived");
* property tests: generated numeric strings checked against a small twin written from the Go
  grammar (the spec's floating-point and integer literal productions, as ``ParseFloat`` /
  ``ParseInt`` document them) with regular expressions and exact rational arithmetic
  (``naive.parse_float``, ``naive.parse_int``). The twin shares no code with the parser under
  test (it never calls ``float(str)`` or ``float.fromhex``).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from naive import parse_float as twin_parse_float
from naive import parse_int as twin_parse_int

from blis_fast.gonum import (
    ERR_RANGE,
    ERR_SYNTAX,
    NumError,
    atoi,
    parse_bool,
    parse_float,
    parse_int,
)

INF = math.inf
NAN = math.nan
S, R = ERR_SYNTAX, ERR_RANGE


# ------------------------------------------------------------------------------ helpers
def go_answer(parse, *args) -> float | int | str:
    try:
        return parse(*args)
    except NumError as exc:
        return exc.err


def same(got: float | int | str, want: float | int | str) -> bool:
    if isinstance(want, str) or isinstance(got, str):
        return got == want
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return got == want and math.copysign(1, got) == math.copysign(1, want)


# ------------------------------------------------------------------------------ golden table
FLOAT_TABLE = [
    # atof_test.go atoftests
    ("", S), ("1", 1.0), ("+1", 1.0), ("1x", S), ("1.1.", S), ("1e23", 1e23), ("-0", -0.0),
    ("100000000000000016777216", 1.0000000000000003e23), ("625e-3", 0.625),
    ("0x1p0", 1.0), ("0x1ep-1", 15.0), ("-0x1_ep-1", -15.0), ("0x1fFe2.P0", 131042.0),
    ("0x0.fp4", 15.0), ("0x1e2", S), ("1p2", S),
    ("0e+01234567890123456789", 0.0), ("-0x0.00p-01234567890123456789", -0.0),
    ("nan", NAN), ("NAN", NAN), ("inf", INF), ("+INF", INF), ("-Infinity", -INF),
    ("1.7976931348623157e308", 1.7976931348623157e308), ("1.7976931348623159e308", R),
    ("1.7976931348623158e308", 1.7976931348623157e308), ("1.797693134862315808e308", R),
    ("0x1.fffffffffffff7fffp1023", 1.7976931348623157e308), ("0x1.fffffffffffff8p1023", R),
    ("0x1fffffffffffff.8p+971", R), ("1e308", 1e308), ("2e308", R), ("1e400", R),
    ("-1e400", R), ("0x1p1024", R), ("0x1p2000000000", R), ("4e-324", 5e-324),
    ("2e-324", 0.0), ("1e-350", 0.0), ("1e-400000", 0.0),
    ("0x0.00000003456788p-1022", 1.694649e-317), ("0x0.00000000000008p-1022", 0.0),
    ("0x0.000000000000081p-1022", 5e-324), ("1e+18446744073709551616", R),
    ("0x1p-18446744073709551616", 0.0), ("1e", S), ("1e-", S), (".e-1", S), ("1\x00.2", S),
    ("0x", S), ("0x.", S), ("0x1", S), ("0x.1", S), ("0x1p", S), ("0x1p+", S),
    ("0x.1p-2", 0.015625), ("2.2250738585072011e-308", 2.225073858507201e-308),
    ("2." + "2" * 4000 + "e+1", 22.22222222222222),
    ("1.00000000000000011102230246251565404236316680908203125", 1.0),
    ("1.00000000000000011102230246251565404236316680908203125" + "0" * 10000 + "1",
     1.0000000000000002),
    ("0x1.00000000000008" + "0" * 10000 + "1p0", 1.0000000000000002),
    ("1_23.50_0_0e+1_2", 1.235e14), ("-_123.5e+12", S), ("123_.5e+12", S),
    ("123._5e+12", S), ("123.5e_+12", S), ("123.5e+1__2", S), ("123.5e+12_", S),
    ("0x_1_2.3_4_5p+1_2", 74565.0), ("_0x12.345p+12", S), ("0x__12.345p+12", S),
    ("0x12.345_p+12", S),
    # derived from atof.go (special, readFloat, underscoreOK)
    ("0x1p4", 16.0), ("0x1.8p1", 3.0), ("0x1p-1074", 5e-324), ("0x_1p0", 1.0),
    ("1_000", 1000.0), ("infinity", INF), ("+Inf", INF), ("iNfInItY", INF), ("infin", S),
    ("infinityx", S), ("+nan", S), ("-NaN", S), (" 5", S), ("5 ", S), ("+-5", S),
    ("\u0665", S), ("\uff15", S), ("1e-400", 0.0), ("-1e-400", -0.0), ("1e400x", S),
    ("\u0130nf", S), ("na\u0143", S),
]

INT_TABLE = [
    # atoi_test.go parseInt64BaseTests (base 0)
    ("", S), ("0", 0), ("-0", 0), ("012345", 0o12345), ("-012345", -0o12345),
    ("0x12345", 0x12345), ("-0X12345", -0x12345), ("12345x", S), ("-12345x", S),
    ("9223372036854775807", (1 << 63) - 1), ("9223372036854775808", R),
    ("-9223372036854775808", -(1 << 63)), ("-9223372036854775809", R),
    # parseUint64BaseTests rows that ParseInt shares
    ("0x", S), ("0X", S), ("0xabcdefg123", S), ("123456789abc", S),
    ("01777777777777777777778", S), ("02000000000000000000000", R),
    ("0x10000000000000000", R),
    # derived from atoi.go (base prefixes, underscoreOK, overflow before a bad character)
    ("0x10", 16), ("0o17", 15), ("0b101", 5), ("017", 15), ("08", S), ("0_7", 7),
    ("0x_1f", 31), ("1_000", 1000), ("1__0", S), ("_1", S), ("1_", S), ("0b", S),
    (" 5", S), ("5 ", S), ("+-5", S), ("\u0665", S), ("1e3", S), ("1.0", S),
    ("99999999999999999999x", R), ("18446744073709551615", R),
]

ATOI_TABLE = [
    # atoi_test.go parseInt64Tests (TestAtoi runs them through Atoi on 64-bit)
    ("", S), ("0", 0), ("-0", 0), ("1", 1), ("-12345", -12345), ("012345", 12345),
    ("98765432100", 98765432100), ("9223372036854775807", (1 << 63) - 1),
    ("9223372036854775808", R), ("-9223372036854775808", -(1 << 63)),
    ("-9223372036854775809", R),
    # derived: base 10 only, no underscores
    ("0x10", S), ("1_000", S), ("+", S), ("+-5", S), (" 5", S), ("\u0665", S),
]


@pytest.mark.parametrize(("text", "want"), FLOAT_TABLE, ids=lambda v: repr(v)[:40])
def test_parse_float_table(text: str, want: float | str) -> None:
    got = go_answer(parse_float, text)
    assert same(got, want), (text[:60], got, want)
    assert same(twin_parse_float(text), want), "the twin disagrees with Go's table"


@pytest.mark.parametrize(("text", "want"), INT_TABLE, ids=lambda v: repr(v)[:40])
def test_parse_int_base0_table(text: str, want: int | str) -> None:
    assert go_answer(parse_int, text, 0, 64) == want
    assert twin_parse_int(text, 0) == want, "the twin disagrees with Go's table"


@pytest.mark.parametrize(("text", "want"), ATOI_TABLE, ids=lambda v: repr(v)[:40])
def test_atoi_table(text: str, want: int | str) -> None:
    assert go_answer(atoi, text) == want
    assert go_answer(parse_int, text, 10, 64) == want
    assert twin_parse_int(text, 10) == want


def test_other_bases_and_bit_sizes() -> None:
    """atoi_test.go: parseInt64BaseTests (bases 2..36) and parseInt32Tests (32-bit range)."""
    assert parse_int("holycow", 36, 64) == (((((17 * 36 + 24) * 36 + 21) * 36 + 34) * 36 + 12)
                                            * 36 + 24) * 36 + 32
    assert parse_int("-1000000000000000000000000000000000000000000000000000000000000000", 2,
                     64) == -(1 << 63)
    assert go_answer(parse_int, "1000000000000000000000000000000000000000000000000000000000000000",
                     2, 64) == R
    assert parse_int("-123456789abcdef", 16, 64) == -0x123456789ABCDEF
    assert parse_int("-2147483648", 10, 32) == -(1 << 31)
    assert go_answer(parse_int, "2147483648", 10, 32) == R
    assert go_answer(parse_int, "0", 1, 64) == "invalid base 1"
    assert go_answer(parse_int, "0", 0, 65) == "invalid bit size 65"


def test_errors_read_as_go_prints_them() -> None:
    """NumError.Error(): strconv.<Func>: parsing <Quote(s)>: <err>."""
    with pytest.raises(NumError) as exc:
        parse_float("1e400")
    assert str(exc.value) == 'strconv.ParseFloat: parsing "1e400": value out of range'
    assert exc.value.is_range
    with pytest.raises(NumError) as exc:
        parse_int("1\t", 0, 64)
    assert str(exc.value) == 'strconv.ParseInt: parsing "1\\t": invalid syntax'
    assert not exc.value.is_range
    with pytest.raises(ValueError, match=r'^strconv\.Atoi: parsing "x": invalid syntax$'):
        atoi("x")
    assert parse_bool("T") is True and parse_bool("False") is False
    with pytest.raises(NumError, match="ParseBool"):
        parse_bool("yes")


# ------------------------------------------------------------------------------ properties
_TRICKY = [" ", "\t", "\u00a0", "\u0665", "\uff15", "_", ".", "e", "E", "p", "x", "+", "-",
           "\u0130", "\u0131", "\u212a", "\x00", "a", "g"]


def _underscored(draw, digits: str) -> str:
    """Insert underscores at drawn positions (sometimes doubled, leading or trailing)."""
    if draw(st.integers(0, 2)) > 0:
        return digits
    out = []
    for ch in digits:
        if draw(st.integers(0, 7)) == 0:
            out.append("__" if draw(st.integers(0, 3)) == 0 else "_")
        out.append(ch)
    if draw(st.integers(0, 14)) == 0:
        out.append("_")
    return "".join(out)


@st.composite
def float_strings(draw) -> str:
    """Decimal, hex and special spellings with signs, underscores, exponents and noise."""
    sign = draw(st.sampled_from(["", "", "", "+", "-", "-", "+-"]))
    kind = draw(st.sampled_from(["dec", "dec", "hex", "special", "junk"]))
    if kind == "special":
        word = draw(st.sampled_from(["inf", "infinity", "nan", "infin", "in", "nana"]))
        body = "".join(c.upper() if draw(st.booleans()) else c for c in word)
    elif kind == "junk":
        body = draw(st.text(alphabet="0123456789abcdefxXpPeE_.+-inINFaty \u0665", max_size=12))
    else:
        digit_set = "0123456789" if kind == "dec" else "0123456789abcdefABCDEF"
        ints = draw(st.text(alphabet=digit_set, min_size=min(1, draw(st.integers(0, 4))),
                            max_size=25))
        frac = draw(st.text(alphabet=digit_set, max_size=25))
        mant = _underscored(draw, ints)
        if draw(st.booleans()):
            mant += "." + _underscored(draw, frac)
        if kind == "hex":
            mant = draw(st.sampled_from(["0x", "0X", "0x_", "0x__"])) + mant
        exp = ""
        if draw(st.integers(0, 3)) > 0:
            marker = draw(st.sampled_from(["e", "E"] if kind == "dec" else ["p", "P", "p", "e"]))
            digits = draw(st.one_of(st.integers(0, 400).map(str),
                                    st.integers(0, 10**25).map(str),
                                    st.text(alphabet="0123456789", min_size=1, max_size=6)))
            exp = marker + draw(st.sampled_from(["", "+", "-"])) + _underscored(draw, digits)
        body = mant + exp
    text = sign + body
    if draw(st.integers(0, 5)) == 0:  # one tricky character somewhere
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(_TRICKY)) + text[at:]
    return text


@st.composite
def int_strings(draw) -> str:
    """Base-prefixed and plain integers, underscores, signs, huge values and noise."""
    sign = draw(st.sampled_from(["", "", "", "+", "-", "-", "+-"]))
    prefix, alphabet = draw(st.sampled_from([
        ("", "0123456789"), ("", "0123456789"), ("0", "01234567"), ("0", "0123456789"),
        ("0x", "0123456789abcdefABCDEF"), ("0X", "0123456789abcdef"), ("0o", "01234567"),
        ("0O", "012345678"), ("0b", "01"), ("0B", "012"), ("0x", "0123456789abcdefg")]))
    digits = draw(st.text(alphabet=alphabet, max_size=70))
    text = sign + prefix + _underscored(draw, digits)
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(_TRICKY)) + text[at:]
    return text


@settings(max_examples=2500, deadline=None)
@given(float_strings())
@example("0x1p-1074")
@example("1_000")
@example("0x_1p0")
@example("1e-400")
@example(".5e1_0")
def test_parse_float_matches_the_grammar_twin(text: str) -> None:
    got, want = go_answer(parse_float, text), twin_parse_float(text)
    assert same(got, want), (text, got, want)


@settings(max_examples=2000, deadline=None)
@given(int_strings())
@example("9223372036854775808")
@example("0x_10")
@example("00")
def test_parse_int_base0_matches_the_grammar_twin(text: str) -> None:
    assert go_answer(parse_int, text, 0, 64) == twin_parse_int(text, 0), text


@settings(max_examples=1500, deadline=None)
@given(int_strings())
def test_atoi_matches_the_grammar_twin(text: str) -> None:
    want = twin_parse_int(text, 10)
    assert go_answer(atoi, text) == want, text
    assert go_answer(parse_int, text, 10, 64) == want, text


@settings(max_examples=1000, deadline=None)
@given(st.floats(allow_nan=False))
def test_every_float_reads_back_from_its_go_and_python_spellings(x: float) -> None:
    """repr and float.hex spellings (Go accepts both grammars) parse to the same float."""
    assert same(parse_float(repr(x)), x)
    if math.isfinite(x):
        assert same(parse_float(x.hex()), x)


# ------------------------------------------------------------------------------ YAML fields
def test_strict_yaml_numbers_resolve_as_yaml_v3_does() -> None:
    """defaults.yaml, policy configs and trace headers decode int/float fields with yaml.v3's
    resolver (resolve.go: ParseInt(s, 0, 64) on the text without '_', then ParseFloat for
    YAML-style floats) and its decoder (a float in an int field is truncated). PyYAML's YAML
    1.1 resolver, used before, read 1e3 and 0o17 as strings and 1:30 as 90."""
    from blis_fast.config.strict_yaml import as_float, as_int, decode_struct, parse_root
    from blis_fast.errors import BlisInputError

    good = "a: 1e3\nb: 0o17\nc: 1_000\nd: .5\ne: 1.9\nf: 0x10\ng: -.inf\nh: !!int '7'\n"
    fields = {"a": as_int, "b": as_int, "c": as_int, "d": as_float, "e": as_int, "f": as_float,
              "g": as_float, "h": as_int}
    with parse_root(good, "t.yaml", "test file") as (ctx, root):
        assert decode_struct(ctx, root, "t", fields) == {
            "a": 1000, "b": 15, "c": 1000, "d": 0.5, "e": 1, "f": 16.0, "g": -INF, "h": 7}
    for text in ("1:30", "'5'", "0x1p4", "1e400", "five", ".nan"):
        with parse_root(f"a: {text}\n", "t.yaml", "test file") as (ctx, root):
            with pytest.raises(BlisInputError, match=r"t\.yaml:1: t\.a: expected an integer"):
                decode_struct(ctx, root, "t", {"a": as_int})
