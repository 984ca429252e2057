"""Steps without work are counted, not taken (``kernels/engine/step.py: skip_idle_steps``).

A P/D decode instance whose KV is held by reservations for its own queue forms empty batches
until a timeout frees it; the reference takes every one of those steps (here ~3e6 one-µs
steps per second of timeout). blis_fast counts them instead, except where the queue's order
may change with time. With the FCFS scheduler the priority policy orders nothing, so a
``slo-based`` run (time-dependent priorities: every step taken) must give exactly what the
``constant`` run (idle steps counted) gives: the same outputs, step counts, queue sums and
KV-time integral, bit for bit.
"""

from __future__ import annotations

import numpy as np

import blis_fast
from blis_fast.kernels.engine.state import InstanceCounter

# found by the P/D invariant strategy: one shared pod whose decode reservations fill its KV
SPIN = dict(model="meta-llama/llama-3.1-8b-instruct", num_instances=5, prefill_instances=0,
            decode_instances=0, prefill_decode_instances=1, pd_decider="always",
            num_requests=10, rate=200.0, seed=723, routing_policy="weighted",
            prompt_tokens=300, prompt_tokens_stdev=200, prompt_tokens_min=1,
            prompt_tokens_max=900, output_tokens=60, output_tokens_stdev=50,
            output_tokens_min=1, output_tokens_max=200, pd_transfer_contention=True,
            total_kv_blocks=100, timeout=2, log="error")


def test_counted_idle_steps_equal_taken_ones(tmp_path):
    import polars as pl

    counted = blis_fast.run(output_dir=str(tmp_path / "counted"), **SPIN)
    taken = blis_fast.run(output_dir=str(tmp_path / "taken"), priority_policy="slo-based",
                          **SPIN)
    a, b = counted.simulation, taken.simulation
    skipped = a.counters[:, InstanceCounter.IDLE_SKIPPED]
    assert skipped.sum() > 1_000_000  # the reservation stall of the reference
    assert b.counters[:, InstanceCounter.IDLE_SKIPPED].sum() == 0
    assert np.array_equal(a.counters[:, InstanceCounter.STEPS],
                          b.counters[:, InstanceCounter.STEPS])
    assert np.array_equal(a.wait_queue_sum, b.wait_queue_sum)
    assert np.array_equal(a.kv_integral, b.kv_integral)  # added step by step: bit-identical
    assert np.array_equal(a.sim_ended_us, b.sim_ended_us)
    assert len(b.step_time) - len(a.step_time) == skipped.sum()
    for name in ("summary.parquet", "requests.parquet"):
        # requests.parquet's priority column is the policy's own value (0 under constant,
        # the wait in seconds under slo-based): the one column the two runs must differ in
        counted_file, taken_file = (pl.read_parquet(tmp_path / run / name).drop(
            "priority", strict=False) for run in ("counted", "taken"))
        assert counted_file.equals(taken_file), name
