"""Function-level imports of the package only where start-up time needs them (issue 26 item 3).

An import of a ``blis_fast`` module inside a function body (not under ``if TYPE_CHECKING``)
hides an edge and delays a failure, so each one says why it is there: a comment on the
import's first or last line, or on the line directly above it (``# lazy: blis --help must not
load numba``, ``# runs in the worker process only``). ``PENDING`` counts, per file, the
function-level imports that do not say why yet; the test fails when a file's count differs
from its entry (remove or lower the entry then), so the list only shrinks.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "blis_fast"

PENDING: dict[str, int] = {
}
"""Relative path -> number of function-level package imports without a reason."""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_package(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "blis_fast"
    return any(alias.name.split(".")[0] == "blis_fast" for alias in node.names)


def function_imports(source: str) -> list[ast.Import | ast.ImportFrom]:
    """The imports of package modules inside function bodies, outside ``if TYPE_CHECKING``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for orelse in child.orelse:
                    visit_one(orelse, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(child: ast.AST, in_function: bool) -> None:
        if (in_function and isinstance(child, (ast.Import, ast.ImportFrom))
                and _imports_package(child)):
            found.append(child)
        visit(child, in_function or isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def _comment_lines(source: str) -> tuple[set[int], set[int]]:
    """(lines holding a comment, lines holding only a comment)."""
    with_comment: set[int] = set()
    only_comment: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            with_comment.add(tok.start[0])
            if not tok.line[:tok.start[1]].strip():
                only_comment.add(tok.start[0])
    return with_comment, only_comment


def unexplained(source: str) -> list[int]:
    """First lines of the function-level package imports that give no reason."""
    with_comment, only_comment = _comment_lines(source)
    return [node.lineno for node in function_imports(source)
            if not ({node.lineno, node.end_lineno} & with_comment
                    or node.lineno - 1 in only_comment)]


def test_function_level_imports_say_why() -> None:
    counts: dict[str, int] = {}
    where: dict[str, list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = unexplained(path.read_text())
        if lines:
            rel = str(path.relative_to(REPO))
            counts[rel] = len(lines)
            where[rel] = lines
    differing = {rel: (counts.get(rel, 0), PENDING.get(rel, 0))
                 for rel in set(counts) | set(PENDING)
                 if counts.get(rel, 0) != PENDING.get(rel, 0)}
    assert not differing, (
        "function-level imports of blis_fast without a reason comment (file: (found, "
        f"PENDING)): {differing}; lines: { {r: where.get(r) for r in differing} }. Hoist the "
        "import to module level, or say on it (or on the line above) why it stays in the "
        "function; when a PENDING file is fixed, lower or remove its entry")


def test_check_sees_an_unexplained_import(tmp_path: Path) -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "from blis_fast.errors import BlisError\n"
        "if TYPE_CHECKING:\n"
        "    from blis_fast.runner import Prepared\n"
        "\n"
        "def bare():\n"
        "    import json\n"
        "    from blis_fast.files import OutputPlan\n"
        "    return OutputPlan, json\n"
        "\n"
        "def trailing():\n"
        "    from blis_fast.runner import prepare  # lazy: blis --help must not load numba\n"
        "    return prepare\n"
        "\n"
        "def above():\n"
        "    # runs in the worker process only\n"
        "    from blis_fast import api\n"
        "    return api\n"
        "\n"
        "def last_line():\n"
        "    from blis_fast.output.provenance import (\n"
        "        read_provenance, rerun_options,\n"
        "    )  # lazy: pyarrow\n"
        "    return read_provenance, rerun_options\n"
        "\n"
        "class C:\n"
        "    def method(self):\n"
        "        if self:\n"
        "            from . import gofmt\n"
        "            return gofmt\n"
        "        lambda: __import__('blis_fast')\n"
        "\n"
        "def comment_two_lines_up():\n"
        "    # a comment, then a blank line, says nothing about the import\n"
        "\n"
        "    import blis_fast.api\n"
        "    return blis_fast\n"
    )
    path = tmp_path / "module.py"
    path.write_text(source)
    assert unexplained(path.read_text()) == [10, 31, 38]
    assert len(function_imports(source)) == 6
