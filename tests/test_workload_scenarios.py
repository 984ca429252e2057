"""Built-in scenarios (WL-8.3): valid specs with the reference's client mix, usable by run."""

from __future__ import annotations

import numpy as np
import pytest

import blis_fast
from blis_fast.workload.generator import generate_workload
from blis_fast.workload.scenarios import SCENARIOS, write_scenario
from blis_fast.workload.spec_yaml import load_workload_spec
from blis_fast.workload.validate import validate_spec

MIX = {
    "bursty-traffic": {"bursty-client": 1.0},
    "unfair-tenants": {"low-priority-bulk": 0.9, "high-priority-realtime": 0.1},
    "prefix-heavy": {"shared-prefix": 0.8, "unique-prefix": 0.2},
    "mixed-slo": {"realtime": 0.33, "interactive": 0.34, "batch": 0.33},
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_round_trips_and_generates_its_mix(name, tmp_path):
    path = write_scenario(name, tmp_path / f"{name}.yaml", seed=5, rate=50.0)
    spec = load_workload_spec(str(path))
    validate_spec(spec)
    made = SCENARIOS[name](5, 50.0)
    assert [c.id for c in spec.clients] == [c.id for c in made.clients]
    assert spec.aggregate_rate == 50.0 and spec.seed == 5 and spec.category == "language"
    wl = generate_workload(spec, horizon=2**63 - 1, max_requests=20_000, block_size=16)
    table = wl.table
    assert table.n == 20_000
    ids = [c["id"] for c in table.clients]
    share = np.bincount(table.client_idx, minlength=len(ids)) / table.n
    for cid, expected in MIX[name].items():
        assert abs(share[ids.index(cid)] - expected) < 0.02, (cid, share)


def test_bursty_traffic_is_bursty(tmp_path):
    spec = load_workload_spec(str(write_scenario("bursty-traffic", tmp_path / "b.yaml")))
    wl = generate_workload(spec, horizon=2**63 - 1, max_requests=50_000, block_size=16)
    gaps = np.diff(wl.table.arrival_us).astype(np.float64)
    assert 3.0 < gaps.std() / gaps.mean() < 4.0  # gamma arrivals with CV 3.5


def test_prefix_heavy_shares_a_prefix(tmp_path):
    spec = load_workload_spec(str(write_scenario("prefix-heavy", tmp_path / "p.yaml")))
    wl = generate_workload(spec, horizon=2**63 - 1, max_requests=2_000, block_size=16)
    shared = wl.table.client_idx == [c["id"] for c in wl.table.clients].index("shared-prefix")
    assert set(wl.table.prefix_length[shared].tolist()) == {50}  # the default group prefix
    assert set(wl.table.prefix_length[~shared].tolist()) == {0}


def test_scenario_runs(tmp_path):
    path = write_scenario("mixed-slo", tmp_path / "m.yaml", rate=20.0, num_requests=300)
    res = blis_fast.run(model="meta-llama/llama-3.1-8b-instruct", workload_spec=str(path),
                        num_instances=2)
    assert res.summary["completed_requests"] == 300
    assert "=== Per-SLO Metrics ===" in res.stdout


def test_unknown_scenario(tmp_path):
    with pytest.raises(KeyError, match="unknown scenario 'nope'"):
        write_scenario("nope", tmp_path / "x.yaml")
