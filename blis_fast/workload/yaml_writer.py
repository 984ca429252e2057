"""yaml.v3's writer for the workload structs and for single strings (WL-12, OBS-0.3).

``marshal_spec`` follows yaml.v3's ``Marshal`` for the workload structs: struct fields in
declaration order with ``omitempty`` honoured, 4-space indentation (block sequences indented
under their key, mapping items 2 columns after ``- ``), map keys in yaml.v3's natural order
(numbers by value), floats in Go's shortest ``'g'`` form, strings plain unless they would read
back as another type (then double-quoted) or contain YAML indicators (then single-quoted),
empty collections as ``{}``/``[]``, and nil pointers without ``omitempty`` as ``null``.
``yaml_string`` is the string rule alone (also the observed trace's header, OBS-8.2).
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from blis_fast.config.yaml_scalars import OLD_BOOLS, resolve_plain
from blis_fast.gofmt import go_g, quote_escaped
from blis_fast.workload.spec import WorkloadSpec
from blis_fast.workload.spec_yaml import SCHEMA, Field

INDENT = 4

# --- scalar rendering -------------------------------------------------------------------------
_BASE60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


def _block_plain_allowed(s: str) -> tuple[bool, bool, bool]:
    """yaml.v3 emitter analysis: (block plain allowed, single quoted allowed, multiline)."""
    if s == "":
        return True, True, False
    block_ind = False
    line_breaks = special = tab = False
    leading_space = leading_break = trailing_space = trailing_break = False
    break_space = space_break = False
    prev_space = prev_break = False
    if len(s) >= 3 and (s.startswith("---") or s.startswith("...")):
        block_ind = True
    preceded_ws = True
    for i, ch in enumerate(s):
        followed_ws = i + 1 >= len(s) or s[i + 1] in " \t\r\n\x85\u2028\u2029"
        if i == 0:
            if ch in "#,[]{}&*!|>'\"%@`":
                block_ind = True
            elif ch in "?:":
                if followed_ws:
                    block_ind = True
            elif ch == "-" and followed_ws:
                block_ind = True
        else:
            if ch == ":" and followed_ws:
                block_ind = True
            elif ch == "#" and preceded_ws:
                block_ind = True
        o = ord(ch)
        printable = (
            o in (0x9, 0xA, 0xD, 0x85) or 0x20 <= o <= 0x7E or 0xA0 <= o <= 0xD7FF
            or 0xE000 <= o <= 0xFFFD and o != 0xFEFF or 0x10000 <= o <= 0x10FFFF
        )
        if ch == "\t":
            tab = True
        elif not printable:
            special = True
        if ch == " ":
            if i == 0:
                leading_space = True
            if i == len(s) - 1:
                trailing_space = True
            if prev_break:
                break_space = True
            prev_space, prev_break = True, False
        elif ch in "\r\n\x85\u2028\u2029":
            line_breaks = True
            if i == 0:
                leading_break = True
            if i == len(s) - 1:
                trailing_break = True
            if prev_space:
                space_break = True
            prev_space, prev_break = False, True
        else:
            prev_space = prev_break = False
        preceded_ws = ch in " \t\r\n\x85\u2028\u2029"
    plain = True
    single = True
    if leading_space or leading_break or trailing_space or trailing_break:
        plain = False
    if break_space:
        plain = single = False
    if space_break or tab or special:
        plain = single = False
    if line_breaks or block_ind:
        plain = False
    return plain, single, line_breaks


_YAML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _yaml_other(ch: str) -> str:
    """A rune of a double-quoted scalar without a named escape: ``\\xHH`` below space and
    for DEL, else itself."""
    o = ord(ch)
    return f"\\x{o:02X}" if o < 0x20 or o == 0x7F else ch


def _double_quoted(s: str) -> str:
    return quote_escaped(s, _YAML_ESCAPES, _yaml_other)


def yaml_string(s: str) -> str:
    """A Go string as yaml.v3 writes it (plain, single- or double-quoted)."""
    rtag, _ = resolve_plain(s) if s else ("!!null", None)
    can_plain = rtag == "!!str" and not (
        (s[:1] in "+-0123456789" and ":" in s and _BASE60.fullmatch(s)) or s in OLD_BOOLS
    )
    plain_ok, single_ok, multiline = _block_plain_allowed(s)
    if "\n" in s or not can_plain:
        return _double_quoted(s)
    if plain_ok:
        return s
    if single_ok and not multiline:
        return "'" + s.replace("'", "''") + "'"
    return _double_quoted(s)


def yaml_float(v: float) -> str:
    """A float64 as yaml.v3 writes it (``strconv.FormatFloat(v, 'g', -1, 64)``)."""
    if math.isnan(v):
        return ".nan"
    if math.isinf(v):
        return ".inf" if v > 0 else "-.inf"
    return go_g(v)


# --- map key order (yaml.v3 sorter.go for string keys) ------------------------------------------
def _key_less(a: str, b: str) -> bool:
    digits = False
    n = min(len(a), len(b))
    for i in range(n):
        ca, cb = a[i], b[i]
        if ca == cb:
            digits = ca.isdigit()
            continue
        al, bl = ca.isalpha(), cb.isalpha()
        if al and bl:
            return ca < cb
        if al or bl:
            return al if digits else bl
        an = bn = 0
        if ca == "0" or cb == "0":
            j = i - 1
            while j >= 0 and a[j].isdigit():
                if a[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai = i
        while ai < len(a) and a[ai].isdigit():
            an = an * 10 + int(a[ai])
            ai += 1
        bi = i
        while bi < len(b) and b[bi].isdigit():
            bn = bn * 10 + int(b[bi])
            bi += 1
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return ca < cb
    return len(a) < len(b)


def _sorted_keys(keys) -> list[str]:
    return sorted(keys, key=functools.cmp_to_key(
        lambda x, y: -1 if _key_less(x, y) else (1 if _key_less(y, x) else 0)))


# --- marshal ------------------------------------------------------------------------------------
def _is_zero(kind: str, v: Any) -> bool:
    """yaml.v3 isZero for the field kinds of the workload schema."""
    if kind in ("opt_int", "opt_float", "opt_bool", "opt_struct"):
        return v is None
    if kind in ("list", "params"):
        return not v
    if kind == "str":
        return v == ""
    if kind in ("int", "float"):
        return v == 0
    if kind == "bool":
        return not v
    if kind == "struct":
        name = type(v).__name__
        return all(_is_zero(f.kind, getattr(v, f.attr)) for f in SCHEMA[name][2])
    return False


def _scalar(kind: str, v: Any) -> str:
    if v is None:
        return "null"
    if kind in ("str",):
        return yaml_string(v)
    if kind in ("int", "opt_int"):
        return str(int(v))
    if kind in ("float", "opt_float"):
        return yaml_float(float(v))
    if kind in ("bool", "opt_bool"):
        return "true" if v else "false"
    raise AssertionError(kind)


def _child_indent(indent: int) -> int:
    """Indentation of a block collection nested under a mapping key at ``indent``."""
    return INDENT * ((indent + INDENT) // INDENT)


def _emit_pairs(pairs: list[tuple[str, Field, Any]], indent: int, lines: list[str],
                first_prefix: str | None) -> None:
    """Write ``key: value`` pairs of one block mapping whose keys sit at column ``indent``."""
    for idx, (key, f, v) in enumerate(pairs):
        lead = first_prefix if (idx == 0 and first_prefix is not None) else " " * indent
        k = yaml_string(key)
        if f.kind in ("struct", "opt_struct") and v is not None:
            sub = _struct_pairs(v, f.arg)
            if not sub:
                lines.append(f"{lead}{k}: {{}}")
            else:
                lines.append(f"{lead}{k}:")
                _emit_pairs(sub, _child_indent(indent), lines, None)
        elif f.kind == "params":
            if not v:
                lines.append(f"{lead}{k}: {{}}")
            else:
                lines.append(f"{lead}{k}:")
                ci = _child_indent(indent)
                for pk in _sorted_keys(v.keys()):
                    lines.append(f"{' ' * ci}{yaml_string(pk)}: {yaml_float(float(v[pk]))}")
        elif f.kind == "list":
            if not v:
                lines.append(f"{lead}{k}: []")
            else:
                lines.append(f"{lead}{k}:")
                si = _child_indent(indent)
                for item in v:
                    sub = _struct_pairs(item, f.arg)
                    if not sub:
                        lines.append(f"{' ' * si}- {{}}")
                    else:
                        _emit_pairs(sub, si + 2, lines, " " * si + "- ")
        else:
            lines.append(f"{lead}{k}: {_scalar(f.kind, v)}")


def _struct_pairs(obj: Any, name: str) -> list[tuple[str, Field, Any]]:
    out = []
    for f in SCHEMA[name][2]:
        v = getattr(obj, f.attr)
        if f.omitempty and _is_zero(f.kind, v):
            continue
        out.append((f.key, f, v))
    return out


def marshal_spec(spec: WorkloadSpec) -> str:
    """The YAML text yaml.v3's ``Marshal`` produces for a WorkloadSpec."""
    lines: list[str] = []
    pairs = _struct_pairs(spec, "WorkloadSpec")
    if not pairs:
        return "{}\n"
    _emit_pairs(pairs, 0, lines, None)
    return "\n".join(lines) + "\n"
