"""Compile the simulation kernel in a second process while the first compiles the workload
generator, so a cold first run uses both cores (the two compilations are independent).

The event loop is one kernel whose compile types and compiles everything it calls, in an
order Numba chooses: the P/D handlers come last, 20-30 s into a cold compile. The first process
compiles them before the generator (:func:`compile_late_engine_parts`), so the second finds
them in the on-disk cache when it gets there instead of compiling them too. Should it get there
first, both compile them: the same machine code, only the time is lost."""

from __future__ import annotations

import warnings

import numpy as np


def compile_engine() -> None:
    """Run a one-request simulation: the engine's kernels compile into Numba's on-disk cache."""
    from blis_fast.engine.simulate import run_engine

    run_engine(*_one_request_run())


def compile_late_engine_parts() -> None:
    """Compile the kernels the event loop's compile reaches last (the P/D handlers and the
    routing and KV kernels they use) for the types the loop calls them with, into the on-disk
    cache; ``tests/test_warmup.py`` checks that the loop's compile then finds each of them
    there."""
    from numba.core import types
    from numba.core.errors import NumbaWarning

    from blis_fast.engine.simulate import event_loop_arguments
    from blis_fast.kernels import pd as pdk
    from blis_fast.kernels.event_loop import run_events

    with warnings.catch_warnings():
        # silent, as the second process is (the scorer table's first-class functions are
        # labelled experimental)
        warnings.simplefilter("ignore", NumbaWarning)
        arguments = event_loop_arguments(*_one_request_run())
        (cfg, inp, rs, ins, kv, _lg, rt, heap, work, hooks, _sess, pd, _asc) = (
            run_events.typeof_pyval(a) for a in arguments)
        t = r = types.int64  # an event's time and payload (the heap's int64 columns)
        # as the event loop calls them (kernels/event_loop.py: _on_routing, run_events)
        pdk.route_decode_first.compile((cfg, inp, rs, ins, kv, rt, heap, hooks, pd, t, r))
        pdk.on_prefill_routing.compile((inp, rs, ins, kv, rt, heap, hooks, pd, t, r))
        pdk.on_transfer_start.compile((inp, rs, kv, heap, work, pd, t, r))
        pdk.on_transfer_done.compile((cfg, inp, rs, ins, rt, heap, pd, t, r))


def _one_request_run() -> tuple:
    """A one-request workload and an engine configuration with the default policies."""
    from blis_fast.config.latency import LatencyConfig
    from blis_fast.config.policy_bundle import select_policies
    from blis_fast.engine.simulate import EngineConfig
    from blis_fast.kernels import latency as L
    from blis_fast.kernels.latency import Backend
    from blis_fast.options import RunOptions
    from blis_fast.workload.request_table import RequestTable

    table = RequestTable(
        arrival_us=np.array([0], np.int64), input_len=np.array([16], np.int64),
        output_len=np.array([2], np.int64), max_output_len=np.array([2], np.int64),
        deadline_us=np.array([0], np.int64), prefix_length=np.array([0], np.int64),
        client_idx=np.array([0], np.int32), chunk_offsets=np.array([0, 1], np.int64),
        chunk_digests=np.array([1], np.uint64), clients=[{}], block_size=16,
    )
    params = np.zeros(L.BB_SIZE, np.float64)
    params[L.BB_BETA0] = 1000.0
    opts = RunOptions(total_kv_blocks=8)
    latency = LatencyConfig(backend="blackbox", code=Backend.BLACKBOX, alpha=np.zeros(3),
                            beta=params.copy(), params=params, total_kv_blocks=8,
                            max_model_len=0, model="", gpu="", tp=0, vllm_version="")
    return table, EngineConfig(options=opts, latency=latency,
                               policies=select_policies(opts, None))


if __name__ == "__main__":
    compile_engine()
