"""A cold first run (empty Numba cache) compiles the engine in two processes
(``blis_fast/engine/warmup.py``, ``compile_notice.py``) and prints what a warm run
prints; the part the first process compiles is exactly what the event loop's compile then finds
in the cache."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import blis_fast
from blis_fast.config.pd_mode import requested as pd_requested
from blis_fast.engine.simulate import engine_variant, event_loop_arguments
from blis_fast.engine.warmup import _one_request_run, compile_engine
from blis_fast.kernels.engine.event_loop import LORA_ARGUMENT, PD_ARGUMENT, run_events

ROOT = Path(blis_fast.__file__).resolve().parents[1]
QUICK_START = ROOT / "tests" / "reference_cases" / "cases" / "quickstart-llama31-8b"

COMPILED = '''
import sys
from numba.core import event

compiled = set()


class Compiles(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        if f.__module__.startswith("blis_fast."):  # one line: the kernel and its signature
            compiled.add(f"{f.__module__}.{f.__qualname__}|{ev.data['args']}".replace(" ", ""))

    def on_end(self, ev):
        pass


event.register("numba:compile", Compiles())
from blis_fast.engine import warmup
getattr(warmup, sys.argv[1])(**({"pd": True} if "--pd" in sys.argv else {}))
print("\\n".join(sorted(compiled)))
'''


def _names(compiled: set[str]) -> set[str]:
    return {line.partition("|")[0] for line in compiled}


def _compiled_by(step: str, cache: Path, tmp_path: Path, *flags: str) -> set[str]:
    """The blis_fast kernels a fresh process compiles (rather than loads) running ``step``,
    each with the signature it compiles for."""
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    done = subprocess.run([sys.executable, str(script), step, *flags], cwd=ROOT,
                          capture_output=True,
                          text=True, timeout=600, check=True,
                          env=dict(os.environ, NUMBA_CACHE_DIR=str(cache)))
    return set(done.stdout.split())


def _signature(arguments: tuple) -> tuple:
    return tuple(run_events.typeof_pyval(a) for a in arguments)


@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaExperimentalFeatureWarning")
def test_event_loop_arguments_are_the_loops_first_call() -> None:
    compile_engine()  # the one-request run: its loop call is compiled (or loaded) here
    arguments = event_loop_arguments(*_one_request_run())
    assert len(arguments) == 14
    assert _signature(arguments) in run_events.overloads
    assert arguments[PD_ARGUMENT] is None  # no P/D: its code is not compiled
    assert arguments[LORA_ARGUMENT] is None  # nor LoRA's


@pytest.mark.filterwarnings("ignore::numba.core.errors.NumbaExperimentalFeatureWarning")
@pytest.mark.parametrize("flags, pd", [
    ({}, False),
    ({"prefill_instances": 1, "decode_instances": 1, "num_instances": 2}, True),
    ({"prefill_decode_instances": 2, "num_instances": 2}, True),
    ({"prefill_instances": 1, "decode_instances": 2, "num_instances": 3,
      "routing_policy": "weighted", "pd_decider": "prefix-threshold"}, True),
])
def test_the_warm_up_compiles_the_variant_a_run_calls(flags: dict, pd: bool) -> None:
    """The second process compiles the loop for the very types a run of these flags calls it
    with, and the first process tells from the cache whether that variant is there."""
    from blis_fast.options import build_options
    from blis_fast.runner import prepare

    opts = build_options({"model": "meta-llama/llama-3.1-8b-instruct", "num_requests": 3,
                          "log": "error", **flags})
    assert pd_requested(opts) == pd
    with contextlib.redirect_stderr(io.StringIO()):
        prepared = prepare(opts)
    run = _signature(event_loop_arguments(prepared.table, prepared.engine))
    warm_up = _signature(event_loop_arguments(*_one_request_run(pd)))
    assert run == warm_up
    assert engine_variant(pd, False)(run) and not engine_variant(not pd)(run)
    assert not engine_variant(pd, True)(run)


def test_the_loops_compile_finds_the_late_parts_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    early = _compiled_by("compile_late_engine_parts", cache, tmp_path)
    assert {"blis_fast.kernels.cluster.routing.route", "blis_fast.kernels.cluster.admission.admit",
            "blis_fast.kernels.engine.latency.step_time.py", "blis_fast.kernels.kv.kv_chain.mirror_to_cpu",
            "blis_fast.kernels.cluster.routing.take_snapshots",
            "blis_fast.kernels.cluster.routing.refresh_cache_signal"} <= _names(early)
    assert not any(".pd." in name for name in _names(early))
    late = _compiled_by("compile_engine", cache, tmp_path)
    assert "blis_fast.kernels.engine.event_loop.run_events.py" in _names(late)
    # nothing compiled twice (a kernel for one signature): the loop's compile loaded them
    assert early & late == set()
    grown = _compiled_by("compile_python_called_engine_parts", cache, tmp_path)
    assert "blis_fast.kernels.engine.state.grow_step_log.py" in _names(grown)
    assert grown & (early | late) == set()


def test_the_pd_loops_compile_finds_the_pd_handlers_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    early = _compiled_by("compile_late_engine_parts", cache, tmp_path, "--pd")
    assert {"blis_fast.kernels.cluster.pd.route_decode_first", "blis_fast.kernels.cluster.pd.on_transfer_done",
            "blis_fast.kernels.cluster.pd.on_prefill_routing", "blis_fast.kernels.cluster.pd.on_transfer_start",
            "blis_fast.kernels.cluster.routing.route"} <= _names(early)
    late = _compiled_by("compile_engine", cache, tmp_path, "--pd")
    assert {"blis_fast.kernels.engine.event_loop.run_events.py",
            "blis_fast.kernels.cluster.pd.detect"} <= _names(late)
    assert early & late == set()


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
    assert done.stderr.count("compiling the simulation kernels") == 1
    assert "Traceback" not in done.stderr


class _CachedKernel:
    """A dispatcher as the notice sees it: signatures loaded in this process and in the
    cache's index (keys ``(signature, target, sources)``; ``stale`` ones were saved from other
    kernel sources, which the key Numba looks up now does not match)."""

    def __init__(self, loaded: list[tuple], indexed: list[tuple], stale: list[tuple] = ()
                 ) -> None:
        self.overloads = {signature: None for signature in loaded}
        index = {(signature, "cpu", "sources now"): "entry" for signature in indexed}
        index.update({(signature, "cpu", "sources before"): "entry" for signature in stale})
        self.targetctx = SimpleNamespace(codegen=lambda: "cpu")
        self._cache = SimpleNamespace(
            _cache_file=SimpleNamespace(_load_index=lambda: index),
            _index_key=lambda signature, codegen: (signature, codegen, "sources now"))


def test_the_notice_names_a_variant_missing_from_the_cache(monkeypatch, caplog) -> None:
    """A run whose variant is not compiled yet (the generator with sessions after a quick
    start, or cached from other kernel sources) is announced, once per process; a cached or
    loaded variant is not."""
    from numba.core import types

    from blis_fast import compile_notice

    with_sessions = lambda signature: signature[-1] != types.none  # noqa: E731
    without = (types.int64, types.none)
    monkeypatch.setattr(compile_notice, "_announced", False)
    with caplog.at_level("WARNING", logger="blis_fast"):
        compile_notice.announce_if_compiling(_CachedKernel([], [without]), with_sessions)
        compile_notice.announce_if_compiling(_CachedKernel([], []), with_sessions)
    assert [r.getMessage()[:32] for r in caplog.records] == ["compiling the simulation kernels"]
    monkeypatch.setattr(compile_notice, "_announced", False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="blis_fast"):
        compile_notice.announce_if_compiling(
            _CachedKernel([], [without], stale=[(types.int64, types.boolean)]), with_sessions)
    assert [r.getMessage()[:32] for r in caplog.records] == ["compiling the simulation kernels"]
    monkeypatch.setattr(compile_notice, "_announced", False)
    caplog.clear()
    with caplog.at_level("WARNING", logger="blis_fast"):
        compile_notice.announce_if_compiling(
            _CachedKernel([], [without, (types.int64, types.boolean)]), with_sessions)
        compile_notice.announce_if_compiling(
            _CachedKernel([(types.int64, types.boolean)], []), with_sessions)
    assert caplog.records == []
