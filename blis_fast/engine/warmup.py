"""Compile the simulation kernel in a second process while the first compiles the workload
generator, so a cold first run uses both cores.

Kernels compile once across processes (``kernels/jit.py``: a process that needs a kernel
another is compiling waits for it and loads it from the cache), so the two processes split the
work: the second compiles the event loop and everything it calls, in the order Numba reaches
them; the first starts with what the loop reaches last (:func:`compile_late_engine_parts`:
routing, admission, the step time, CPU mirroring), then compiles the generator. The loop compiles for
the run's variant: P/D or not (``--pd``); without P/D its code is left out of the compile
(``kernels/engine/event_loop.py: run_events``)."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

import numpy as np

from blis_fast.compile_notice import announce, has_cached_overload, start_background_compile
from blis_fast.config.latency import LatencyConfig
from blis_fast.config.pd import PDConfig
from blis_fast.config.policy_bundle import select_policies
from blis_fast.engine.engine_config import EngineConfig
from blis_fast.engine.simulate import engine_variant, event_loop_arguments, run_engine
from blis_fast.kernels.cluster import admission as adm
from blis_fast.kernels.cluster import pd as pdk
from blis_fast.kernels.cluster import routing as rtk
from blis_fast.kernels.engine import latency as L
from blis_fast.kernels.engine.event_loop import run_events
from blis_fast.kernels.engine.latency import Backend, step_time
from blis_fast.kernels.engine.state import grow_event_heap, grow_step_log
from blis_fast.kernels.generation.generation import generate_kernel
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.options import RunOptions
from blis_fast.workload.request_table import RequestTable

log = logging.getLogger("blis_fast")


def compile_engine(pd: bool = False) -> None:
    """Compile the event loop (its P/D variant with ``pd``), then run a one-request simulation:
    the engine's kernels compile into Numba's on-disk cache, the loop first (the kernels the
    run calls before it are small, and the first process may be compiling them)."""
    from numba.core.errors import NumbaWarning

    run = _one_request_run(pd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaWarning)  # silent, as a run is
        run_events.compile(tuple(run_events.typeof_pyval(a)
                                 for a in event_loop_arguments(*run)))
    run_engine(*run)


def compile_python_called_engine_parts() -> None:
    """Compile the kernels the engine's Python side calls only when the step log or the
    event heap must grow (``engine/simulate.py: KernelRun``): a one-request run never does."""
    arguments = event_loop_arguments(*_one_request_run())
    typeof = run_events.typeof_pyval
    step_log, heap = arguments[5], arguments[7]
    grow_step_log.compile((typeof(step_log), typeof(1), typeof(1)))
    grow_event_heap.compile((typeof(heap), typeof(1)))


def compile_late_engine_parts(pd: bool = False) -> None:
    """Compile the kernels the event loop's compile reaches last (with ``pd`` the P/D handlers;
    routing, admission, the step's duration and CPU mirroring) for the types the loop calls
    them with, into the on-disk cache; ``tests/test_warmup.py`` checks that the loop's compile
    then finds each of them there."""
    from numba.core import types
    from numba.core.errors import NumbaWarning

    with warnings.catch_warnings():
        # silent, as the second process is (the scorer table's first-class functions are
        # labelled experimental)
        warnings.simplefilter("ignore", NumbaWarning)
        arguments = event_loop_arguments(*_one_request_run(pd))
        typeof = run_events.typeof_pyval
        i64 = types.int64  # times, rows, counts: the heap's and the config's int64 values
        if pd:  # as the loop calls them (kernels/engine/event_loop.py: _on_routing, run_events)
            cfg, inp, rs, ins, kv, _lg, rt, heap, work, hooks, _sess, pds, _asc, _lora = (
                typeof(a) for a in arguments)
            pdk.route_decode_first.compile((cfg, inp, rs, ins, kv, rt, heap, hooks, pds, i64,
                                            i64))
            pdk.on_prefill_routing.compile((inp, rs, ins, kv, rt, heap, hooks, pds, i64, i64))
            pdk.on_transfer_start.compile((inp, rs, kv, heap, work, pds, i64, i64))
            pdk.on_transfer_done.compile((cfg, inp, rs, ins, rt, heap, pds, i64, i64))
        cfg, inp, _rs, ins, kv, _lg, rt, _heap, work, hooks, _sess, _pd, _asc, _lora = arguments
        # as the loop calls them (kernels/engine/event_loop.py: _on_routing, _on_admission;
        # kernels/engine/step.py: run_step), the latest reached first
        rtk.route.compile((typeof(rt), typeof(kv), i64, typeof(inp.input_len[0]), i64,
                           typeof(cfg.instance_rank), typeof(inp.arrival[0]),
                           typeof(hooks.scorer_table), typeof(rt.routable), i64))
        adm.admit.compile((typeof(rt), i64, typeof(inp.input_len[0]), typeof(rt.routable), i64,
                           i64, typeof(inp.arrival[0]), typeof(hooks.admit), typeof(kv)))
        rtk.refresh_cache_signal.compile((typeof(rt), typeof(kv), i64))
        rtk.take_snapshots.compile((typeof(rt), typeof(ins), typeof(kv), i64,
                                    typeof(rt.routable), i64))
        kvc.mirror_to_cpu.compile((typeof(kv), i64, typeof(ins.batch[0]),
                                   typeof(ins.batch_len[0]), typeof(inp.input_len),
                                   typeof(work.chain)))
        step_time.compile((typeof(cfg.inst[0, 0]), typeof(cfg.latency_params[0]), i64,
                           typeof(work.progress), typeof(work.new_tokens),
                           typeof(work.input_len), typeof(work.output_len)))


def _one_request_run(pd: bool = False) -> tuple:
    """A one-request workload and an engine configuration with the default policies (and one
    prefill and one decode instance with ``pd``)."""
    table = RequestTable(
        arrival_us=np.array([0], np.int64), input_len=np.array([16], np.int64),
        output_len=np.array([2], np.int64), max_output_len=np.array([2], np.int64),
        deadline_us=np.array([0], np.int64), prefix_length=np.array([0], np.int64),
        client_idx=np.array([0], np.int32), chunk_offsets=np.array([0, 1], np.int64),
        chunk_digests=np.array([1], np.uint64), clients=[{}], block_size=16,
    )
    params = np.zeros(L.BB_SIZE, np.float64)
    params[L.BB_BETA0] = 1000.0
    opts = (RunOptions(total_kv_blocks=8, num_instances=2, prefill_instances=1,
                       decode_instances=1) if pd else RunOptions(total_kv_blocks=8))
    latency = LatencyConfig(backend="blackbox", code=Backend.BLACKBOX, alpha=np.zeros(3),
                            beta=params.copy(), params=params, total_kv_blocks=8,
                            max_model_len=0, model="", gpu="", tp=0, vllm_version="")
    return table, EngineConfig(options=opts, latency=latency,
                               policies=select_policies(opts, None),
                               pd=PDConfig(prefill=1, decode=1) if pd else None)


def notify_if_compiling(pd: bool = False) -> None:
    """Log one warning line when the simulation or workload kernels must be compiled first,
    and start compiling the engine (its P/D variant with ``pd``) in a second process while
    this one compiles the engine's parts the second would reach last, then the workload
    kernels; the first simulation waits for the second process
    (``compile_notice.finish_background_compile``)."""
    engine_ready = has_cached_overload(run_events, engine_variant(pd))
    if engine_ready and has_cached_overload(generate_kernel):
        return
    announce()
    if engine_ready:
        return
    second = subprocess.Popen(
        [sys.executable, "-m", "blis_fast.engine.warmup"] + (["--pd"] if pd else []),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start_background_compile(lambda: _finish_second_process(second))
    try:
        compile_late_engine_parts(pd)  # what the second process would compile last
    except Exception:  # noqa: BLE001 - a head start only: the second process compiles it all
        log.debug("compiling the late engine parts failed", exc_info=True)


def _finish_second_process(second: subprocess.Popen) -> None:
    """Let the second process finish writing the engine cache, compiling meanwhile what only
    the Python side calls (when buffers grow)."""
    try:
        compile_python_called_engine_parts()
    except Exception:  # noqa: BLE001 - a head start only: the run compiles what it needs
        log.debug("compiling the engine's growth kernels failed", exc_info=True)
    second.wait()


if __name__ == "__main__":
    compile_engine(pd="--pd" in sys.argv[1:])
