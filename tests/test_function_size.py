"""The size lint for Python functions, checked on the source (AST) of every module in ``blis_fast/``.

A function (methods and nested functions included) is at most MAX_FUNCTION_LINES lines, decorators
to last line, so that each is one named stage. Jitted kernels are left to
``tests/test_kernel_lint.py`` (its own limit). PENDING lists the functions that do not keep the
limit yet with their size today: the lint fails when one of them grows, and when one is split or
gone (the entry must then be removed), so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "blis_fast"
MAX_FUNCTION_LINES = 100
JIT_DECORATORS = {"njit", "jit", "cfunc", "vectorize", "guvectorize", "generated_jit"}

PENDING: dict[str, tuple[int, str]] = {
    "fit/cli.py:fit_command": (
        163, "one argparse front end (flags, reading, fitting, writing); split by sub-step pending"),
    "observe/command.py:build_workload": (
        110, "spec source, generation and job building in one; its module's flags are being reworked"),
    "workload/trace_v2.py:build_trace_csv": (
        123, "one CSV writer whose columns follow the reference's order; split by column group pending"),
}
"""Functions longer than MAX_FUNCTION_LINES today: ``path under blis_fast/:qualified name`` ->
(its line count, why it is not split yet)."""

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _decorator_name(node: ast.expr) -> str | None:
    """``njit`` for ``@njit``, ``@njit(...)``, ``@numba.njit`` and ``@numba.njit(...)``."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _is_jitted(fn: Function) -> bool:
    return any(_decorator_name(d) in JIT_DECORATORS for d in fn.decorator_list)


def function_sizes(path: Path, root: Path = PACKAGE) -> dict[str, int]:
    """Every non-jitted function of one module -> its line count (decorators to last line), keyed
    ``path relative to root:Outer.inner``."""
    rel = path.relative_to(root).as_posix()
    sizes: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, Function):
                if not _is_jitted(child):
                    first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                    sizes[f"{rel}:{prefix}{child.name}"] = child.end_lineno - first + 1
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return sizes


def package_function_sizes(root: Path = PACKAGE) -> dict[str, int]:
    """``function_sizes`` over every ``.py`` file under ``root``."""
    sizes: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        sizes.update(function_sizes(path, root))
    return sizes


def long_functions(root: Path = PACKAGE) -> dict[str, int]:
    """The functions under ``root`` longer than MAX_FUNCTION_LINES lines, with their sizes."""
    return {name: n for name, n in package_function_sizes(root).items()
            if n > MAX_FUNCTION_LINES}


def test_functions_are_short():
    too_long = {name: n for name, n in long_functions().items() if name not in PENDING}
    assert too_long == {}, (
        f"over {MAX_FUNCTION_LINES} lines: split into named stages (or, with a reason, PENDING)")


def test_pending_functions_only_shrink():
    sizes = package_function_sizes()
    problems = []
    for name, (recorded, _why) in PENDING.items():
        n = sizes.get(name)
        if n is None:
            problems.append(f"{name}: gone; remove it from PENDING")
        elif n <= MAX_FUNCTION_LINES:
            problems.append(f"{name}: {n} lines now; remove it from PENDING")
        elif n > recorded:
            problems.append(f"{name}: grew from {recorded} to {n} lines")
    assert problems == []


def test_pending_entries_have_reasons():
    assert all(why.strip() for _n, why in PENDING.values())


def test_the_size_check_sees_long_functions(tmp_path):
    body = "".join(f"    x += {k}\n" for k in range(MAX_FUNCTION_LINES))
    nested = "".join(f"        x += {k}\n" for k in range(MAX_FUNCTION_LINES))
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(
        "from numba import njit\n"
        f"def long(x):\n{body}    return x\n"
        f"def short(x):\n    return x\n"
        f"class Holder:\n    @staticmethod\n    def method(x):\n{nested}        return x\n"
        f"def outer(x):\n    def inner(x):\n{nested}        return x\n    return inner(x)\n"
        f"@njit(cache=True)\ndef kernel(x):\n{body}    return x\n"
    )
    found = long_functions(pkg)
    assert set(found) == {"mod.py:long", "mod.py:Holder.method", "mod.py:outer",
                          "mod.py:outer.inner"}
    assert found["mod.py:long"] == MAX_FUNCTION_LINES + 2
    assert found["mod.py:Holder.method"] == MAX_FUNCTION_LINES + 3  # the decorator counts


def test_the_package_is_scanned():
    sizes = package_function_sizes()
    assert "config/latency.py:resolve_latency" in sizes
    assert len(sizes) > 500
