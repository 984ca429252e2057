"""Each kernel is compiled once per argument *type*, never once per literal value.

Numba types a constant argument (``f(x, 0)``) and a loop counter before its loop is typed
(``i = 0``) as ``Literal[int](0)`` and compiles the callee for it: a whole extra compile of the
callee and everything it calls. ``blis_fast.kernels.jit`` makes calls between kernels type the
callee for unliteral arguments; this test runs a quick-start simulation (which also generates
its workload) and fails when any kernel holds a literal-typed specialization, compiled in this
process or found in its on-disk cache index.
"""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
from numba import njit
from numba.core import types
from numba.core.dispatcher import Dispatcher

import blis_fast.kernels
from blis_fast.api import run
from blis_fast.kernels.jit import njit as kernel_njit


def _kernel_dispatchers() -> list[tuple[str, Dispatcher]]:
    found = []
    for info in pkgutil.walk_packages(blis_fast.kernels.__path__, "blis_fast.kernels."):
        module = importlib.import_module(info.name)
        short = info.name.removeprefix("blis_fast.kernels.")
        for name, value in vars(module).items():
            if isinstance(value, Dispatcher) and value.py_func.__module__ == module.__name__:
                found.append((f"{short}.{name}", value))
    return found


def _signatures(disp: Dispatcher) -> list[tuple]:
    """Signatures compiled in this process and those in the kernel's on-disk cache index (a
    warm run loads the entry kernels only: their callees' specializations are on disk)."""
    sigs = list(disp.overloads)
    try:
        index = disp._cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 - no index yet (or an unreadable one): nothing on disk
        index = {}
    sigs.extend(key[0] for key in index)
    return sigs


def _literal(sigs: list[tuple]) -> list[tuple]:
    return [sig for sig in sigs if any(isinstance(t, types.Literal) for t in sig)]


def test_no_kernel_is_specialized_for_a_literal_value() -> None:
    run(model="meta-llama/llama-3.1-8b-instruct", num_requests=20)
    kernels = _kernel_dispatchers()
    assert len(kernels) > 100
    assert sorted(f"{name}{sig}" for name, disp in kernels
                  for sig in _literal(_signatures(disp))) == []


def test_the_check_sees_a_literal_specialization() -> None:
    """Plain numba.njit compiles a callee for Literal[int](3); the kernels' njit does not."""

    def twice(x, k):
        return x * k

    plain, kernel = njit(twice), kernel_njit(twice)

    @njit
    def call_plain(x):
        return plain(x, 3)

    @njit
    def call_kernel(x):
        return kernel(x, 3)

    assert call_plain(np.int64(2)) == call_kernel(np.int64(2)) == 6
    assert _literal(list(plain.overloads)) != []
    assert _literal(list(kernel.overloads)) == []
