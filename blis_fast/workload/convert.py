"""``blis convert`` and ``blis compose`` (WL-12, DELTA-58): specs built from presets, ServeGen
data, inference-perf specs or several spec files, written as YAML the way the reference's
yaml.v3 ``Marshal`` writes them.

The writer follows yaml.v3's choices for the workload structs: struct fields in declaration
order with ``omitempty`` honoured, 4-space indentation (block sequences indented under their
key, mapping items 2 columns after ``- ``), map keys in yaml.v3's natural order (numbers by
value), floats in Go's shortest ``'g'`` form, strings plain unless they would read back as
another type (then double-quoted) or contain YAML indicators (then single-quoted), empty
collections as ``{}``/``[]``, and nil pointers without ``omitempty`` as ``null``.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Mapping
from typing import Any

from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.workload.expand import expand_inference_perf, load_servegen_clients
from blis_fast.workload.gofmt import go_g, go_pct_f, go_quote
from blis_fast.workload.spec import (
    ArrivalSpec,
    ClientSpec,
    DistSpec,
    ServeGenDataSpec,
    WorkloadSpec,
    validate_spec,
)
from blis_fast.workload.spec_yaml import SCHEMA, Field, load_workload_spec, resolve_plain

INDENT = 4

# --- scalar rendering -------------------------------------------------------------------------
_OLD_BOOLS = frozenset(
    "y Y yes Yes YES on On ON n N no No NO off Off OFF".split()
)  # fmt: skip
_BASE60 = __import__("re").compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


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
        )  # fmt: skip
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


def _double_quoted(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def yaml_string(s: str) -> str:
    """A Go string as yaml.v3 writes it (plain, single- or double-quoted)."""
    rtag, _ = resolve_plain(s) if s else ("!!null", None)
    can_plain = rtag == "!!str" and not (
        (s[:1] in "+-0123456789" and ":" in s and _BASE60.fullmatch(s)) or s in _OLD_BOOLS
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
        lambda x, y: -1 if _key_less(x, y) else (1 if _key_less(y, x) else 0)))  # fmt: skip


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
                first_prefix: str | None) -> None:  # fmt: skip
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


# --- conversions (sim/workload/convert.go) ------------------------------------------------------
def _preset_value(preset: Mapping[str, Any] | Any, key: str) -> int:
    if isinstance(preset, Mapping):
        return int(preset.get(key, 0) or 0)
    return int(getattr(preset, key, 0) or 0)


def convert_preset(name: str, rate: float, num_requests: int, preset: Any) -> WorkloadSpec:
    """``ConvertPreset``: client ``preset-<name>``, constant arrivals, gaussian lengths."""
    if math.isnan(rate) or math.isinf(rate) or rate <= 0:
        raise BlisInputError(f"rate must be a finite positive number, got {go_pct_f(rate)}")
    if num_requests <= 0:
        raise BlisInputError(f"num_requests must be positive, got {num_requests}")

    def gauss(prefix: str) -> DistSpec:
        return DistSpec("gaussian", {
            "mean": float(_preset_value(preset, f"{prefix}_tokens")),
            "std_dev": float(_preset_value(preset, f"{prefix}_tokens_stdev")),
            "min": float(_preset_value(preset, f"{prefix}_tokens_min")),
            "max": float(_preset_value(preset, f"{prefix}_tokens_max")),
        })  # fmt: skip

    prefix_tokens = _preset_value(preset, "prefix_tokens")
    client = ClientSpec(id=f"preset-{name}", rate_fraction=1.0, arrival=ArrivalSpec("constant"),
                        input_dist=gauss("prompt"), output_dist=gauss("output"),
                        prefix_length=prefix_tokens)  # fmt: skip
    if prefix_tokens > 0:
        client.prefix_group = "shared"
    return WorkloadSpec(version="2", category="language", aggregate_rate=float(rate),
                        num_requests=int(num_requests), clients=[client])  # fmt: skip


def convert_servegen(path: str) -> WorkloadSpec:
    """``ConvertServeGen``: clients from a ServeGen directory, ``aggregate_rate: 1`` placeholder."""
    if path == "":
        raise BlisInputError("ServeGen path must not be empty")
    try:
        clients = load_servegen_clients(ServeGenDataSpec(path=path))
    except ValueError as exc:
        raise BlisInputError(f"loading ServeGen data from {path}: {exc}") from None
    return WorkloadSpec(version="2", aggregate_rate=1.0, clients=clients)


def convert_inference_perf(path: str) -> WorkloadSpec:
    """``ConvertInferencePerf``: load a spec with ``inference_perf`` and expand it (version 2)."""
    if path == "":
        raise BlisInputError("inference-perf spec path must not be empty")
    try:
        spec = load_workload_spec(path)
    except BlisInputError as exc:
        raise BlisInputError(f"loading inference-perf spec from {path}: {exc}") from None
    if spec.inference_perf is None:
        raise BlisInputError(f"file {path} does not contain an inference_perf section")
    try:
        out = expand_inference_perf(spec.inference_perf, spec.seed)
    except ValueError as exc:
        raise BlisInputError(f"expanding inference-perf spec: {exc}") from None
    out.version = "2"
    return out


def compose_specs(specs: list[WorkloadSpec]) -> WorkloadSpec:
    """``ComposeSpecs`` (WL-12, DELTA-58): clients concatenated, fractions re-weighted by rate."""
    if not specs:
        raise BlisInputError("at least one spec file required")
    merged = WorkloadSpec(version="2", category=specs[0].category)
    total = 0.0
    for s in specs:
        total += s.aggregate_rate
    if math.isnan(total) or math.isinf(total):
        raise BlisInputError(f"compose: total aggregate rate is not finite: {go_pct_f(total)}")
    merged.aggregate_rate = total
    if total == 0:
        for s in specs:
            merged.clients.extend(copy.deepcopy(s.clients))
        return merged
    if total < 0:
        raise BlisInputError(
            f"compose: total aggregate rate must be non-negative, got {go_pct_f(total)}"
        )
    for s in specs:
        weight = s.aggregate_rate / total
        for c in s.clients:
            c2 = copy.deepcopy(c)
            c2.rate_fraction *= weight
            merged.clients.append(c2)
    return merged


def spec_yaml_for_stdout(spec: WorkloadSpec) -> str:
    """``writeSpecToStdout``: validate, then marshal (``generated spec is invalid: ...``)."""
    probe = copy.copy(spec)
    probe.source = ""
    try:
        validate_spec(probe)
    except BlisInputError as exc:
        raise BlisInputError(f"generated spec is invalid: {exc}") from None
    return marshal_spec(spec)


def check_preset_flags(rate: float, num_requests: int) -> None:
    """``blis convert preset`` flag checks (before the preset is looked up)."""
    if not (rate > 0) or math.isinf(rate):
        raise BlisConfigError(f"--rate must be a finite value > 0, got {go_g(rate)}")
    if num_requests <= 0:
        raise BlisConfigError(f"--num-requests must be > 0, got {num_requests}")


def unknown_preset(name: str) -> BlisConfigError:
    """The reference's error for a preset missing from defaults.yaml."""
    return BlisConfigError(
        f"Unknown preset {go_quote(name)}. Check defaults.yaml for available workloads."
    )
