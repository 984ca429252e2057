"""Strict YAML decoding: unknown keys, duplicate keys and wrong types are errors naming the
file and the 1-based line (the reference parses its YAML files with yaml.v3 KnownFields).

Decoders take a :class:`YamlContext`, a PyYAML node and a dotted description of where the
node is (used in messages); ``decode_struct`` maps a fixed key set to per-key decoders.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import yaml

from blis_fast.config.yaml_scalars import BOOL, FLOAT, INT, OLD_BOOLS, resolve_plain
from blis_fast.errors import BlisInputError
from blis_fast.files import YamlLimitError, check_yaml_limits
from blis_fast.kernels.go.gomath import go_f2i

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_NULL_TAG = "tag:yaml.org,2002:null"
_STR_TAG = "tag:yaml.org,2002:str"


class YamlContext:
    """Decoding context: the file name and a loader able to construct scalar values."""

    def __init__(self, path: str, loader: Any) -> None:  # yaml.SafeLoader or CSafeLoader
        self.path = path
        self.loader = loader

    def fail(self, node: yaml.Node, msg: str) -> BlisInputError:
        """Build the error for ``node`` (file and 1-based line)."""
        return BlisInputError(f"{self.path}:{node.start_mark.line + 1}: {msg}")


def is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG


def scalar(ctx: YamlContext, node: yaml.Node, what: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, f"{what}: expected a scalar value")
    return ctx.loader.construct_object(node, deep=True)


def as_str(ctx: YamlContext, node: yaml.Node, what: str) -> str:
    if is_null(node):
        return ""
    if not isinstance(node, yaml.ScalarNode):
        raise ctx.fail(node, f"{what}: expected a string")
    return str(node.value)


def _v3_number(ctx: YamlContext, node: yaml.Node, what: str, kind: str) -> int | float:
    """The value yaml.v3 stores for this scalar in a Go ``int``/``int64`` (``kind="int"``) or
    ``float64`` field: yaml.v3's own scalar resolution (``1e3``, ``0o17``, ``1_000``, ``.5``
    are numbers; ``1:30`` is not), and a float stored in an int field truncated toward zero."""
    expected = "an integer" if kind == "int" else "a number"
    if not isinstance(node, yaml.ScalarNode) or (
            node.style and node.tag not in (_INT_TAG, _FLOAT_TAG)):  # quoted: a string
        raise ctx.fail(node, f"{what}: expected {expected}, got {_value_text(node)}")
    tag, val = resolve_plain(node.value)
    if kind == "int":
        if tag == INT:
            if -(1 << 63) <= val < (1 << 63):
                return int(val)
            raise ctx.fail(node, f"{what}: {node.value} is outside the 64-bit integer range")
        if tag == FLOAT and -9.223372036854775808e18 <= val <= 9.223372036854775807e18:
            return int(go_f2i(val))
        if tag == FLOAT and math.isfinite(val):  # an integer too large for int64 reads as float
            raise ctx.fail(node, f"{what}: {node.value} is outside the 64-bit integer range")
    elif tag in (INT, FLOAT):
        return float(val)
    raise ctx.fail(node, f"{what}: expected {expected}, got {node.value!r}")


def _value_text(node: yaml.Node) -> str:
    return repr(node.value) if isinstance(node, yaml.ScalarNode) else "a " + node.id


def as_int(ctx: YamlContext, node: yaml.Node, what: str) -> int:
    if is_null(node):
        return 0
    return int(_v3_number(ctx, node, what, "int"))


def as_float(ctx: YamlContext, node: yaml.Node, what: str) -> float:
    if is_null(node):
        return 0.0
    return float(_v3_number(ctx, node, what, "float"))


def as_bool(ctx: YamlContext, node: yaml.Node, what: str) -> bool:
    """A Go ``bool`` field as yaml.v3 decodes it: ``true``/``false`` (three spellings each) and
    the YAML 1.1 words (``yes``/``no``/``on``/``off``/``y``/``n``) it still accepts there."""
    if is_null(node):
        return False
    if isinstance(node, yaml.ScalarNode):
        if not node.style:
            tag, val = resolve_plain(node.value)
            if tag == BOOL:
                return bool(val)
        if node.value in OLD_BOOLS and (not node.style or node.tag == "tag:yaml.org,2002:bool"):
            return OLD_BOOLS[node.value]
    raise ctx.fail(node, f"{what}: expected true or false, got {_value_text(node)}")


def as_float_list(ctx: YamlContext, node: yaml.Node, what: str) -> tuple[float, ...] | None:
    if is_null(node):
        return None
    if not isinstance(node, yaml.SequenceNode):
        raise ctx.fail(node, f"{what}: expected a list of numbers")
    return tuple(as_float(ctx, item, f"{what}[{i}]") for i, item in enumerate(node.value))


def mapping_items(ctx: YamlContext, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    """Return ``(key, key_node, value_node)`` of a mapping, rejecting duplicate keys."""
    if not isinstance(node, yaml.MappingNode):
        raise ctx.fail(node, f"{what}: expected a mapping")
    seen: dict[str, int] = {}
    out = []
    for knode, vnode in node.value:
        if not isinstance(knode, yaml.ScalarNode):
            raise ctx.fail(knode, f"{what}: keys must be scalars")
        key = str(knode.value)
        if key in seen:
            raise ctx.fail(knode, f"{what}: key {key!r} already defined at line {seen[key]}")
        seen[key] = knode.start_mark.line + 1
        out.append((key, knode, vnode))
    return out


def decode_struct(
    ctx: YamlContext, node: yaml.Node, what: str, fields: dict[str, Callable[[YamlContext, yaml.Node, str], Any]]
) -> dict[str, Any]:
    """Decode a mapping with a fixed key set; an unknown key is an error naming it."""
    if is_null(node):
        return {}
    values: dict[str, Any] = {}
    for key, knode, vnode in mapping_items(ctx, node, what):
        conv = fields.get(key)
        if conv is None:
            raise ctx.fail(
                knode, f"unknown key {key!r} in {what} (known keys: {', '.join(fields)})"
            )
        values[key] = conv(ctx, vnode, f"{what}.{key}")
    return values




def _one_line(exc: Exception, text: str = "") -> str:
    """A YAML error as one line (PyYAML's messages quote the source over several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None and isinstance(exc, yaml.reader.ReaderError):
        # control bytes: the reader knows the offset only
        line = text.count("\n", 0, exc.position) + 1
        return f"line {line}: unacceptable character #x{exc.character:04x} (control characters "\
               "are not allowed)"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def _compose_fast(text: str) -> tuple[Any, yaml.Node | None] | None:
    """(loader, first document's node) composed by libyaml, or None when it is missing or
    rejects the text (PyYAML then parses it again, so an error reads exactly as PyYAML's).

    libyaml's composer builds the same nodes (values, tags, line marks) about ten times faster
    than PyYAML's pure-Python one: 5 ms instead of 50 for the bundled defaults file.
    """
    fast_loader = getattr(yaml, "CSafeLoader", None)
    if fast_loader is None:
        return None
    loader = fast_loader(text)
    try:
        return loader, (loader.get_node() if loader.check_node() else None)
    except yaml.YAMLError:
        loader.dispose()
        return None


@contextlib.contextmanager
def parse_root(text: str, path: str, what: str) -> Iterator[tuple[YamlContext, yaml.Node]]:
    """Compose the first YAML document of ``text``; YAML syntax errors become BlisInputError."""
    try:
        check_yaml_limits(text)
    except YamlLimitError as exc:
        raise BlisInputError(f"cannot parse {what} {path}: {_one_line(exc)}") from None
    except yaml.YAMLError:
        pass  # a syntax error: the composer below reports it in PyYAML's words
    try:
        composed = _compose_fast(text)
        loader = composed[0] if composed is not None else yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise BlisInputError(f"cannot parse {what} {path}: {_one_line(exc, text)}") from None
    try:
        try:
            if composed is not None:
                root = composed[1]
            else:
                root = loader.get_node() if loader.check_node() else None
        except yaml.YAMLError as exc:
            raise BlisInputError(f"cannot parse {what} {path}: {_one_line(exc)}") from exc
        if root is None:
            raise BlisInputError(f"cannot parse {what} {path}: the file is empty")
        try:
            yield YamlContext(path, loader), root
        except yaml.YAMLError as exc:
            raise BlisInputError(f"cannot parse {what} {path}: {_one_line(exc)}") from exc
    finally:
        loader.dispose()
