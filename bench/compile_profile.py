"""Where the engine's cold compile goes: compile it into an empty Numba cache and report the
process CPU time, the time LLVM spends in each phase and the kernels that cost the most.

usage: python bench/compile_profile.py [--top N]

The figures for issue 11's cold start (``bench/startup.md``). LLVM phases are timed by wrapping
three methods of Numba's CPU code library (per-function passes, whole-module passes, machine-code
emission); a kernel's exclusive time is its compile minus the compiles of the kernels it
triggered (Numba's ``numba:compile`` events). Instrumentation adds a few percent; compare runs of
this script with each other, not with an uninstrumented compile.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=25, help="kernels to list (default 25)")
    args = parser.parse_args(argv)
    if args.top < 1:
        print("compile_profile: --top must be >= 1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="blis-compile-profile-") as cache:
        os.environ["NUMBA_CACHE_DIR"] = cache  # before Numba is imported: an empty cache
        return _profile(args.top)


def _profile(top: int) -> int:
    from numba.core import codegen, event

    phases: dict[str, float] = collections.defaultdict(float)
    library_class = codegen.CPUCodeLibrary

    def timed(method_name: str, phase: str) -> None:
        original = getattr(library_class, method_name)

        def wrapper(self, *a, **k):
            started = time.process_time()
            try:
                return original(self, *a, **k)
            finally:
                phases[phase] += time.process_time() - started

        setattr(library_class, method_name, wrapper)

    timed("_optimize_functions", "LLVM per-function passes")
    timed("_optimize_final_module", "LLVM whole-module passes")
    timed("_finalize_final_module", "machine-code emission")

    class KernelTimes(event.Listener):
        """Inclusive and exclusive compile time of each kernel (process CPU seconds)."""

        def __init__(self) -> None:
            self.stack: list[list] = []
            self.exclusive: dict[str, float] = collections.defaultdict(float)
            self.inclusive: dict[str, float] = collections.defaultdict(float)

        def on_start(self, ev) -> None:
            self.stack.append([ev.data["dispatcher"].py_func.__qualname__, time.process_time(),
                               0.0])

        def on_end(self, ev) -> None:
            name, started, children = self.stack.pop()
            spent = time.process_time() - started
            self.inclusive[name] += spent
            self.exclusive[name] += spent - children
            if self.stack:
                self.stack[-1][2] += spent

    kernels = KernelTimes()
    event.register("numba:compile", kernels)
    started = time.process_time()
    from blis_fast.engine.warmup import compile_engine

    compile_engine()
    total = time.process_time() - started
    llvm = sum(phases.values())
    print(f"engine cold compile: {total:.1f} s CPU, {len(kernels.exclusive)} kernels compiled")
    for phase, seconds in phases.items():
        print(f"  {phase:28s} {seconds:6.1f} s")
    print(f"  {'Numba typing, lowering, rest':28s} {total - llvm:6.1f} s")
    print(f"{'exclusive s':>11s} {'inclusive s':>11s}  kernel")
    for name, seconds in sorted(kernels.exclusive.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:11.2f} {kernels.inclusive[name]:11.2f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
