"""How the kernels are compiled: every kernel module takes its ``njit`` from here.

A Numba-compiled function normally comes with two wrappers, a Python-callable one (which
unboxes every argument, every array of every NamedTuple state group) and a C-callable one,
each built, optimized and emitted to machine code at every cold compile; that is a fifth of
the quick start's compile. Most kernels are only ever called by other kernels, where neither
wrapper is used, so :func:`njit` compiles a kernel without them unless the kernel is named in
:data:`PYTHON_CALLABLE`, the one list of kernels that code outside ``blis_fast/kernels/``
(the package, the tests, the benchmarks) calls. ``tests/test_kernel_lint.py`` keeps the list
exact: a kernel called from outside must be in it, an entry nobody outside calls must go.
Calling a kernel missing from the list from Python fails at once ("no Python wrapper").
The C wrapper is never built: user hooks and scorers are ``cfunc``s, and no kernel is passed
as a first-class function.

A call from one kernel to another compiles the callee for the argument types with literal
values removed (:func:`_typed_without_literals`): Numba otherwise compiles a callee once per
literal argument it sees while typing (``f(x, 0)``, and a loop counter ``i = 0`` typed as
``Literal[int](0)`` before its loop is typed), each a whole extra compile of the callee and of
everything it calls. No kernel dispatches on a literal value (``numba.literally`` is not used);
``tests/test_kernel_specializations.py`` checks that no kernel holds a literal specialization.

Importing this module also sets how LLVM optimizes everything compiled in the process: O2
without the loop vectorizer, unless the user chose (``NUMBA_OPT``, ``NUMBA_LOOP_VECTORIZE``).
The kernels are branchy event code the vectorizer rarely helps. The compiled arithmetic is the
same at any level >= 1 (no kernel uses fastmath, so LLVM keeps IEEE semantics and never fuses
a multiply and an add); the cache key does not include the level, and a kernel cached at
another level is equally valid. O0 is not an option: Numba cannot cache code compiled at O0.

A kernel without a Python wrapper compiles into a linked-only library (:class:`_LinkedOnlyLibrary`):
its IR is linked into its callers and never optimized as a module nor emitted by itself; the
Python-callable kernel at the top of each call tree optimizes and emits the whole once
(:class:`_EmittedLibrary`). With the cheaper comparison of compile flags
(:func:`_compare_compile_flags_cheaply`) that took the engine's cold compile from ~55 to ~40 s
of CPU (``bench/startup.md``); ``tests/test_kernel_compile.py`` covers both.

A kernel compiles once across processes (:class:`_CacheClaimedAcrossProcesses`): a process
that misses the on-disk cache claims the kernel's signature before compiling it, and another
process needing it meanwhile waits and loads it from the cache. A cold run's two processes
(``engine/warmup.py``) and the workers of a cold parallel sweep split the compile that way.

Every cached kernel and ``cfunc`` is keyed by the sources of all kernel modules too, and of
the two leaves kernel code may import (:data:`FROZEN_LEAVES`;
:func:`_keyed_by_all_kernel_sources`): a cached kernel carries the code of the kernels it
calls and the constants it reads, which Numba's key (the kernel's own file) does not follow.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import MethodType
from typing import Any

import numba
from llvmlite import binding as llvm
from numba.core import codegen, compiler, config, targetconfig, types
from numba.core.environment import lookup_environment

try:
    import fcntl
except ImportError:  # not a POSIX system: kernels compile without claims
    fcntl = None

if "NUMBA_OPT" not in os.environ:
    config.OPT = config._OptLevel(2)
if "NUMBA_LOOP_VECTORIZE" not in os.environ:
    config.LOOP_VECTORIZE = False


def _compare_compile_flags_cheaply() -> None:
    """Make Numba's comparison of two sets of compile flags cost one dict comparison.

    Typing a call to any ``@overload`` function (``np.empty``, ``len``, ``min``, ...) looks up
    its implementation in a cache keyed by the current compile flags, and Numba hashes and
    compares flags through ``values()``, a fresh dict of all ~70 options, on every lookup: ~15 %
    of the engine's cold compile. The results are Numba's own: the hash is the value Numba
    computes (a hash of the sorted option *names*, one constant per flags class), and flags of
    one class compare equal when their explicitly set values are equal and unequal when the
    same options are set to different values, as ``values()`` would say; any other pair is
    left to Numba's comparison."""
    flags_class = targetconfig.TargetConfig
    if getattr(flags_class, "_blis_fast_cheap_compare", False):
        return
    numba_eq = flags_class.__eq__
    hash_by_class: dict[type, int] = {}

    def __eq__(self: Any, other: Any) -> Any:  # noqa: N807 - the method it replaces
        if type(self) is type(other):
            mine, theirs = self._values, other._values
            if mine == theirs:
                return True
            if mine.keys() == theirs.keys():
                return False
        return numba_eq(self, other)

    def __hash__(self: Any) -> int:  # noqa: N807 - the method it replaces
        cls = type(self)
        if cls not in hash_by_class:
            hash_by_class[cls] = hash(tuple(sorted(cls.options)))
        return hash_by_class[cls]

    flags_class.__eq__ = __eq__
    flags_class.__hash__ = __hash__
    flags_class._blis_fast_cheap_compare = True


# The levers below use Numba internals (checked on Numba 0.68); on a Numba whose internals
# differ they stay off and kernels compile the stock way (slower, same results), and
# tests/test_kernel_compile.py fails to tell the developers.
_NUMBA_INTERNALS_AS_EXPECTED = (
    hasattr(targetconfig.TargetConfig, "options")
    and "_values" in getattr(targetconfig.TargetConfig, "__slots__", ())
    and all(callable(getattr(codegen.JITCodeLibrary, name, None)) for name in (
        "_optimize_functions", "_optimize_final_module", "_finalize_final_module",
        "_finalize_dynamic_globals", "_verify_declare_only_symbols", "_get_module_for_linking",
        "serialize_using_object_code", "_unserialize", "enable_object_caching"))
    and callable(getattr(codegen.JITCPUCodegen, "_function_pass_manager", None))
    and hasattr(compiler.Compiler, "compile_extra")
)

if _NUMBA_INTERNALS_AS_EXPECTED:
    _compare_compile_flags_cheaply()

_ENV_PREFIX = "_ZN08NumbaEnv"  # how Numba names the global that points at a function's environment


class _LinkedOnlyLibrary(codegen.JITCodeLibrary):
    """The code library of an internal kernel: LLVM IR, optimized function by function, that
    its callers link in; never optimized as a whole module nor turned into machine code of its
    own. Only compiled callers call an internal kernel, and each carries a copy of its code,
    which the Python-callable kernel at the top optimizes as one module and emits once."""

    def _optimize_final_module(self) -> None:
        pass  # the caller at the top optimizes the linked module, this code included

    def _finalize_final_module(self) -> None:
        self._finalize_dynamic_globals()
        self._verify_declare_only_symbols()
        self._finalized = True

    def get_pointer_to_function(self, name: str) -> int:
        self._ensure_finalized()
        return 0  # no machine code, no wrapper: an internal kernel is not called from Python

    @property
    def codegen(self) -> Any:
        return _CodegenWithoutEnv(self._codegen)

    def serialize_using_object_code(self) -> tuple:
        """The cache entry keeps the IR, for callers to link (and no machine code)."""
        self._ensure_finalized()
        return (self.name, _LINKED_ONLY_KIND, self._final_module.as_bitcode())


_LINKED_ONLY_KIND = "blis_fast-linked-only-bitcode"  # the kind of an internal kernel's cache entry


def _load_linked_only_entries() -> None:
    """Make Numba load an internal kernel's cache entry as a linked-only library again (Numba
    would emit machine code for IR it loads); every other entry loads as Numba loads it."""
    library_class = codegen.JITCodeLibrary
    if getattr(library_class, "_blis_fast_linked_only_load", False):
        return
    numba_unserialize = library_class._unserialize.__func__

    def _unserialize(cls: type, numba_codegen: Any, state: tuple) -> Any:
        name, kind, data = state
        if kind != _LINKED_ONLY_KIND:
            return numba_unserialize(cls, numba_codegen, state)
        library = _LinkedOnlyLibrary(numba_codegen, name)
        library._final_module = llvm.parse_bitcode(data)
        library._finalize_final_module()
        return library

    library_class._unserialize = classmethod(_unserialize)
    library_class._blis_fast_linked_only_load = True


class _CodegenWithoutEnv:
    """Numba's codegen as an internal kernel's library shows it: setting the kernel's
    environment pointer is left to the machine code that carries it (:class:`_EmittedLibrary`)."""

    def __init__(self, numba_codegen: Any) -> None:
        self._numba_codegen = numba_codegen

    def set_env(self, env_name: str, env: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._numba_codegen, name)


class _EmittedLibrary(codegen.JITCodeLibrary):
    """The code library of a Python-callable kernel: machine code of the kernel and of every
    internal kernel it calls, optimized as one module, with their environment pointers set as
    Numba sets them when it loads the kernel from its cache (``CompileResult._rebuild``)."""

    def _optimize_functions(self, ll_module: Any) -> None:
        """No function-by-function passes over the kernel's own IR: the whole-module passes that
        follow run the same simplification over every function (the event loop's own function
        passes were 7 s of a cold compile; the code they gave ran no faster)."""
        ll_module.data_layout = self._codegen._data_layout

    def _finalize_final_module(self) -> None:
        super()._finalize_final_module()
        engine = self._codegen._engine
        for variable in self._final_module.global_variables:
            name = variable.name
            if name.startswith(_ENV_PREFIX) and engine.is_symbol_defined(name):
                env = lookup_environment(name)
                if env is not None:
                    self._codegen.set_env(name, env)


def _compiler_with_library(library_class: type) -> type:
    """Numba's compiler pipeline, building the kernel into a ``library_class`` library."""

    class KernelCompiler(compiler.Compiler):
        def compile_extra(self, func: Any) -> Any:
            if self.state.library is None:
                library = library_class(self.state.targetctx.codegen(), func.__qualname__)
                library.enable_object_caching()
                self.state.library = library
            return super().compile_extra(func)

    KernelCompiler.__name__ = KernelCompiler.__qualname__ = f"{library_class.__name__}Compiler"
    return KernelCompiler


if _NUMBA_INTERNALS_AS_EXPECTED:
    _load_linked_only_entries()
_LINKED_ONLY_COMPILER = _compiler_with_library(_LinkedOnlyLibrary)
_EMITTED_COMPILER = _compiler_with_library(_EmittedLibrary)

PYTHON_CALLABLE: dict[str, frozenset[str]] = {
    # module (under blis_fast.kernels): kernels called from Python
    "event_loop": frozenset({"run_events", "push_cluster_arrivals"}),
    "live_ops": frozenset({"abort_request", "route_to"}),
    "state": frozenset({"grow_event_heap", "grow_step_log"}),
    "step": frozenset({"itl_counts_from_marks"}),
    "generation": frozenset({"generate_kernel"}),
    "session_seeds": frozenset({"concurrency_kernel", "gather_two", "int63_sequence"}),
    "replay_tokens": frozenset({"replay_digests"}),
    "token_ids": frozenset({"draw_token_ids", "skip_token_ids"}),
    "samplers": frozenset({"sample_length", "sample_lengths", "sample_iats",
                           "normalized_exp_intervals"}),
    "hashing": frozenset({"block_digests", "chain_hash", "content_digest"}),
    "gosort": frozenset({"go_sort_slice_order"}),
    "gorand": frozenset({"new_source", "intn", "int63", "int63n", "int31", "int31n", "uint32",
                         "float64_", "exp_float64", "norm_float64"}),
    "gomath": frozenset({"fma", "go_cos", "go_exp", "go_f2i", "go_gamma", "go_log", "go_max",
                         "go_min", "go_pow", "go_round"}),
    "latency_profiled": frozenset({"gemm_seconds", "weight_gemm_seconds", "profiled_work",
                                   "step_floor_us"}),
    "latency": frozenset({"step_time", "queueing_time", "output_token_processing_time",
                          "post_decode_fixed_overhead", "is_known_backend", "clamp_to_int64",
                          "_rf_add_decodes", "_rf_dynamic_bytes", "_rf_flops"}),
    "heap": frozenset({"heap_push", "heap_pop", "make_tie", "tie_instance", "tie_is_instance"}),
    "kvcache": frozenset({"allocate", "append_decode_token_fast", "cached_blocks", "release",
                          "free_blocks", "used_blocks", "hit_rate", "reset_instance_blocks"}),
    "kv_blocks": frozenset({"free_append", "free_remove", "pop_free"}),
    "autoscale": frozenset({"activate", "build_instance", "place", "push_cluster_event",
                            "rebuild_routable", "start_instance"}),
}
"""The kernels with a Python wrapper, by module: those that Python code calls (tests
included: the KV, heap and latency kernels are tested directly)."""

_WITHOUT_C_WRAPPER = {"no_cfunc_wrapper": True}
_INTERNAL = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}


def _options_for(fn: Callable[..., Any]) -> dict[str, bool]:
    """The wrapper options of one kernel, from its module and name."""
    module = fn.__module__.rpartition(".")[2]
    return _WITHOUT_C_WRAPPER if fn.__name__ in PYTHON_CALLABLE.get(module, ()) else _INTERNAL


def _typed_without_literals(kernel: Any) -> Any:
    """Make calls to ``kernel`` from jitted code type (and compile) it for the arguments' base
    types: its dispatcher's ``get_call_template`` (the method Numba's typing asks for the
    callee's signature) gets the argument types unliteral. Only this dispatcher is changed."""
    resolve = kernel.get_call_template

    def get_call_template(self: Any, args: tuple, kws: dict) -> Any:
        return resolve(tuple(types.unliteral(a) for a in args),
                       {k: types.unliteral(v) for k, v in kws.items()})

    kernel.get_call_template = MethodType(get_call_template, kernel)
    return kernel


def _cache_named_for_wrapper(fn: Callable[..., Any], wrapper_options: dict[str, bool]
                             ) -> Callable[..., Any]:
    """``fn`` with a qualified name that tells its cache files apart by wrapper: Numba names a
    kernel's cache files after its qualified name and keys the entries by signature only, so a
    kernel that became Python-callable (a new entry in ``PYTHON_CALLABLE``, its own source
    unchanged) would load the wrapper-less machine code cached before, and calling it from
    Python crashes the process. Python-callable kernels cache under ``<name>.py``."""
    if wrapper_options is _WITHOUT_C_WRAPPER and not fn.__qualname__.endswith(".py"):
        fn.__qualname__ = f"{fn.__qualname__}.py"
    return fn


_CLAIM_WAIT_S = 600.0
"""How long a process waits for another to finish compiling a kernel before compiling it too."""


class _Claim:
    """One process's exclusive claim on compiling one kernel for one signature: an ``flock`` on
    a file beside the kernel's cache index (the system drops it should the process die)."""

    def __init__(self, path: str, fd: int, waited: bool) -> None:
        self.path, self.fd, self.waited = path, fd, waited

    def release(self) -> None:
        """Remove the claim file, then unlock (a process that opened it meanwhile sees it gone
        and claims a new one)."""
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)


def _claim(path: str) -> _Claim | None:
    """Claim ``path``, waiting while another process holds it; None when the file cannot be
    made (a read-only cache), without ``flock`` (not a POSIX system) or after
    :data:`_CLAIM_WAIT_S` s of waiting (compile anyway)."""
    if fcntl is None:
        return None
    waited_since = None
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            now = time.monotonic()
            waited_since = now if waited_since is None else waited_since
            if now - waited_since > _CLAIM_WAIT_S:
                logging.getLogger("blis_fast").debug("compiling %s without a claim", path)
                return None
            time.sleep(0.02)
            continue
        except OSError:
            os.close(fd)
            return None
        try:  # the holder removes the file before unlocking: lock the file that is there
            current = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            current = False
        if current:
            return _Claim(path, fd, waited_since is not None)
        os.close(fd)


class _CacheClaimedAcrossProcesses:
    """A kernel's on-disk cache whose misses are claimed across processes: of several
    processes that need the same kernel compiled at once (a cold run's two processes, the
    workers of a parallel sweep), one compiles it and the others wait and load it from the
    cache. Waits follow calls between kernels, which never form a cycle, so none waits
    forever."""

    def __init__(self, numba_cache: Any) -> None:
        self._numba_cache = numba_cache
        self._claims: dict[str, _Claim] = {}

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        """The cached kernel, or None after claiming its compile for this process."""
        loaded = self._numba_cache.load_overload(sig, target_context)
        key = str(sig)
        if loaded is not None or key in self._claims:
            return loaded
        digest = hashlib.sha1(key.encode()).hexdigest()[:16]
        claim = _claim(f"{self._numba_cache._cache_file._index_path}.{digest}.lock")
        if claim is None:
            return None
        if claim.waited:  # another process compiled it meanwhile
            loaded = self._numba_cache.load_overload(sig, target_context)
            if loaded is not None:
                claim.release()
                return loaded
        self._claims[key] = claim
        return None

    def release(self, sig: Any) -> None:
        """Release the claim on ``sig`` (after its compile saved it, or failed)."""
        claim = self._claims.pop(str(sig), None)
        if claim is not None:
            claim.release()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._numba_cache, name)


def _compiled_once_across_processes(kernel: Any) -> Any:
    """Give ``kernel`` (a cached dispatcher) a :class:`_CacheClaimedAcrossProcesses`."""
    if not hasattr(kernel._cache, "_cache_file"):  # not cached: nothing to share
        return kernel
    cache = kernel._cache = _CacheClaimedAcrossProcesses(kernel._cache)
    numba_compile = kernel.compile

    def compile(self: Any, sig: Any) -> Any:  # noqa: A001 - the method it wraps
        try:
            return numba_compile(sig)
        finally:
            cache.release(sig)

    kernel.compile = MethodType(compile, kernel)
    return kernel


FROZEN_LEAVES = ("gonum.py", "stored.py")
"""The only modules outside ``blis_fast/kernels/`` that kernel code may import (leaves that
import no other project module): ``gonum``'s int64 limits are frozen into compiled kernels and
``stored`` computes Go's seeding table the RNG kernels freeze, so both are part of every
kernel's cache key. ``tests/test_kernel_lint.py`` fails on any other import of the package
from kernel code (a constant defined above the kernels would be frozen into compiled code
that its edits never invalidate)."""


def kernel_sources_digest(folder: Path, leaves: tuple[str, ...] = FROZEN_LEAVES) -> str:
    """A digest of every Python source under ``folder`` (subpackages included: relative names
    and contents) and of the ``leaves`` in its parent folder: everything whose values a
    compiled kernel can hold."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*.py")):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    for name in leaves:
        leaf = folder.parent / name
        if leaf.is_file():
            digest.update(b"../" + name.encode() + b"\0" + leaf.read_bytes())
    return digest.hexdigest()


_KERNEL_SOURCES = kernel_sources_digest(Path(__file__).parent)
"""The digest of every kernel module and frozen leaf, part of every cached kernel's key."""


def _keyed_by_all_kernel_sources(kernel: Any) -> Any:
    """Key ``kernel``'s cache entries by every kernel module's source too. Numba keys an entry
    by the kernel's own file only, but a cached kernel carries the code of the kernels it calls
    (linked in): after an edit of a callee's module (a new slot layout, say) the caller would
    load stale code, wrong numbers or a crash. Now any kernel edit makes every kernel compile
    again, once."""
    if hasattr(kernel._cache, "_index_key"):  # cached (a NullCache has no key)
        numba_key = kernel._cache._index_key
        kernel._cache._index_key = lambda sig, codegen: (*numba_key(sig, codegen),
                                                         _KERNEL_SOURCES)
    return kernel


def cfunc(sig: Any, cache: bool = False, **options: Any) -> Any:
    """``numba.cfunc`` (the decorator's steps), its cache entries keyed by every kernel
    module's source as :func:`njit`'s are: a scorer carries the kernels it calls."""

    def decorate(fn: Callable[..., Any]) -> Any:
        from numba.core import sigutils
        from numba.core.ccallback import CFunc

        callback = CFunc(fn, sigutils.normalize_signature(sig), locals={}, options=options)
        if cache:
            callback.enable_caching()
            _keyed_by_all_kernel_sources(callback)
        callback.compile()
        return callback

    return decorate


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit`` with the kernel defaults above; used exactly like ``numba.njit``
    (``@njit``, ``@njit(cache=True, ...)``, ``@njit("sig", cache=True, ...)``)."""
    if len(args) == 1 and callable(args[0]) and not options:  # bare @njit
        return njit()(args[0])

    def decorate(fn: Callable[..., Any]) -> Any:
        wrappers = _options_for(fn)
        fn = _cache_named_for_wrapper(fn, wrappers)
        return _compiled_once_across_processes(_keyed_by_all_kernel_sources(
            _typed_without_literals(numba.njit(*args, **options, **wrappers,
                                               pipeline_class=_pipeline(wrappers))(fn))))

    return decorate


def _pipeline(wrappers: dict[str, bool]) -> type:
    """The compiler of a kernel: internal kernels are linked only, the others emitted."""
    if not _NUMBA_INTERNALS_AS_EXPECTED:
        return compiler.Compiler
    return _LINKED_ONLY_COMPILER if wrappers is _INTERNAL else _EMITTED_COMPILER


def has_python_wrapper(kernel: Any) -> bool:
    """True when ``kernel`` (a dispatcher) can be called from Python."""
    return not kernel.targetoptions.get("no_cpython_wrapper", False)
