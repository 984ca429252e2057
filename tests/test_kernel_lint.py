"""The kernel contract, checked on the source (AST) of every module in ``blis_fast/kernels/``.

Every jitted function (``njit``, ``cfunc``) is compiled with ``cache=True`` (a run never
recompiles what an earlier run compiled), never with ``fastmath`` (it reorders float arithmetic
and changes results against the reference), and contains no ``print``, ``raise``, ``assert`` or
``open``: kernels report failures with status codes, and Python does the talking. Jitted code
lives only in ``blis_fast/kernels/``. Kernels stay short enough to be named for what they do:
at most MAX_KERNEL_LINES lines and MAX_KERNEL_PARAMS parameters each (state travels in the
NamedTuple groups of ``kernels/engine/state.py``).

Kernel code imports nothing of the package but other kernel modules and the leaves
``jit.FROZEN_LEAVES`` names: every compile-time constant a kernel reads is defined under
``blis_fast/kernels/``, so the kernels' cache key (which digests exactly those files) follows
every edit that changes compiled code.

Every kernel module takes its ``njit`` from ``blis_fast/kernels/jit.py``, which compiles a
kernel without Numba's Python wrapper unless ``jit.PYTHON_CALLABLE`` names it; that list must
be exactly the kernels that code outside ``blis_fast/kernels/`` (package, tests, benchmarks,
examples) refers to.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "blis_fast"
KERNELS = PACKAGE / "kernels"
JIT_DECORATORS = {"njit", "jit", "cfunc", "vectorize", "guvectorize", "generated_jit"}
FORBIDDEN_CALLS = {"print", "open", "input", "exec", "eval"}
MAX_KERNEL_LINES = 120
MAX_KERNEL_PARAMS = 15
PENDING_SIZE: dict[str, str] = {}
"""Modules whose kernels do not keep the size limits yet, and why (the test fails once they
do, so the entry is removed then)."""


def _decorator_name(node: ast.expr) -> str | None:
    """``njit`` for ``@njit``, ``@njit(...)``, ``@numba.njit`` and ``@numba.njit(...)``."""
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _keywords(node: ast.expr) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in node.keywords if k.arg} if isinstance(node, ast.Call) else {}


def jitted_functions(path: Path) -> list[tuple[ast.FunctionDef, ast.expr]]:
    """(function, its jit decorator) for every jitted function of one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if _decorator_name(deco) in JIT_DECORATORS:
                    found.append((node, deco))
    return found


def contract_violations(path: Path) -> list[str]:
    """Every breach of the kernel contract in one module, as ``file:line: message``."""
    out = []
    for fn, deco in jitted_functions(path):
        where = f"{path.name}:{fn.lineno} {fn.name}"
        kw = _keywords(deco)
        cache = kw.get("cache")
        if not (isinstance(cache, ast.Constant) and cache.value is True):
            out.append(f"{where}: not compiled with cache=True")
        if "fastmath" in kw and not (isinstance(kw["fastmath"], ast.Constant)
                                     and kw["fastmath"].value is False):
            out.append(f"{where}: fastmath changes results")
        for node in ast.walk(fn):
            if isinstance(node, ast.Raise):
                out.append(f"{where}: raises (return a status code instead)")
            elif isinstance(node, ast.Assert):
                out.append(f"{where}: asserts (return a status code instead)")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in FORBIDDEN_CALLS):
                out.append(f"{where}: calls {node.func.id}()")
    return out


def size_violations(path: Path) -> list[str]:
    """Jitted functions of one module longer than MAX_KERNEL_LINES lines (decorator to last
    line) or with more than MAX_KERNEL_PARAMS parameters."""
    out = []
    for fn, deco in jitted_functions(path):
        lines = fn.end_lineno - deco.lineno + 1
        params = len(fn.args.args) + len(fn.args.kwonlyargs)
        if lines > MAX_KERNEL_LINES:
            out.append(f"{path.name}:{fn.lineno} {fn.name}: {lines} lines")
        if params > MAX_KERNEL_PARAMS:
            out.append(f"{path.name}:{fn.lineno} {fn.name}: {params} parameters")
    return out


KERNEL_MODULES = sorted(KERNELS.rglob("*.py"))


@pytest.mark.parametrize("path", KERNEL_MODULES, ids=[p.name for p in KERNEL_MODULES])
def test_kernel_module_keeps_the_contract(path):
    assert contract_violations(path) == []


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=PENDING_SIZE[p.name]))
    if p.name in PENDING_SIZE else p for p in KERNEL_MODULES], ids=[p.name for p in KERNEL_MODULES])
def test_kernels_are_short(path):
    assert size_violations(path) == []


def test_the_size_check_sees_long_kernels(tmp_path):
    body = "".join(f"    x += {k}\n" for k in range(MAX_KERNEL_LINES))
    params = ", ".join(f"a{k}" for k in range(MAX_KERNEL_PARAMS + 1))
    bad = tmp_path / "long.py"
    bad.write_text("from numba import njit\n"
                   f"@njit(cache=True)\ndef long(x):\n{body}    return x\n"
                   f"@njit(cache=True)\ndef wide({params}):\n    return a0\n"
                   "@njit(cache=True)\ndef fine(x):\n    return x\n")
    found = size_violations(bad)
    assert any("long: " in v and "lines" in v for v in found)
    assert any("wide: " in v and f"{MAX_KERNEL_PARAMS + 1} parameters" in v for v in found)
    assert not any(" fine:" in v for v in found)


def test_jitted_code_lives_only_in_kernels():
    outside = [f"{p.relative_to(PACKAGE)}:{fn.lineno} {fn.name}"
               for p in sorted(PACKAGE.rglob("*.py")) if KERNELS not in p.parents
               for fn, _ in jitted_functions(p)]
    assert outside == []


def project_imports_outside_kernels(path: Path) -> list[str]:
    """Imports of package modules (module-level or inside functions, absolute or relative) in
    one kernel module that are neither kernel modules nor a frozen leaf, as ``file:line: name``."""
    from blis_fast.kernels.jit import FROZEN_LEAVES

    leaves = {f"blis_fast.{name.removesuffix('.py')}" for name in FROZEN_LEAVES}
    package = ["blis_fast", *path.parent.relative_to(PACKAGE).parts]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] != "blis_fast" or name in leaves:
                continue
            if name == "blis_fast.kernels" or name.startswith("blis_fast.kernels."):
                continue
            out.append(f"{path.name}:{node.lineno}: {name}")
    return out


def test_kernel_code_imports_only_kernels_and_frozen_leaves():
    found = [v for p in KERNEL_MODULES for v in project_imports_outside_kernels(p)]
    assert found == []


TEXT_ONLY_IMPORTS = {"blis_fast.gofmt"}
"""What the frozen leaves may import: Go's quoting for an error's text (never a value a kernel
holds)."""


def test_the_frozen_leaves_import_no_project_module():
    from blis_fast.kernels.jit import FROZEN_LEAVES

    for name in FROZEN_LEAVES:
        tree = ast.parse((PACKAGE / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert node.level == 0, name
                assert not module.startswith("blis_fast") or module in TEXT_ONLY_IMPORTS, name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("blis_fast") for a in node.names), name


def test_the_import_check_sees_each_breach(tmp_path):
    bad = KERNELS / "_lint_probe_tmp.py"
    try:
        bad.write_text(
            "from blis_fast.policies.admission import ADMISSION\n"
            "import blis_fast.options\n"
            "from .. import runner\n"
            "from blis_fast.kernels.enums import Routing\n"
            "from blis_fast.gonum import INT64_MAX\n"
            "from . import heap\n"
            "def f():\n"
            "    from blis_fast.config import latency\n")
        found = project_imports_outside_kernels(bad)
    finally:
        bad.unlink()
    assert [v.split(": ")[1] for v in found] == [
        "blis_fast.policies.admission", "blis_fast.options", "blis_fast.runner",
        "blis_fast.config"]


def test_the_lint_sees_each_breach(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from numba import njit, cfunc\n"
        "import numba\n"
        "@njit\n"
        "def a(x):\n    return x\n"
        "@numba.njit(cache=True, fastmath=True)\n"
        "def b(x):\n    print(x)\n    return x\n"
        "@cfunc('int64(int64)', cache=False)\n"
        "def c(x):\n    if x < 0:\n        raise ValueError('no')\n    assert x\n    return x\n"
        "@njit(cache=True)\n"
        "def good(x):\n    return x + 1\n"
    )
    found = contract_violations(bad)
    assert any("a: not compiled with cache=True" in v for v in found)
    assert any("b: fastmath" in v for v in found) and any("b: calls print()" in v for v in found)
    assert any("c: not compiled with cache=True" in v for v in found)
    assert any("c: raises" in v for v in found) and any("c: asserts" in v for v in found)
    assert not any(" good:" in v for v in found)
    assert len(KERNEL_MODULES) >= 10  # the glob sees the real kernels


def numba_decorator_imports(path: Path) -> list[str]:
    """Jit decorators a kernel module takes from numba itself instead of ``kernels.jit``
    (``from numba import njit``, ``@numba.njit``)."""
    out = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "numba":
            out += [f"{path.name}:{node.lineno} imports {a.name} from numba" for a in node.names
                    if a.name in JIT_DECORATORS - {"cfunc"}]
        elif isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if (isinstance(target, ast.Attribute) and target.attr in JIT_DECORATORS - {"cfunc"}
                        and isinstance(target.value, ast.Name) and target.value.id == "numba"):
                    out.append(f"{path.name}:{node.lineno} {node.name}: numba.{target.attr}")
    return out


def test_kernel_modules_take_njit_from_the_jit_module():
    assert [v for p in KERNEL_MODULES for v in numba_decorator_imports(p)] == []


KERNEL_PACKAGES = {"blis_fast.kernels", *(
    "blis_fast.kernels." + ".".join(p.parent.relative_to(KERNELS).parts)
    for p in KERNELS.rglob("__init__.py") if p.parent != KERNELS)}
"""The kernels' package and its subpackages (``from <package> import module as alias``)."""


def _module_name(path: Path) -> str:
    """``blis_fast.kernels.engine.heap`` for ``blis_fast/kernels/engine/heap.py``."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def outside_references(paths: list[Path]) -> dict[tuple[str, str], set[str]]:
    """(kernel module, name) -> files outside ``blis_fast/kernels/`` naming it:
    ``from blis_fast.kernels.M import name`` and ``alias.name`` after
    ``from blis_fast.kernels import M as alias`` / ``import blis_fast.kernels.M as alias``."""
    refs: dict[tuple[str, str], set[str]] = {}
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases = {}
        # a jitted shim (a test's ``@numba.njit`` function) calls kernels from a kernel
        jitted = {id(inner) for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
                  and any("jit" in ast.unparse(d) for d in fn.decorator_list)
                  for inner in ast.walk(fn)}
        used_outside = {node.id for node in ast.walk(tree)
                        if isinstance(node, ast.Name) and id(node) not in jitted}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in KERNEL_PACKAGES:
                aliases.update({a.asname or a.name: a.name for a in node.names})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "blis_fast.kernels."):
                module = node.module.split(".")[-1]
                for a in node.names:
                    name = a.asname or a.name
                    if name in used_outside or not any(
                            isinstance(n, ast.Name) and n.id == name for n in ast.walk(tree)):
                        refs.setdefault((module, a.name), set()).add(path.name)
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name.split(".")[-1] for a in node.names
                                if a.asname and a.name.startswith("blis_fast.kernels.")})
        # ``module.kernel.attribute`` uses the dispatcher (``.compile(signature)``), not a call
        dispatcher_uses = {id(node.value) for node in ast.walk(tree)
                           if isinstance(node, ast.Attribute)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and id(node) not in dispatcher_uses
                    and id(node) not in jitted):
                refs.setdefault((aliases[node.value.id], node.attr), set()).add(path.name)
    return refs


def wrapper_mismatches(refs: dict[tuple[str, str], set[str]]) -> list[str]:
    """Kernels whose Python wrapper does not match their use: called from outside the kernels
    without one (a call fails at run time), or built with one nobody outside calls (compile
    time spent for nothing); and ``PYTHON_CALLABLE`` entries that name no kernel."""
    from numba.core.dispatcher import Dispatcher

    from blis_fast.kernels.jit import PYTHON_CALLABLE, has_python_wrapper

    out = []
    seen = set()
    for path in KERNEL_MODULES:
        module = importlib.import_module(_module_name(path))
        for name, value in vars(module).items():
            if not (isinstance(value, Dispatcher) and value.py_func.__module__ == module.__name__):
                continue
            seen.add((path.stem, name))
            called = refs.get((path.stem, name))
            if called and not has_python_wrapper(value):
                out.append(f"{path.stem}.{name} is called from {sorted(called)} but has no Python "
                           "wrapper: add it to kernels/jit.py PYTHON_CALLABLE")
            elif not called and has_python_wrapper(value):
                out.append(f"{path.stem}.{name} has a Python wrapper nobody outside the kernels "
                           "calls: remove it from PYTHON_CALLABLE")
    out += [f"PYTHON_CALLABLE names {m}.{n}, which is no kernel"
            for m, names in PYTHON_CALLABLE.items() for n in names if (m, n) not in seen]
    return out


OUTSIDE_KERNELS = [p for folder in ("blis_fast", "tests", "bench", "examples")
                   for p in sorted((REPO / folder).rglob("*.py")) if KERNELS not in p.parents]


def test_only_kernels_called_from_outside_have_a_python_wrapper():
    refs = outside_references(OUTSIDE_KERNELS)
    assert len(refs) > 50  # the scan sees the engine's, the generator's and the tests' calls
    assert wrapper_mismatches(refs) == []


def test_the_wrapper_check_sees_each_mismatch():
    refs = outside_references(OUTSIDE_KERNELS)
    refs[("heap", "_less")] = {"somewhere.py"}  # an internal kernel called from Python
    del refs[("event_loop", "run_events")]  # a wrapped kernel nobody calls
    found = wrapper_mismatches(refs)
    assert any("heap._less is called from ['somewhere.py']" in v for v in found)
    assert any("event_loop.run_events has a Python wrapper nobody" in v for v in found)


def test_python_callable_kernels_cache_apart_from_internal_ones():
    """A kernel's cache files are named after its qualified name and keyed by signature only:
    a Python-callable kernel must never load machine code cached without the wrapper (a
    crash), so the two kinds cache under different names (``kernels/jit.py``)."""
    from numba.core.dispatcher import Dispatcher

    from blis_fast.kernels.jit import has_python_wrapper

    kinds = {True: 0, False: 0}
    for path in KERNEL_MODULES:
        module = importlib.import_module(_module_name(path))
        for value in vars(module).values():
            if isinstance(value, Dispatcher) and value.py_func.__module__ == module.__name__:
                wrapped = has_python_wrapper(value)
                kinds[wrapped] += 1
                assert value.py_func.__qualname__.endswith(".py") == wrapped, value
                assert value._cache._cache_file._index_name.split("-")[0].endswith(".py") \
                    == wrapped, value._cache._cache_file._index_name
    assert kinds[True] > 20 and kinds[False] > 100
