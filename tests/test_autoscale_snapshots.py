"""The autoscaler under periodic snapshots, and which metrics blocks an autoscaled run prints
(issue 29 item 2), against runs of the August reference (``tests/autoscale_snapshots/``).

(a) A serving replica's snapshot starts empty and its KV group is first read when
``clock - 0 >= --snapshot-refresh-interval``; until then the reference's analyzer sees zero KV
capacity and leaves the replica out of supply and demand (AS-4.5..4.8). blis_fast used to read
the live capacity with the snapshot's (still zero) free-block count, so every replica looked
full and the t = 0 tick scaled up.
(b) The per-instance blocks print iff ``--num-instances`` > 1 (AS-7.4), not iff more than one
instance ran.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from parity import compare_stdout

import blis_fast
from blis_fast.kernels.cluster.autoscale import AsVar

HERE = Path(__file__).resolve().parent / "autoscale_snapshots"
MODEL = "meta-llama/llama-3.1-8b-instruct"
REFRESH_US = 100_000
TICK_US = 20_000
BLOCKS = 400
BLOCK_SIZE = 16
COMMON = dict(model=MODEL, latency_model="roofline", snapshot_refresh_interval=REFRESH_US,
              log="error")
LOAD = dict(rate=30, num_requests=120, prompt_tokens=512, output_tokens=128,
            total_kv_blocks=BLOCKS, seed=7)
TICKS_BEFORE_REFRESH = len(range(0, REFRESH_US, TICK_US))  # 0, 20, 40, 60, 80 ms


def _run(bundle: str, num_instances: int, log: str = "error", **load):
    return blis_fast.run(**{**COMMON, "log": log}, num_instances=num_instances,
                         policy_config=str(HERE / bundle), **(load or LOAD))


def _expected(name: str) -> str:
    return (HERE / f"{name}.stdout.txt").read_text()


def _blocks(stdout: str) -> list[str]:
    """The ``instance_id`` of each metrics block, in print order."""
    return [line.split('"')[3] for line in stdout.splitlines()
            if line.strip().startswith('"instance_id"')]


@pytest.mark.parametrize(("bundle", "kv_threshold", "name", "ids"), [
    ("pools-tick20ms.yaml", 0.8, "default-analyzer-2", (1, 2)),
    ("pools-tick20ms-analyzer.yaml", 0.6, "custom-analyzer-2", (1, 2)),
])
def test_replicas_not_yet_refreshed_are_left_out(bundle, kv_threshold, name, ids):
    """Two serving replicas, ticks every 20 ms, snapshots refreshed every 100 ms: the five
    ticks before 100 ms skip both replicas (the reference's ten analyzer warnings) and decide
    nothing; the later decisions see supply = replicas x 400 blocks x 16 x kv threshold; the
    run prints what the reference printed (two scale-ups, same per-instance counts)."""
    res = _run(bundle, 2)
    sim = res.simulation
    var = sim.fleet.var
    assert var[AsVar.SKIPPED_UNREFRESHED] == 2 * TICKS_BEFORE_REFRESH == 10
    assert var[AsVar.LAST_SKIP_AT] == (TICKS_BEFORE_REFRESH - 1) * TICK_US
    assert var[AsVar.SCALE_UPS] == len(ids)
    assert sim.instance_names[2:] == [f"autoscale-{MODEL}-{k:06d}" for k in ids]
    signals = sim.fleet_view.placed_by
    decided = signals.decision_time_us[2:]
    assert (decided >= REFRESH_US).all()
    serving = 2 + (decided[1] >= sim.fleet_view.ready_us[2])  # the first one loaded by then?
    per_replica = BLOCKS * BLOCK_SIZE * kv_threshold
    assert signals.supply_tokens[2:].tolist() == pytest.approx([2 * per_replica,
                                                                serving * per_replica])
    assert compare_stdout(res.stdout, _expected(name), head_extras=True) == []


def test_one_startup_instance_prints_only_the_cluster_block(caplog):
    """``--num-instances 1``: the reference adds three instances and still prints only the
    cluster block, which counts every request (blis_fast printed a block per instance). The
    five ticks that left instance_0 out are told in one warning."""
    with caplog.at_level(logging.WARNING, logger="blis_fast"):
        res = _run("pools-tick20ms.yaml", 1, log="warn")
    told = [r.getMessage() for r in caplog.records if "no KV capacity yet" in r.getMessage()]
    assert len(told) == 1
    assert "ticks up to t=0.080 s left out 5 serving replica observation(s)" in told[0]
    sim = res.simulation
    assert len(sim.instance_names) == 4
    assert sim.fleet.var[AsVar.SKIPPED_UNREFRESHED] == TICKS_BEFORE_REFRESH
    assert _blocks(res.stdout) == ["cluster"]
    assert sum(m["completed_requests"] for m in res.per_instance) == 120
    assert res.per_instance[0]["completed_requests"] < 120
    assert compare_stdout(res.stdout, _expected("default-analyzer-1"), head_extras=True) == []


def test_unplaced_startup_instance_keeps_the_per_instance_blocks():
    """``--num-instances 2`` on one GPU: only instance_0 exists, and the reference still
    prints its block before the cluster's, since the flag says more than one."""
    res = _run("one-gpu.yaml", 2, rate=10, num_requests=20, prompt_tokens=256,
               output_tokens=64, total_kv_blocks=BLOCKS, seed=7)
    assert res.simulation.instance_names == ["instance_0"]
    assert _blocks(res.stdout) == ["instance_0", "cluster"]
    assert compare_stdout(res.stdout, _expected("one-gpu-2"), head_extras=True) == []


def test_immediate_snapshots_skip_nothing():
    """With ``--snapshot-refresh-interval 0`` every tick reads the live KV group: no replica
    is ever left out, and no warning about it is given."""
    res = blis_fast.run(**{**COMMON, "snapshot_refresh_interval": 0}, num_instances=2,
                        policy_config=str(HERE / "pools-tick20ms.yaml"), **LOAD)
    assert res.simulation.fleet.var[AsVar.SKIPPED_UNREFRESHED] == 0
    assert res.simulation.fleet.var[AsVar.LAST_SKIP_AT] == -1
