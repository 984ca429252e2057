"""Strict loading of ``--workload-spec`` YAML files into :class:`WorkloadSpec` (WL-4.1, WL-4.2).

The reference decodes the file with Go's yaml.v3 in strict mode (``KnownFields(true)``). This
loader reproduces that decoder's behaviour on top of PyYAML's node composer:

* scalars are resolved with YAML 1.2 core rules as yaml.v3 does (``1e3`` is a float,
  ``0x10``/``0o17``/``017`` are ints, ``yes``/``on`` are strings except for bool fields,
  ``~``/``null``/empty are null and leave a field at its zero value);
* any scalar decodes into a string field (its text), ints and floats into float fields,
  integral and fractional floats into int fields (truncated toward zero), and a quoted
  scalar only into string fields;
* an unknown key, a type mismatch or a duplicate key is an error naming the file, the
  line, the Go message and the key's path (``clients[0].rate_fraction``);
* merge keys (``<<``), anchors and aliases work; only the first document is read.

After decoding, the v1 -> v2 upgrade runs (WL-4.2). Validation is not run here (the reference
validates during generation): see :func:`blis_fast.workload.spec.validate_spec`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import yaml

from blis_fast.config.yaml_scalars import (
    BOOL,
    FLOAT,
    INT,
    MERGE,
    NULL,
    OLD_BOOLS,
    STR,
    resolve_plain,
)
from blis_fast.errors import BlisInputError
from blis_fast.files import YamlLimitError, check_yaml_limits, read_input_text
from blis_fast.gofmt import go_quote
from blis_fast.kernels.go.gomath import go_f2i
from blis_fast.workload import spec as S


# --- schema (derived from the dataclasses of ``spec``) -------------------------------------------
@dataclass(frozen=True)
class Field:
    """One Go struct field as yaml.v3 sees it.

    ``kind`` is one of str, int (``arg``: Go type int/int64), float, bool, opt_int, opt_float,
    opt_bool (pointers; ``arg``: int64/float64/bool), struct, opt_struct, list (``arg``: the
    struct name), params (map[string]float64).
    """

    key: str
    attr: str
    kind: str
    arg: str = ""
    omitempty: bool = False


_SCALARS = {"str": "str", "int": "int", "float": "float", "bool": "bool"}
_POINTER_GO = {"int": "int64", "float": "float64", "bool": "bool"}


def _field_of(f: dataclasses.Field) -> Field:
    """The yaml.v3 view of one dataclass field (its annotation and ``spec.tag`` metadata)."""
    ann = str(f.type).replace(" ", "")
    md = f.metadata
    key = md.get("key") or f.name
    omit = bool(md.get("omitempty", False))
    if ann in _SCALARS:
        return Field(key, f.name, ann, md.get("go_int", "int64") if ann == "int" else "", omit)
    if ann == "dict[str,float]":
        return Field(key, f.name, "params", "", omit)
    if ann.startswith("list[") and ann.endswith("]"):
        return Field(key, f.name, "list", ann[5:-1], omit)
    base = ann.removesuffix("|None")
    if base != ann:
        if base in _SCALARS:
            return Field(key, f.name, "opt_" + base, _POINTER_GO[base], omit)
        return Field(key, f.name, "opt_struct", base, omit)
    return Field(key, f.name, "struct", ann, omit)


def _derive_schema(root: type) -> dict[str, tuple[str, type, tuple[Field, ...]]]:
    """Every struct reachable from ``root``: (Go type name, dataclass, YAML fields)."""
    schema: dict[str, tuple[str, type, tuple[Field, ...]]] = {}
    todo = [root]
    while todo:
        cls = todo.pop()
        if cls.__name__ in schema:
            continue
        fields = tuple(_field_of(f) for f in dataclasses.fields(cls)
                       if f.metadata.get("yaml", True))
        schema[cls.__name__] = ("workload." + cls.__name__, cls, fields)
        todo += [getattr(S, f.arg) for f in fields if f.kind in ("struct", "opt_struct", "list")]
    return schema


SCHEMA = _derive_schema(S.WorkloadSpec)
"""The reference's workload structs: name -> (Go type name, dataclass, fields in declaration
order), derived from ``spec``'s dataclasses (also drives YAML output)."""

# --- tags (scalar resolution is config/yaml_scalars.py) -----------------------------------
_LONG = "tag:yaml.org,2002:"
_PLAIN = "?plain"  # our marker for an untagged plain scalar


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_LONG):] if tag.startswith(_LONG) else tag


class _Loader(yaml.SafeLoader):
    """PyYAML composer whose resolver only marks plain scalars (we resolve them ourselves)."""

    def resolve(self, kind, value, implicit):  # noqa: D102 - PyYAML hook
        if kind is yaml.ScalarNode:
            return _PLAIN if implicit[0] else _LONG + "str"
        if kind is yaml.SequenceNode:
            return _LONG + "seq"
        return _LONG + "map"


# --- decoding ---------------------------------------------------------------------------------
class _DecodeError(Exception):
    """First decode error: Go message, line, key path."""

    def __init__(self, line: int, msg: str, path: str) -> None:
        super().__init__(msg)
        self.line = line
        self.msg = msg
        self.path = path


def _line(node) -> int:
    return node.start_mark.line + 1


def _scalar_info(node) -> tuple[str, Any]:
    """(short tag, resolved value) of a scalar node as yaml.v3's decoder sees it."""
    tag = node.tag
    if tag == _PLAIN:
        return resolve_plain(node.value)
    st = _short_tag(tag)
    if st == STR:
        return STR, node.value
    if st in (INT, FLOAT, BOOL, NULL):
        rtag, val = resolve_plain(node.value) if node.value else (NULL, None)
        if st == FLOAT and rtag == INT:
            return FLOAT, float(val)
        if rtag != st:
            raise _DecodeError(_line(node), f"cannot decode {rtag} `{node.value}` as a {st}", "")
        return rtag, val
    return st, node.value


def _node_tag(node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return _scalar_info(node)[0]
    return "!!seq" if isinstance(node, yaml.SequenceNode) else "!!map"


def _terror(node, go_type: str, path: str) -> _DecodeError:
    """yaml.v3's ``cannot unmarshal`` error (value shortened to 7 chars past 10)."""
    tag = _node_tag(node)
    value = ""
    if tag not in ("!!seq", "!!map"):
        v = node.value
        value = " `" + (v[:7] + "...`" if len(v) > 10 else v + "`")
    return _DecodeError(_line(node), f"cannot unmarshal {tag}{value} into {go_type}", path)


_MISSING = object()


def _decode_scalar_kind(node, kind: str, go_type: str, path: str) -> Any:
    """Decode ``node`` into a Go string/int/float/bool; ``_MISSING`` for null (zero value)."""
    if not isinstance(node, yaml.ScalarNode):
        raise _terror(node, go_type, path)
    tag, val = _scalar_info(node)
    if tag == NULL:
        return _MISSING
    if kind == "str":
        return node.value
    if kind == "int":
        if tag == INT and -(1 << 63) <= val < (1 << 63):
            return int(val)
        if tag == FLOAT and val <= 9.223372036854775807e18:
            return int(go_f2i(val))
        raise _terror(node, go_type, path)
    if kind == "float":
        if tag in (INT, FLOAT):
            return float(val)
        raise _terror(node, go_type, path)
    if kind == "bool":
        if tag == BOOL:
            return bool(val)
        if tag == STR and val in OLD_BOOLS:
            return OLD_BOOLS[val]
        raise _terror(node, go_type, path)
    raise AssertionError(kind)


def _is_merge(node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.value == "<<" and (
        node.tag == _PLAIN or _short_tag(node.tag) == MERGE
    )


def _check_duplicates(node, path: str) -> None:
    """yaml.v3 uniqueKeys: the first duplicated key (same kind and text) in this mapping."""
    keys = [k for k, _v in node.value if isinstance(k, yaml.ScalarNode)]
    later: dict[str, list[int]] = {}
    for k in keys:
        later.setdefault(k.value, []).append(_line(k))
    for idx, k in enumerate(keys):
        lines = later[k.value]
        if len(lines) > 1:
            # yaml.v3 reports pairs (i, j) in order: the first key that repeats, at its
            # next repetition.
            nxt = next(_line(k2) for k2 in keys[idx + 1 :] if k2.value == k.value)
            raise _DecodeError(
                nxt, f"mapping key {go_quote(k.value)} already defined at line {_line(k)}", path
            )


class _Decoder:
    """Walks the composed node tree, building dataclasses and recording key positions."""

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}

    def value(self, node, f: Field, path: str, current: Any) -> Any:
        """Decode one field's node; returns the new value (``current`` when null)."""
        kind = f.kind
        if kind in ("str", "int", "float", "bool"):
            go_type = {"str": "string", "float": "float64", "bool": "bool"}.get(kind, f.arg)
            v = _decode_scalar_kind(node, kind, go_type, path)
            return current if v is _MISSING else v
        if kind in ("opt_int", "opt_float", "opt_bool"):
            base = kind[4:]
            go_type = {"float": "float64", "bool": "bool"}.get(base, f.arg)
            v = _decode_scalar_kind(node, base, go_type, path)
            return None if v is _MISSING else v
        if kind == "params":
            return self.params(node, path)
        if kind in ("struct", "opt_struct"):
            if isinstance(node, yaml.ScalarNode) and _scalar_info(node)[0] == NULL:
                return None if kind == "opt_struct" else current
            obj = current if (kind == "struct" and current is not None) else None
            return self.struct(node, f.arg, path, obj)
        if kind == "list":
            go_name = SCHEMA[f.arg][0]
            if isinstance(node, yaml.ScalarNode) and _scalar_info(node)[0] == NULL:
                return []
            if not isinstance(node, yaml.SequenceNode):
                raise _terror(node, "[]" + go_name, path)
            out = []
            for j, item in enumerate(node.value):
                ipath = f"{path}[{j}]"
                self.positions[ipath] = _line(item)
                if isinstance(item, yaml.ScalarNode) and _scalar_info(item)[0] == NULL:
                    out.append(SCHEMA[f.arg][1]())
                    continue
                out.append(self.struct(item, f.arg, ipath, None))
            return out
        raise AssertionError(kind)

    def params(self, node, path: str) -> dict[str, float]:
        """map[string]float64: any scalar key becomes its text; null values become 0."""
        if isinstance(node, yaml.ScalarNode) and _scalar_info(node)[0] == NULL:
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise _terror(node, "map[string]float64", path)
        _check_duplicates(node, path)
        out: dict[str, float] = {}
        merge_node = None
        for k, v in node.value:
            if _is_merge(k):
                merge_node = v
                continue
            key = self._key_text(k, path)
            if key is None:
                continue
            kpath = f"{path}.{key}"
            self.positions[kpath] = _line(k)
            val = _decode_scalar_kind(v, "float", "float64", kpath)
            out[key] = 0.0 if val is _MISSING else val
        if merge_node is not None:
            for m in self._merge_nodes(merge_node):
                for key, val in self.params(m, path).items():
                    out.setdefault(key, val)
        return out

    def _key_text(self, k, path: str) -> str | None:
        """A mapping key decoded into a Go string (null keys are skipped silently)."""
        if not isinstance(k, yaml.ScalarNode):
            raise _terror(k, "string", path)
        if _scalar_info(k)[0] == NULL:
            return None
        return k.value

    def _merge_nodes(self, merge) -> list:
        if isinstance(merge, yaml.MappingNode):
            return [merge]
        if isinstance(merge, yaml.SequenceNode) and all(
            isinstance(m, yaml.MappingNode) for m in merge.value
        ):
            return list(merge.value)
        raise _DecodeError(
            _line(merge), "map merge requires map or sequence of maps as the value", ""
        )

    def struct(self, node, name: str, path: str, obj: Any, skip: set | None = None) -> Any:
        """Decode a mapping node into the dataclass of Go struct ``name`` (strict keys)."""
        go_name, cls, fields = SCHEMA[name]
        if not isinstance(node, yaml.MappingNode):
            raise _terror(node, go_name, path)
        _check_duplicates(node, path)
        if obj is None:
            obj = cls()
        by_key = {f.key: f for f in fields}
        merge_node = None
        seen: set[str] = set()
        for k, v in node.value:
            if _is_merge(k):
                merge_node = v
                continue
            key = self._key_text(k, path)
            if key is None:
                continue
            seen.add(key)
            if skip is not None and key in skip:
                continue
            kpath = f"{path}.{key}" if path else key
            f = by_key.get(key)
            if f is None:
                raise _DecodeError(
                    _line(k), f"field {key} not found in type {go_name}", kpath
                )
            self.positions[kpath] = _line(k)
            setattr(obj, f.attr, self.value(v, f, kpath, getattr(obj, f.attr)))
        if merge_node is not None:
            skip2 = set(seen) | (skip or set())
            for m in self._merge_nodes(merge_node):
                self.struct(m, name, path, obj, skip2)
                for mk, _mv in m.value:
                    if isinstance(mk, yaml.ScalarNode):
                        skip2.add(mk.value)
        return obj


def parse_workload_spec(text: str, source: str = "") -> S.WorkloadSpec:
    """Decode YAML ``text`` strictly into a WorkloadSpec, then upgrade v1 to v2 (WL-4.1/4.2)."""
    where = f" {source}" if source else ""
    try:
        check_yaml_limits(text)
    except YamlLimitError as exc:
        raise BlisInputError(f"parsing workload spec{where}: yaml: line "
                             f"{exc.problem_mark.line + 1}: {exc.problem}") from None
    except yaml.YAMLError:
        pass  # a syntax error: the composer below reports it
    loader = None
    try:
        loader = _Loader(text)
        if not loader.check_node():
            raise BlisInputError(f"parsing workload spec{where}: EOF")
        root = loader.get_node()
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise BlisInputError(f"parsing workload spec{where}: yaml: line {line}: control "
                             f"characters are not allowed (#x{exc.character:04x})") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        raise BlisInputError(f"parsing workload spec{where}: yaml: {line}{problem}") from None
    except yaml.YAMLError as exc:
        raise BlisInputError(f"parsing workload spec{where}: yaml: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    dec = _Decoder()
    try:
        if isinstance(root, yaml.ScalarNode) and _scalar_info(root)[0] == NULL:
            spec = S.WorkloadSpec(version="")
        else:
            spec = dec.struct(root, "WorkloadSpec", "", S.WorkloadSpec(version=""))
    except _DecodeError as err:
        at = f" (at {err.path})" if err.path else ""
        raise BlisInputError(
            f"parsing workload spec{where}: line {err.line}: {err.msg}{at}"
        ) from None
    spec.source = source
    spec.positions = dec.positions
    S.upgrade_v1_to_v2(spec)
    return spec


def load_workload_spec(path: str) -> S.WorkloadSpec:
    """Read and strictly parse a workload-spec file (the reference's LoadWorkloadSpec)."""
    try:
        text = read_input_text(path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise BlisInputError(
            f"reading workload spec: open {path}: {reason.lower()}"
        ) from None
    except UnicodeDecodeError:
        raise BlisInputError(
            f"parsing workload spec {path}: yaml: invalid UTF-8 text"
        ) from None
    return parse_workload_spec(text, source=str(path))
