"""Compile the simulation kernel in a second process while the first compiles the workload
generator, so a cold first run uses both cores (the two compilations are independent)."""

from __future__ import annotations

import numpy as np


def compile_engine() -> None:
    """Run a one-request simulation: the engine's kernels compile into Numba's on-disk cache."""
    from blis_fast.config.latency import LatencyConfig
    from blis_fast.config.policy_bundle import select_policies
    from blis_fast.engine.simulate import EngineConfig, run_engine
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
    cfg = EngineConfig(options=opts, latency=latency, policies=select_policies(opts, None))
    run_engine(table, cfg)


if __name__ == "__main__":
    compile_engine()
