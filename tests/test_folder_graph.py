"""The package's folders import one way (issue 26): leaves at the bottom, then the kernels, the
registries and option rows, configuration and workloads, the engine, the outputs, the runner,
the API and the commands on top. A module may import its own folder and any folder of a lower
layer, never one of its own layer or above; the layers below are the only statement of the
allowed edges (docs/architecture.md draws them, checked below). Every import counts, at module level, inside a
function or under ``TYPE_CHECKING``: a function-level import hides an edge, it does not remove
it. Inside a folder the modules form no import cycle.

``PENDING_EDGES`` and ``PENDING_CYCLES`` list what does not keep the rule yet, each with why;
the tests fail when a listed breach is gone (remove its entry then), so the lists only shrink.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "blis_fast"
ROOT = "<root>"  # blis_fast/__init__.py, the package facade

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("gofmt",),  # Go's text formatting (%q, %g, %f): error messages and files
    ("gonum", "stored", "data", "version"),
    ("files", "cli_numbers", "compile_notice"),
    ("kernels",),
    ("run_options",),  # the typed RunOptions, generated from the option rows
    ("options",),
    ("policies",),
    ("cli_options", "run_options_codegen"),
    ("config",),
    ("workload",),
    ("engine",),
    ("output",),
    ("runner",),
    ("api",),
    (ROOT,),
    ("sweep", "observe"),
    ("serve",),  # a live fleet: it reads observe's prompt vocabulary
    ("calibrate", "profiling"),
    ("fit", "evolve", "testing"),
    ("cli",),
)
"""Bottom first. A folder (or top-level module) is named without ``blis_fast.``."""

PENDING_EDGES: dict[tuple[str, str], str] = {
}
"""(importer, imported) folder pairs that break the layering today, and why."""

PENDING_CYCLES: dict[frozenset[str], str] = {
}
"""Import cycles inside a folder (module sets), and why."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (REPO / rel).with_suffix(".py").is_file() or (REPO / rel / "__init__.py").is_file()


def imports_of(path: Path) -> list[tuple[str, int]]:
    """(imported package module, line) for every import of ``path``, wherever it stands."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            submodules = [f"{module}.{a.name}" for a in node.names
                          if _is_module(f"{module}.{a.name}")]
            targets = submodules or [module]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t.split(".")[0] == "blis_fast"]
    return found


def folder_of(module: str) -> str:
    """``kernels`` for ``blis_fast.kernels.engine.heap``, ``runner`` for ``blis_fast.runner``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def module_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        edges[_module_name(path)].update(t for t, _ in imports_of(path))
    return edges


def folder_breaches() -> dict[tuple[str, str], list[str]]:
    """Imports from a folder into its own layer or above, by (importer, imported) folder."""
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = folder_of(_module_name(path))
        for target, line in imports_of(path):
            dest = folder_of(target)
            if dest != source and layer[dest] >= layer[source]:
                found[(source, dest)].append(f"{path.relative_to(REPO)}:{line} {target}")
    return found


def cycles_inside_folders() -> list[frozenset[str]]:
    """Strongly connected module sets (of two or more) within one folder (Tarjan)."""
    edges = module_edges()
    graph = {m: {t for t in ts if t in edges and folder_of(t) == folder_of(m) and t != m}
             for m, ts in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_folder_has_a_layer():
    named = {name for names in LAYERS for name in names}
    folders = {folder_of(_module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert folders - named == set(), "give each new folder or top-level module a layer"
    assert len(named) == sum(len(names) for names in LAYERS)  # each named once


def test_folders_import_only_lower_layers():
    breaches = folder_breaches()
    unexpected = {pair: where for pair, where in breaches.items() if pair not in PENDING_EDGES}
    assert unexpected == {}
    kept = {pair for pair in PENDING_EDGES if pair not in breaches}
    assert kept == set(), "these pending edges are gone: remove them from PENDING_EDGES"


OUTPUT_KERNEL_IMPORTS: dict[str, str] = {
    "blis_fast.kernels.go.gosort": "go_sort_slice_order is a port of Go's sort.Slice (the order "
                                   "the reference writes per-request records in), not a layout",
}
"""Kernel modules the outputs may import, and why (issue 26 item 3)."""


def output_kernel_imports() -> list[str]:
    """Imports of ``blis_fast.kernels`` by modules under ``blis_fast/output`` beyond
    ``OUTPUT_KERNEL_IMPORTS``."""
    return [f"{path.relative_to(REPO)}:{line} {target}"
            for path in sorted((PACKAGE / "output").rglob("*.py"))
            for target, line in imports_of(path)
            if folder_of(target) == "kernels" and target not in OUTPUT_KERNEL_IMPORTS]


def test_outputs_read_the_result_not_kernel_layouts():
    """The outputs read ``SimulationResult`` through its named views (``engine/results.py``),
    never a kernel's buffer layout or codes: the engine layer is the one that knows them."""
    assert output_kernel_imports() == []
    used = {target for path in (PACKAGE / "output").rglob("*.py")
            for target, _ in imports_of(path)}
    assert set(OUTPUT_KERNEL_IMPORTS) <= used, "an exception is no longer used: remove it"


def test_no_import_cycle_inside_a_folder():
    cycles = set(cycles_inside_folders())
    assert cycles - set(PENDING_CYCLES) == set()
    assert set(PENDING_CYCLES) - cycles == set(), "fixed: remove from PENDING_CYCLES"


def render_layers() -> str:
    """The layers as docs/architecture.md draws them: top first, one layer a line."""
    return "\n".join(" · ".join(names) for names in reversed(LAYERS))


def test_the_architecture_page_draws_these_layers():
    page = (REPO / "docs" / "architecture.md").read_text()
    assert f"```\n{render_layers()}\n```" in page


def test_the_graph_checks_see_breaches(tmp_path, monkeypatch):
    """The checks find an upward import and a cycle in a package of the test's own."""
    pkg = tmp_path / "blis_fast"
    for folder in ("kernels", "engine"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "a.py").write_text("def f():\n    from blis_fast.engine import b\n")
    (pkg / "engine" / "b.py").write_text("from blis_fast.engine.c import x\n")
    (pkg / "engine" / "c.py").write_text("from . import b\nx = 1\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    assert set(folder_breaches()) == {("kernels", "engine")}
    (pkg / "output").mkdir()
    (pkg / "output" / "__init__.py").write_text("")
    (pkg / "output" / "pd.py").write_text("from blis_fast.kernels.a import f\n")
    assert output_kernel_imports() == ["blis_fast/output/pd.py:1 blis_fast.kernels.a"]
    assert cycles_inside_folders() == [frozenset({"blis_fast.engine.b", "blis_fast.engine.c"})]
