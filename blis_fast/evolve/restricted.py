"""The language a candidate is written in: a Python module whose only code is Numba
``nopython`` functions, so that the candidate never runs as Python inside the evaluator.

Why: the evaluation harness (compile, simulate, score, send the record) runs in the same
process as the candidate's policy, which must be a compiled hook for speed. If the module
could run arbitrary Python it could open sockets, write to the result channel, patch the
harness or fork. A module checked here can only

- import ``math``, ``numpy``, ``numba`` (a facade with ``njit``/``jit``/``prange`` only,
  forced to nopython with bounds checks, no cache, no parallel threads) and the hook
  column constants (``from blis_fast.kernels.cluster import hooks as H``);
- define functions (decorated with ``njit``/``jit`` or not) and module constants built from
  literals, constants and a few numpy/math constructors;

and its functions are compiled by Numba in nopython mode, where no file, socket or process
call exists. Attributes and names that reach raw memory or files from nopython code
(``np.lib.stride_tricks``, ``.ctypes``, ``np.frombuffer``, ``numba.objmode``...) and every
dunder are refused, and indexing is bounds-checked, so the policy cannot write outside its
own arrays. ``print`` works (it goes to the captured candidate output, never the protocol).
"""

from __future__ import annotations

import ast
import builtins
import math
import types
from typing import Any

MODULES = ("math", "numpy", "numba")
"""Modules a candidate may import by name (``numba`` is the facade below)."""

HOOKS_MODULE = "blis_fast.kernels.cluster"
"""``from blis_fast.kernels.cluster import hooks [as H]``: the hook column constants."""

REFUSED_ATTRIBUTES = frozenset({
    # raw memory, pointers and files reachable from nopython numpy/numba code
    "lib", "stride_tricks", "as_strided", "ctypes", "ctypeslib", "cffi", "frombuffer",
    "fromfile", "fromstring", "memmap", "load", "save", "savez", "savetxt", "loadtxt",
    "genfromtxt", "tofile", "carray", "farray", "objmode", "cfunc", "literally",
    "DataSource", "testing", "f2py", "distutils", "extending", "core", "types", "typed",
    "typeof", "np_support", "experimental", "config", "dump", "dumps", "fromregex", "info",
    "lookfor", "vectorize", "frompyfunc", "apply_along_axis", "apply_over_axes", "piecewise",
})
"""Attributes (and imported names) a candidate may not mention: ways from nopython code to
raw memory, files or the Python interpreter."""

REFUSED_NAMES = frozenset({
    # Python escapes (most do not compile in nopython; refused so the check says why)
    "getattr", "setattr", "delattr", "eval", "exec", "compile", "open", "globals", "locals",
    "vars", "input", "breakpoint", "memoryview", "super", "type", "object", "dir", "id",
    "help", "exit", "quit", "classmethod", "staticmethod", "property", "hasattr",
})
"""Builtin names a candidate may not mention."""

_CONSTRUCTORS = frozenset({"array", "asarray", "zeros", "ones", "full", "arange", "linspace",
                           "empty", "float64", "int64", "float32", "int32", "bool_"})
_BUILTIN_CALLS = frozenset({"float", "int", "abs", "min", "max", "len", "range", "round",
                            "tuple", "list", "bool", "sum"})
_SAFE_BUILTINS = ("True", "False", "None", "float", "int", "abs", "min", "max", "len",
                  "range", "round", "tuple", "list", "bool", "sum", "enumerate", "zip",
                  "print", "Exception", "ValueError", "IndexError", "ZeroDivisionError",
                  "FloatingPointError", "RuntimeError", "ArithmeticError", "AssertionError",
                  "KeyError", "TypeError", "MemoryError", "NotImplementedError")


class RestrictedError(Exception):
    """The candidate is not in the restricted language (the message names the line)."""


def _numba_facade() -> types.ModuleType:
    """``numba`` as a candidate sees it: njit/jit forced to nopython, bounds-checked, no
    cache and no threads; prange (a plain range without ``parallel``)."""
    import numba

    allowed = {"fastmath", "inline", "error_model", "nopython", "forceobj"}

    def njit(*args: Any, **kw: Any) -> Any:
        bad = sorted(set(kw) - allowed)
        if bad or kw.get("forceobj") or kw.get("nopython") is False:
            raise RestrictedError(f"njit option {(bad or ['forceobj'])[0]!r} is not allowed")
        opts = {k: v for k, v in kw.items() if k in ("fastmath", "inline", "error_model")}
        opts.update(nopython=True, boundscheck=True, cache=False, parallel=False)
        if len(args) == 1 and callable(args[0]) and not kw:
            return numba.jit(**opts)(args[0])
        if args:  # a signature string would be evaluated by Numba as Python
            raise RestrictedError("njit/jit take no signature in a candidate")
        return numba.jit(**opts)

    facade = types.ModuleType("numba")
    facade.njit = njit
    facade.jit = njit
    facade.prange = numba.prange
    return facade


def _hooks_facade() -> types.ModuleType:
    """The hook column constants (SNAP_*, REQ_*, KEY_*), nothing else of the hooks module."""
    from blis_fast.kernels.cluster import hooks as H  # lazy: numba

    facade = types.ModuleType("blis_fast.kernels.cluster.hooks")
    for name in dir(H):
        if name.split("_")[0] in ("SNAP", "REQ", "KEY") and isinstance(getattr(H, name), int):
            setattr(facade, name, getattr(H, name))
    return facade


def _refuse(node: ast.AST, why: str) -> None:
    raise RestrictedError(f"line {getattr(node, 'lineno', '?')}: {why}")


def _check_names(tree: ast.AST) -> None:
    """No dunder or refused name/attribute anywhere; no class, with, import in a function."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_") or node.attr in REFUSED_ATTRIBUTES:
                _refuse(node, f"attribute {node.attr!r} is not allowed in a candidate")
        elif isinstance(node, ast.Name):
            if node.id.startswith("__") or node.id in REFUSED_NAMES:
                _refuse(node, f"name {node.id!r} is not allowed in a candidate")
        elif isinstance(node, ast.alias):
            for part in (node.name.split(".") + [node.asname or ""]):
                if part.startswith("_") or part in REFUSED_ATTRIBUTES | REFUSED_NAMES:
                    _refuse(node, f"import of {node.name!r} is not allowed in a candidate")
        elif isinstance(node, ast.arg | ast.FunctionDef | ast.keyword):
            name = getattr(node, "arg", None) or getattr(node, "name", None) or ""
            if name.startswith("__"):
                _refuse(node, f"name {name!r} is not allowed in a candidate")
        elif isinstance(node, ast.ClassDef | ast.With | ast.AsyncWith | ast.AsyncFunctionDef
                        | ast.Await | ast.Global | ast.Nonlocal):
            _refuse(node, f"{type(node).__name__} statements are not allowed in a candidate")


def _check_import(node: ast.Import | ast.ImportFrom) -> None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name not in MODULES:
                _refuse(node, f"import {alias.name}: a candidate may import only "
                              f"{', '.join(MODULES)} and {HOOKS_MODULE}.hooks")
        return
    module = node.module or ""
    if node.level:
        _refuse(node, "relative imports are not allowed in a candidate")
    if module == "__future__":
        return
    if module == HOOKS_MODULE:
        if any(a.name != "hooks" for a in node.names):
            _refuse(node, f"from {HOOKS_MODULE} a candidate may import only hooks")
        return
    if module == "numba":
        if any(a.name not in ("njit", "jit", "prange") for a in node.names):
            _refuse(node, "from numba a candidate may import only njit, jit and prange")
        return
    if module not in ("math", "numpy"):
        _refuse(node, f"from {module} import: a candidate may import only "
                      f"{', '.join(MODULES)} and {HOOKS_MODULE}.hooks")
    if any(a.name == "*" for a in node.names):
        _refuse(node, "import * is not allowed in a candidate")


def _check_constant(node: ast.AST, modules: dict[str, str]) -> None:
    """A module-level value: literals, names, attributes, arithmetic, and calls of a few
    numpy constructors, math functions and builtins (no loops, no comprehensions).
    ``modules``: the names the candidate's imports bound to numpy or math."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            base = modules.get(f.value.id) if isinstance(f, ast.Attribute) \
                and isinstance(f.value, ast.Name) else None
            ok = (isinstance(f, ast.Name) and f.id in _BUILTIN_CALLS) or (
                base == "numpy" and f.attr in _CONSTRUCTORS) or base == "math"
            if not ok:
                _refuse(sub, "a module-level value may call only numpy constructors "
                             "(np.array, np.zeros, ...), math functions and float/int/min/max")
        elif not isinstance(sub, ast.expr | ast.expr_context | ast.operator | ast.unaryop
                            | ast.cmpop | ast.boolop | ast.keyword):
            _refuse(sub, f"{type(sub).__name__} is not allowed in a module-level value")
        elif isinstance(sub, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
                        | ast.Lambda | ast.NamedExpr | ast.Await | ast.Yield | ast.YieldFrom):
            _refuse(sub, f"{type(sub).__name__} is not allowed in a module-level value")


def _check_decorator(node: ast.expr) -> None:
    f = node.func if isinstance(node, ast.Call) else node
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    if name not in ("njit", "jit"):
        _refuse(node, "a candidate's functions may be decorated only with njit or jit")
    if isinstance(node, ast.Call):
        if node.args or any(k.arg is None for k in node.keywords):
            # a signature string is evaluated by Numba as Python: keyword options only
            _refuse(node, "njit/jit take keyword options only in a candidate (no signature)")
        for k in node.keywords:
            if not isinstance(k.value, ast.Constant):
                _refuse(node, f"njit option {k.arg}= must be a literal")


def _check_annotations(fn: ast.FunctionDef) -> None:
    """Annotations are evaluated when the function is defined: names, attributes,
    subscripts and literals only (``float``, ``np.ndarray``), no calls."""
    args = fn.args
    notes = [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                    *(x for x in (args.vararg, args.kwarg) if x))]
    for note in [*notes, fn.returns]:
        if note is not None:
            _check_annotations_of(note)


def _check_annotations_of(note: ast.expr) -> None:
    for sub in ast.walk(note):
        if not isinstance(sub, ast.Name | ast.Attribute | ast.Subscript | ast.Constant
                          | ast.Tuple | ast.expr_context | ast.BinOp | ast.BitOr):
            _refuse(sub, "an annotation may hold only names and attributes")


def check_source(source: str) -> ast.Module:
    """Parse and check a candidate module; raises SyntaxError or RestrictedError."""
    tree = ast.parse(source, "<candidate>")
    _check_names(tree)
    modules: dict[str, str] = {}  # names bound to numpy or math by the imports
    fixed = set(_SAFE_BUILTINS)  # names a candidate may not rebind at module level

    _assigned: set[str] = set()  # module constants (may be assigned again)

    def bind(node: ast.AST, name: str) -> None:
        if name in fixed:
            _refuse(node, f"a candidate may not rebind {name!r}")
        fixed.add(name)

    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                bind(stmt, alias.asname or alias.name)
                modules[alias.asname or alias.name] = alias.name
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                bind(stmt, alias.asname or alias.name)
    for stmt in tree.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                and isinstance(stmt.value.value, str):
            continue  # a docstring
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            _check_import(stmt)
        elif isinstance(stmt, ast.FunctionDef):
            for dec in stmt.decorator_list:
                _check_decorator(dec)
            for default in [*stmt.args.defaults, *(d for d in stmt.args.kw_defaults if d)]:
                _check_constant(default, modules)
            _check_annotations(stmt)
            bind(stmt, stmt.name)
            for sub in ast.walk(stmt):
                if sub is not stmt and isinstance(sub, ast.Import | ast.ImportFrom):
                    _refuse(sub, "imports inside a function are not allowed in a candidate")
        elif isinstance(stmt, ast.Assign | ast.AnnAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for sub in ast.walk(target):
                    if not isinstance(sub, ast.Name | ast.Tuple | ast.List | ast.expr_context):
                        _refuse(stmt, "a module-level assignment may bind only names")
                    if isinstance(sub, ast.Name):
                        if sub.id in fixed - _assigned:
                            _refuse(stmt, f"a candidate may not rebind {sub.id!r}")
                        _assigned.add(sub.id)
                        fixed.add(sub.id)
            if stmt.value is None:
                _refuse(stmt, "a module-level annotation needs a value")
            _check_constant(stmt.value, modules)
            if isinstance(stmt, ast.AnnAssign):
                _check_annotations_of(stmt.annotation)
        else:
            what = ("expressions (such as a call)" if isinstance(stmt, ast.Expr)
                    else f"{type(stmt).__name__} statements")
            _refuse(stmt, f"module-level {what} are not allowed in a candidate (only imports, "
                          "functions and constants)")
    return tree


def _importer(numba_facade: types.ModuleType, hooks: types.ModuleType) -> Any:
    """The ``__import__`` a candidate's module runs with: the allowed modules only."""
    import numpy

    package = types.ModuleType(HOOKS_MODULE)
    package.hooks = hooks
    table = {"math": math, "numpy": numpy, "numba": numba_facade, HOOKS_MODULE: package,
             "__future__": __import__("__future__")}

    def restricted_import(name: str, globals: Any = None, locals: Any = None,  # noqa: A002
                          fromlist: Any = (), level: int = 0) -> Any:
        if level or name not in table:
            raise ImportError(f"a candidate cannot import {name}")
        return table[name]
    return restricted_import


def load_candidate(source: str) -> dict[str, Any]:
    """Check ``source`` and execute it with restricted builtins; its namespace.

    Raises SyntaxError, RestrictedError, or what the module's constant expressions raise
    (e.g. MemoryError for a huge array).
    """
    tree = check_source(source)
    safe = {name: getattr(builtins, name) for name in _SAFE_BUILTINS}
    safe["__import__"] = _importer(_numba_facade(), _hooks_facade())
    safe["__build_class__"] = None
    namespace: dict[str, Any] = {"__builtins__": safe, "__name__": "blis_candidate"}
    exec(compile(tree, "<candidate>", "exec"), namespace)  # noqa: S102 - checked above
    return namespace


def compile_policy(fn: Any) -> Any:
    """The candidate's policy function as a bounds-checked nopython dispatcher (a plain
    function, or one the facade's njit already compiled)."""
    import numba
    from numba.core.registry import CPUDispatcher

    if isinstance(fn, CPUDispatcher):
        return fn
    if not isinstance(fn, types.FunctionType):
        raise RestrictedError(f"the policy must be a function defined by the candidate, "
                              f"not {type(fn).__name__}")
    return numba.njit(fn, boundscheck=True, cache=False)
