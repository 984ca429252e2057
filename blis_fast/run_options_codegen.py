"""Writes the generated half of ``blis_fast/run_options.py`` (the typed ``RunOptions``) from the
rows of ``blis_fast.options.RUN_OPTIONS``.

Run it after adding, removing or changing a row (its flag, kind, default, help or group)::

    python -m blis_fast.run_options_codegen          # rewrite blis_fast/run_options.py
    python -m blis_fast.run_options_codegen --check  # exit 1, naming the file, when it is stale

Only the text below :data:`MARKER` is rewritten; the hand-written head of the file (its
docstring, imports and the ``RunOptionsMethods`` base) is kept as it is. Each row becomes one
field, in the table's order, typed from the row's kind (:data:`KIND_TYPES`), defaulting to the
row's default and documented by the row's help, under a comment heading per group.
``tests/test_run_options_typed.py`` checks that the checked-in file is what this writes.
"""

from __future__ import annotations

import ast
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from blis_fast.options import RUN_OPTIONS, OptionSpec

MARKER = ("# ---- below: generated from RUN_OPTIONS by blis_fast.run_options_codegen; "
          "do not edit ----\n")
"""The line after which ``run_options.py`` is generated text."""

KIND_TYPES = {"int": "int", "float": "float", "floats": "tuple[float, ...]", "str": "str",
              "bool": "bool"}
"""The annotation of a field, by its row's kind (what ``options.coerce`` returns for it)."""

RESERVED_FIELDS = frozenset({"explicit", "given"})
"""Names the class already uses: no row may be named so."""

_DOC_WIDTH = 90
"""Characters of field documentation per line (four-space indent and quotes stay within 100)."""


def run_options_path() -> Path:
    """``run_options.py`` of the package this module belongs to (a copy's own, in a copy)."""
    return Path(__file__).with_name("run_options.py")


def _literal(spec: OptionSpec) -> str:
    """The Python text of the row's default, checked to read back as the same value."""
    value = spec.default
    if spec.kind == "bool":
        text = repr(bool(value))
    elif spec.kind == "int":
        text = f"{value:_}" if abs(value) >= 10_000 else repr(value)
    elif spec.kind == "float":
        if not math.isfinite(value):
            raise ValueError(f"--{spec.flag}: a non-finite default ({value!r}) has no literal")
        text = repr(float(value))
    elif spec.kind == "floats":
        items = [repr(float(v)) for v in value]
        text = f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    else:
        text = json.dumps(value, ensure_ascii=False)
    if ast.literal_eval(text) != value:
        raise ValueError(f"--{spec.flag}: its default {value!r} does not read back from {text}")
    return text


def _field_doc(spec: OptionSpec) -> str:
    """The field's docstring lines (indented for the class body): the flag and its help, plus
    where a policy flag's names come from."""
    text = f"--{spec.flag}: {spec.help}"
    if spec.choices:
        text += f" (a name of the ``{spec.choices}`` registry)"
    if '"""' in text or "\\" in text or text.endswith('"'):
        raise ValueError(f"--{spec.flag}: its help cannot be written inside a docstring")
    lines = textwrap.wrap(text, _DOC_WIDTH)
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return "\n".join(f"    {line}" for line in lines)


def _field(spec: OptionSpec) -> str:
    """One row's field: ``name: type = default`` and its docstring."""
    name = spec.field
    if not name.isidentifier() or name in RESERVED_FIELDS:
        raise ValueError(f"--{spec.flag}: {name!r} cannot be a RunOptions field")
    if spec.kind not in KIND_TYPES:
        raise ValueError(f"--{spec.flag}: unknown kind {spec.kind!r}")
    return f"    {name}: {KIND_TYPES[spec.kind]} = {_literal(spec)}\n{_field_doc(spec)}\n"


def render_class(rows: Sequence[OptionSpec] = RUN_OPTIONS) -> str:
    """The generated text: the ``RunOptions`` dataclass, one field per row in order, a comment
    heading where the group changes, then ``explicit``."""
    out = ["@dataclass(frozen=True)\n",
           "class RunOptions(RunOptionsMethods):\n",
           '    """The value of every ``blis run`` flag (one attribute per row of RUN_OPTIONS) '
           "and the\n    fields given explicitly (``explicit``).\"\"\"\n"]
    group: str | None = None
    for spec in rows:
        if spec.group != group:
            group = spec.group
            out.append(f"\n    # {group or 'Ungrouped'}\n\n")
        out.append(_field(spec))
    out.append("\n    # Given explicitly\n\n"
               "    explicit: frozenset[str] = frozenset()\n"
               '    """The fields set explicitly (by a flag, an API keyword, a sweep value or a '
               'recorded run);\n    the others hold their defaults."""\n')
    return "".join(out)


def render_run_options(current: str, rows: Sequence[OptionSpec] = RUN_OPTIONS) -> str:
    """``current`` (the text of ``run_options.py``) with everything after :data:`MARKER`
    replaced by :func:`render_class` of ``rows``."""
    head, found, _ = current.partition(MARKER)
    if not found:
        raise ValueError(f"run_options.py has no marker line {MARKER.strip()!r}")
    return head + MARKER + "\n\n" + render_class(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite ``run_options.py`` (or, with ``--check``, only report whether it is stale)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--check"]):
        print("usage: python -m blis_fast.run_options_codegen [--check]", file=sys.stderr)
        return 2
    path = run_options_path()
    current = path.read_text(encoding="utf-8")
    wanted = render_run_options(current)
    if wanted == current:
        return 0
    if args:
        print(f"{path} is out of date with RUN_OPTIONS: run python -m "
              "blis_fast.run_options_codegen", file=sys.stderr)
        return 1
    path.write_text(wanted, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
