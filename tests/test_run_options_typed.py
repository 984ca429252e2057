"""The checked-in, typed ``RunOptions`` (blis_fast/run_options.py) agrees with the option rows.

The class below the file's marker is generated from ``RUN_OPTIONS`` by
``python -m blis_fast.run_options_codegen``: these tests regenerate it in memory and require the
checked-in text to be the same, check each field's annotation against its row's kind (with a
kind-to-type table of their own, not the generator's), and show that a stale file is caught.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
import typing
from dataclasses import replace
from pathlib import Path

import pytest

from blis_fast import run_options_codegen as codegen
from blis_fast.options import (
    OPTIONS_BY_FIELD,
    RUN_OPTIONS,
    RunOptions,
    build_options,
    run_options_disagreements,
)

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "blis_fast" / "run_options.py"

TYPE_OF_KIND = {"int": int, "float": float, "floats": tuple[float, ...], "str": str,
                "bool": bool}
"""What ``options.coerce`` returns for each kind of row: the annotation its field must carry."""


def test_the_checked_in_file_is_what_the_generator_writes():
    current = GENERATED.read_text(encoding="utf-8")
    assert codegen.render_run_options(current) == current, (
        "blis_fast/run_options.py is stale: run python -m blis_fast.run_options_codegen")
    assert codegen.main(["--check"]) == 0


def test_each_field_is_its_row_typed_by_its_kind_with_its_default():
    fields = dataclasses.fields(RunOptions)
    assert [f.name for f in fields] == [spec.field for spec in RUN_OPTIONS] + ["explicit"]
    hints = typing.get_type_hints(RunOptions)
    for f in fields[:-1]:
        spec = OPTIONS_BY_FIELD[f.name]
        assert f.type == hints[f.name] == TYPE_OF_KIND[spec.kind], f.name
        assert f.default == spec.default and type(f.default) is type(spec.default), f.name
    assert hints["explicit"] == frozenset[str] and fields[-1].default == frozenset()
    assert run_options_disagreements(RunOptions) == []


def test_fields_sit_under_their_group_headings_with_their_help():
    """Read back from the source: each group's heading comment comes before its rows' fields,
    and each field's docstring starts with its flag and help."""
    source = GENERATED.read_text(encoding="utf-8")
    lines = source.splitlines()
    body = next(node for node in ast.parse(source).body
                if isinstance(node, ast.ClassDef) and node.name == "RunOptions").body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr):
            docs[node.target.id] = (node.lineno, " ".join(after.value.value.split()))
    for spec in RUN_OPTIONS:
        line, doc = docs[spec.field]
        assert doc.startswith(" ".join(f"--{spec.flag}: {spec.help}".split())), spec.flag
        heading = next(text.strip() for text in reversed(lines[:line])
                       if text.strip().startswith("# "))
        assert heading == f"# {spec.group}", spec.flag


def test_run_options_keep_their_behaviour():
    opts = build_options({"rate": "2.5", "seed": "0x10"})
    assert isinstance(opts, RunOptions)
    assert (opts.rate, opts.seed, opts.model) == (2.5, 16, "")
    assert opts.given("rate") and not opts.given("model")
    assert opts.explicit == frozenset({"rate", "seed"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.rate = 1.0  # type: ignore[misc]
    again = replace(opts, num_requests=7)
    assert again.num_requests == 7 and again.explicit == opts.explicit
    assert repr(RunOptions()).startswith("RunOptions(model='', hardware=''")


def test_a_changed_row_makes_the_file_stale():
    current = GENERATED.read_text(encoding="utf-8")
    rows = list(RUN_OPTIONS)
    at = next(i for i, spec in enumerate(rows) if spec.flag == "rate")
    rows[at] = replace(rows[at], default=3.0)
    assert codegen.render_run_options(current, tuple(rows)) != current
    assert run_options_disagreements(RunOptions, tuple(rows)) == [
        "rate defaults to 1.0, its row to 3.0"]
    extra = (*RUN_OPTIONS, replace(RUN_OPTIONS[at], flag="extra-rate"))
    assert "extra_rate: float = 1.0" in codegen.render_class(extra)
    assert "missing ['extra_rate']" in run_options_disagreements(RunOptions, extra)[0]
    with pytest.raises(ValueError, match="no marker line"):
        codegen.render_run_options("no marker here\n")


def test_the_generator_runs_as_a_module():
    res = subprocess.run([sys.executable, "-m", "blis_fast.run_options_codegen", "--check"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (res.returncode, res.stderr) == (0, "")
    res = subprocess.run([sys.executable, "-m", "blis_fast.run_options_codegen", "--bogus"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "usage:" in res.stderr
