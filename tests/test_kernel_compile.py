"""How kernels are compiled (``blis_fast/kernels/jit.py``): internal kernels are linked into
their callers as LLVM IR and never emitted as machine code of their own, a kernel compiled in a
later process links an internal kernel from the on-disk cache, and the cheaper comparison of
Numba's compile flags says what Numba's own comparison says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numba
from hypothesis import given, settings
from hypothesis import strategies as st
from numba.core.compiler import Flags

from blis_fast.kernels import gorand, jit

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
