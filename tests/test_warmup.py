"""A cold first run (empty Numba cache) compiles the engine in two processes
(``blis_fast/engine/warmup.py``, ``engine/compile_notice.py``) and prints what a warm run
prints; the part the first process compiles is exactly what the event loop's compile then finds
in the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import blis_fast
from blis_fast.engine.simulate import event_loop_arguments
from blis_fast.engine.warmup import _one_request_run, compile_engine
from blis_fast.kernels.event_loop import run_events

ROOT = Path(blis_fast.__file__).resolve().parents[1]
QUICK_START = ROOT / "tests" / "reference_cases" / "cases" / "quickstart-llama31-8b"

COMPILED = '''
import sys
from numba.core import event

compiled = set()


class Compiles(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        if f.__module__.startswith("blis_fast."):
            compiled.add(f"{f.__module__}.{f.__qualname__}")

    def on_end(self, ev):
        pass


event.register("numba:compile", Compiles())
from blis_fast.engine import warmup
getattr(warmup, sys.argv[1])()
print("\\n".join(sorted(compiled)))
'''


def _compiled_by(step: str, cache: Path, tmp_path: Path) -> set[str]:
    """The blis_fast kernels a fresh process compiles (rather than loads) running ``step``."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    done = subprocess.run([sys.executable, str(script), step], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, check=True,
                          env=dict(os.environ, NUMBA_CACHE_DIR=str(cache)))
    return set(done.stdout.split())


@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaExperimentalFeatureWarning")
def test_event_loop_arguments_are_the_loops_first_call() -> None:
    compile_engine()  # the one-request run: its loop call is compiled (or loaded) here
    arguments = event_loop_arguments(*_one_request_run())
    assert len(arguments) == 13
    assert tuple(run_events.typeof_pyval(a) for a in arguments) in run_events.overloads


def test_the_loops_compile_finds_the_late_parts_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    early = _compiled_by("compile_late_engine_parts", cache, tmp_path)
    assert {"blis_fast.kernels.pd.route_decode_first", "blis_fast.kernels.pd.on_transfer_done",
            "blis_fast.kernels.pd.on_prefill_routing", "blis_fast.kernels.pd.on_transfer_start",
            "blis_fast.kernels.routing.pick"} <= early
    late = _compiled_by("compile_engine", cache, tmp_path)
    assert "blis_fast.kernels.event_loop.run_events.py" in late
    assert early & late == set()  # nothing compiled twice: the loop's compile loaded them


def test_a_cold_first_run_prints_the_reference_quick_start(tmp_path: Path) -> None:
    """The newcomer's first run: an empty cache, the two-process compile, the notice on stderr
    and the reference's quick-start output on stdout."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", "from blis_fast.cli import console_main; "
                           "console_main()", "run", "--model", "meta-llama/llama-3.1-8b-instruct"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (QUICK_START / "stdout.txt").read_text()
    assert "compiling the simulation kernels" in done.stderr.splitlines()[0]
    assert "Traceback" not in done.stderr
