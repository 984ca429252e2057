"""How kernels are compiled (``blis_fast/kernels/jit.py``): internal kernels are linked into
their callers as LLVM IR and never emitted as machine code of their own, a kernel compiled in a
later process links an internal kernel from the on-disk cache, and the cheaper comparison of
Numba's compile flags says what Numba's own comparison says."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numba
from hypothesis import given, settings
from hypothesis import strategies as st
from numba.core.compiler import Flags

from blis_fast.kernels import jit
from blis_fast.kernels.go import gorand

BOOL_OPTIONS = sorted(name for name, option in Flags.options.items() if option.type is bool)


@st.composite
def flags(draw: st.DrawFn) -> Flags:
    """Flags with a drawn set of boolean options set explicitly (a default value included)."""
    f = Flags()
    for name in draw(st.lists(st.sampled_from(BOOL_OPTIONS[:6]), max_size=6, unique=True)):
        setattr(f, name, draw(st.booleans()))
    return f


@settings(max_examples=500, deadline=None)
@given(flags(), flags())
def test_flags_compare_and_hash_as_numba_defines_them(a: Flags, b: Flags) -> None:
    # Numba's definitions: equal when every option's value (set or default) is equal, and the
    # hash of the sorted option names (``TargetConfig.__eq__``/``__hash__``)
    assert (a == b) == (a.values() == b.values())
    assert (a != b) == (a.values() != b.values())
    assert hash(a) == hash(tuple(sorted(a.values())))
    if a == b:
        assert hash(a) == hash(b)


def test_flags_compare_with_other_objects_as_numba_does() -> None:
    f = Flags()
    assert f != "nopython"
    assert f != None  # noqa: E711 - the comparison under test
    assert f == Flags(f)


@numba.njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, pipeline_class=jit._LINKED_ONLY_COMPILER)
def _halve(x):
    return x // 2


@numba.njit(no_cfunc_wrapper=True, pipeline_class=jit._EMITTED_COMPILER)
def _halve_twice(x):
    return _halve(_halve(x))


def test_internal_kernels_are_linked_into_their_callers_not_emitted() -> None:
    assert _halve_twice(40) == 10
    (internal,) = _halve.overloads.values()
    (entry,) = _halve_twice.overloads.values()
    assert isinstance(internal.library, jit._LinkedOnlyLibrary)
    assert isinstance(entry.library, jit._EmittedLibrary)
    jit_engine = entry.library._codegen._engine
    assert not jit_engine.is_symbol_defined(internal.fndesc.mangled_name)
    assert jit_engine.is_symbol_defined(entry.fndesc.mangled_name)
    # the internal kernel's library holds its IR, which the caller linked (and here inlined)
    assert internal.fndesc.mangled_name in {f.name for f in internal.library.get_defined_functions()}


def test_numba_has_the_internals_the_levers_use() -> None:
    """On a Numba whose internals differ the levers stay off (kernels compile the stock way):
    this fails so the developers see it."""
    assert jit._NUMBA_INTERNALS_AS_EXPECTED
    from numba.core import targetconfig

    assert targetconfig.TargetConfig._blis_fast_cheap_compare
    assert jit.codegen.JITCodeLibrary._blis_fast_linked_only_load


def test_the_kernels_follow_the_wrapper_they_have() -> None:
    """Python-callable kernels are emitted, the others linked only (``jit._pipeline``)."""
    assert gorand.new_source._compiler.pipeline_class is jit._EMITTED_COMPILER
    assert gorand.seed_source._compiler.pipeline_class is jit._LINKED_ONLY_COMPILER


MODULE = '''
import numba
from blis_fast.kernels import jit

@numba.njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True,
            pipeline_class=jit._LINKED_ONLY_COMPILER)
def twice_plus_one(x):
    return 2 * x + 1

@numba.njit(cache=True, no_cfunc_wrapper=True, pipeline_class=jit._EMITTED_COMPILER)
def first(x):
    return twice_plus_one(x) + 1

@numba.njit(cache=True, no_cfunc_wrapper=True, pipeline_class=jit._EMITTED_COMPILER)
def second(x):
    return twice_plus_one(x) * 3
'''

SCRIPT = '''
import sys
import linked_only_case as m
from blis_fast.kernels import jit
name = sys.argv[1]
result = getattr(m, name)(5)
for overload in m.twice_plus_one.overloads.values():  # compiled here or loaded: IR only
    assert isinstance(overload.library, jit._LinkedOnlyLibrary), overload.library
print(result, sum(m.twice_plus_one.stats.cache_hits.values()),
      sum(getattr(m, name).stats.cache_hits.values()))
'''


def test_a_kernel_compiled_later_links_an_internal_kernel_from_the_cache(tmp_path: Path) -> None:
    """The cache keeps an internal kernel as IR: a new caller in another process links it."""
    (tmp_path / "linked_only_case.py").write_text(MODULE)
    (tmp_path / "script.py").write_text(SCRIPT)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))

    def run(name: str) -> list[int]:
        done = subprocess.run([sys.executable, str(tmp_path / "script.py"), name], env=env,
                              capture_output=True, text=True, timeout=300, check=True)
        return [int(v) for v in done.stdout.split()]

    # result, cache hits of the internal kernel, cache hits of the entry kernel
    assert run("first") == [12, 0, 0]  # everything compiled here, both kernels cached
    assert run("second") == [33, 1, 0]  # a new caller: the internal kernel comes from the cache
    assert run("first") == [12, 0, 1]  # the entry's machine code comes from the cache
    assert run("second") == [33, 0, 1]


CLAIM_MODULE = '''
import numba
from blis_fast.kernels import jit

def _add_three(x):
    return x + 3

# as kernels/jit.py: njit gives a kernel (callable from Python here) its claims
add_three = jit._compiled_once_across_processes(numba.njit(cache=True)(_add_three))
'''

CLAIM_SCRIPT = '''
import os, sys, time
from numba.core import event
import claim_case as m

compiled = []


class SlowCompile(event.Listener):
    """Holds the claim for 2 s: the other process must come while this one compiles."""

    def on_start(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__name__)
        time.sleep(2)

    def on_end(self, ev):
        pass


event.register("numba:compile", SlowCompile())
go = sys.argv[1]
while not os.path.exists(go):  # both processes start compiling together
    time.sleep(0.01)
print(m.add_three(4), "compiled" if compiled else "loaded")
'''


def test_two_processes_compile_a_kernel_once(tmp_path: Path) -> None:
    """Two processes that need the same uncompiled kernel at once: one compiles it, the other
    waits for its claim and loads it from the cache (``jit._CacheClaimedAcrossProcesses``)."""
    (tmp_path / "claim_case.py").write_text(CLAIM_MODULE)
    (tmp_path / "script.py").write_text(CLAIM_SCRIPT)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    go = tmp_path / "go"
    runs = [subprocess.Popen([sys.executable, str(tmp_path / "script.py"), str(go)], env=env,
                             stdout=subprocess.PIPE, text=True) for _ in range(2)]
    time.sleep(3)  # both imported and waiting
    go.touch()
    outputs = sorted(run.communicate(timeout=300)[0].split() for run in runs)
    assert [run.returncode for run in runs] == [0, 0]
    assert outputs == [["7", "compiled"], ["7", "loaded"]]
    assert not list((tmp_path / "cache").rglob("*.lock"))  # the claim file is gone


HOLDER = '''
import sys, time
from blis_fast.kernels import jit
claim = jit._claim(sys.argv[1])
print("held", flush=True)
time.sleep(600)
'''


def test_a_claim_dies_with_its_process_and_a_wait_has_an_end(tmp_path: Path,
                                                             monkeypatch) -> None:
    path = str(tmp_path / "kernel.nbi.0123.lock")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(jit, "_CLAIM_WAIT_S", 0.3)
        assert jit._claim(path) is None  # waited 0.3 s, then gives up: compile without it
    finally:
        holder.kill()
        holder.wait()
    claim = jit._claim(path)  # the system dropped the dead holder's lock
    assert claim is not None and not claim.waited
    claim.release()
    assert not os.path.exists(path)


def test_a_read_only_cache_compiles_without_a_claim(tmp_path: Path, monkeypatch) -> None:
    assert jit._claim(str(tmp_path / "missing-dir" / "k.lock")) is None
    monkeypatch.setattr(jit, "fcntl", None)  # no flock (not a POSIX system): no claims
    assert jit._claim(str(tmp_path / "k.lock")) is None


def test_every_cached_kernel_is_keyed_by_all_kernel_sources(tmp_path: Path) -> None:
    """A cached kernel carries the code of the kernels it calls, and Numba keys it by its own
    file only: the key holds the digest of every kernel module (subpackages included) and of
    the frozen leaves, so any such edit makes every kernel compile again instead of loading
    stale code."""
    from blis_fast.kernels.cluster import hooks

    codegen = gorand.new_source.targetctx.codegen()
    for cache in (gorand.new_source._cache, gorand.seed_source._cache,  # njit (both kinds)
                  hooks.no_scorer._cache):  # cfunc
        assert cache._index_key((), codegen)[-1] == jit._KERNEL_SOURCES
    kernels = tmp_path / "kernels"
    (kernels / "sub").mkdir(parents=True)
    for name in ("a.py", "b.py", "sub/c.py"):
        (kernels / name).write_text("x = 1\n")
    (tmp_path / "gonum.py").write_text("INT64_MAX = 1\n")
    (tmp_path / "unrelated.py").write_text("y = 1\n")
    seen = {jit.kernel_sources_digest(kernels)}
    for path, text in (("kernels/b.py", "x = 2\n"),  # a callee's edit changes every kernel's key
                       ("kernels/sub/c.py", "x = 2\n"),  # so does a subpackage's
                       ("gonum.py", "INT64_MAX = 2\n")):  # and a frozen leaf's
        (tmp_path / path).write_text(text)
        seen.add(jit.kernel_sources_digest(kernels))
    assert len(seen) == 4
    (tmp_path / "unrelated.py").write_text("y = 2\n")  # a Python-layer module is not frozen
    assert jit.kernel_sources_digest(kernels) in seen
    assert jit.kernel_sources_digest(Path(jit.__file__).parent) == jit._KERNEL_SOURCES
