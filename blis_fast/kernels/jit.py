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
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import MethodType
from typing import Any

import numba
from numba.core import config, types

if "NUMBA_OPT" not in os.environ:
    config.OPT = config._OptLevel(2)
if "NUMBA_LOOP_VECTORIZE" not in os.environ:
    config.LOOP_VECTORIZE = False

PYTHON_CALLABLE: dict[str, frozenset[str]] = {
    # module (under blis_fast.kernels): kernels called from Python
    "event_loop": frozenset({"run_events", "push_cluster_arrivals"}),
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


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit`` with the kernel defaults above; used exactly like ``numba.njit``
    (``@njit``, ``@njit(cache=True, ...)``, ``@njit("sig", cache=True, ...)``)."""
    if len(args) == 1 and callable(args[0]) and not options:  # bare @njit
        wrappers = _options_for(args[0])
        fn = _cache_named_for_wrapper(args[0], wrappers)
        return _typed_without_literals(numba.njit(**wrappers)(fn))

    def decorate(fn: Callable[..., Any]) -> Any:
        wrappers = _options_for(fn)
        fn = _cache_named_for_wrapper(fn, wrappers)
        return _typed_without_literals(numba.njit(*args, **options, **wrappers)(fn))

    return decorate


def has_python_wrapper(kernel: Any) -> bool:
    """True when ``kernel`` (a dispatcher) can be called from Python."""
    return not kernel.targetoptions.get("no_cpython_wrapper", False)
