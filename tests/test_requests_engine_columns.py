"""requests.parquet's per-request engine columns (schemas/requests.json version 3, issue 26
item 5): ``preemptions``, ``cached_prefix_tokens``, ``priority`` and ``slo_priority`` hold the
kernel's own per-request figures, and a ``blis replay`` re-runs from its Parquet provenance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml
from _cli import invoke

import blis_fast
from blis_fast.kernels.engine.state import InstanceCounter
from blis_fast.output.provenance import read_provenance
from blis_fast.policies.priority import DEFAULT_SLO_PRIORITY, SLO_PRIORITIES

MODEL = "meta-llama/llama-3.1-8b-instruct"


def _cluster_metric(stdout: str, key: str) -> int:
    """The cluster block's ``key`` in a run's stdout (its last metrics JSON object)."""
    blocks = []
    depth, start = 0, -1
    for k, ch in enumerate(stdout):
        if ch == "{":
            if depth == 0:
                start = k
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                blocks.append(json.loads(stdout[start:k + 1]))
    cluster = [b for b in blocks if b.get("instance_id") == "cluster"]
    assert len(cluster) == 1, stdout[-2000:]
    return int(cluster[0][key])


def _requests(out: Path) -> pl.DataFrame:
    return pl.read_parquet(out / "requests.parquet")


def test_preemptions_per_request_sum_to_the_runs_count(tmp_path: Path) -> None:
    """A small KV cache under a burst: requests are preempted, and each row's count adds up to
    the preemption count stdout prints (and to the instances')."""
    res = blis_fast.run(model=MODEL, num_instances=2, num_requests=80, rate=400.0,
                        total_kv_blocks=200, output_dir=str(tmp_path), log="error")
    req = _requests(tmp_path)
    total = _cluster_metric(res.stdout, "preemption_count")
    assert total > 0
    assert req["preemptions"].null_count() == 0
    assert int(req["preemptions"].sum()) == total
    assert int(req["preemptions"].max()) > 0
    assert int((req["preemptions"] == 0).sum()) > 0
    assert int(res.simulation.counters[:, InstanceCounter.PREEMPTIONS].sum()) == total
    assert int(np.asarray(res.requests.preemptions).sum()) == total  # the API's records too


def test_pd_parent_preemptions_count_both_sub_requests(tmp_path: Path) -> None:
    """P/D: a parent row reports its sub-requests' preemptions together, so the rows still sum
    to the run's count; its cached prefix and priority are its prefill sub-request's."""
    res = blis_fast.run(model=MODEL, num_instances=3, prefill_instances=1, decode_instances=2,
                        pd_decider="always", num_requests=60, rate=400.0, total_kv_blocks=150,
                        output_dir=str(tmp_path), log="error")
    req = _requests(tmp_path)
    total = _cluster_metric(res.stdout, "preemption_count")
    sim = res.simulation
    n = sim.table.n
    assert int(sim.preemptions.sum()) == total > 0
    # here every preempted sub-request's parent has a record (a parent still in flight at the
    # horizon would have none)
    assert int(req["preemptions"].sum()) == total
    split = req.filter(pl.col("disaggregated"))
    assert split.height > 0 and int(split["preemptions"].max()) > 0
    ids = np.array(sim.table.id_strings(), dtype=object)
    row_of = {rid: k for k, rid in enumerate(ids[:n])}
    for rid, pre, cached in zip(split["request_id"], split["preemptions"],
                                split["cached_prefix_tokens"], strict=True):
        r = row_of[rid]
        assert pre == sim.preemptions[r] + sim.preemptions[r + n]
        assert cached == sim.cached_prefix_tokens[r + n]


def _shared_prefix_spec(path: Path) -> Path:
    """One client whose requests all start with the same 256-token prefix (16 blocks)."""
    spec = {"version": "2", "seed": 7, "aggregate_rate": 2.0, "num_requests": 12,
            "clients": [{
                "id": "rag", "rate_fraction": 1.0, "prefix_group": "docs", "prefix_length": 256,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "gaussian", "params": {
                    "mean": 100, "std_dev": 20, "min": 40, "max": 200}},
                "output_distribution": {"type": "gaussian", "params": {
                    "mean": 20, "std_dev": 5, "min": 5, "max": 40}}}]}
    path.write_text(yaml.safe_dump(spec))
    return path


def test_cached_prefix_tokens_of_a_shared_prefix(tmp_path: Path) -> None:
    """One instance, a shared 256-token prefix, arrivals far apart: the first request finds
    nothing cached, every later one at least the prefix's 16 full blocks."""
    spec = _shared_prefix_spec(tmp_path / "spec.yaml")
    res = blis_fast.run(model=MODEL, num_instances=1, workload_spec=str(spec),
                        output_dir=str(tmp_path / "out"), log="error")
    req = _requests(tmp_path / "out").sort("arrival_us")
    cached = req["cached_prefix_tokens"].to_list()
    assert req.height == 12 and req["completed"].all()
    # the prefix is the only shared content: exactly its 16 blocks, once the first request
    # has written them
    assert cached == [0] + [256] * 11
    assert int(req["preemptions"].sum()) == 0
    assert res.simulation.cache_hit_rate[0] > 0

    # without a shared prefix nothing is cached
    plain = blis_fast.run(model=MODEL, num_instances=1, num_requests=8, rate=1.0,
                          output_dir=str(tmp_path / "plain"), log="error")
    assert plain.requests is not None
    assert _requests(tmp_path / "plain")["cached_prefix_tokens"].sum() == 0


@pytest.mark.parametrize("policy,sign", [("slo-based", 1.0), ("inverted-slo", -1.0),
                                         ("constant", 0.0)])
def test_priority_is_the_policys_value_at_the_last_admission(tmp_path: Path, policy: str,
                                                              sign: float) -> None:
    """slo-based: 1e-6 x the wait at the admitting step (= the scheduling delay) for a request
    admitted once; inverted-slo its negative; constant 0. slo_priority follows the SLO class
    map with the bundle's override."""
    spec = {"version": "2", "seed": 3, "aggregate_rate": 300.0, "num_requests": 60,
            "clients": [
                {"id": c or "unclassed", "slo_class": c, "rate_fraction": 1.0 / 3,
                 "arrival": {"process": "poisson"},
                 "input_distribution": {"type": "gaussian", "params": {
                     "mean": 300, "std_dev": 50, "min": 100, "max": 500}},
                 "output_distribution": {"type": "gaussian", "params": {
                     "mean": 50, "std_dev": 10, "min": 10, "max": 100}}}
                for c in ("critical", "batch", "")]}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "bundle.yaml").write_text("admission:\n  slo_priorities:\n    batch: 1\n")
    blis_fast.run(model=MODEL, num_instances=1, workload_spec=str(tmp_path / "spec.yaml"),
                  policy_config=str(tmp_path / "bundle.yaml"), priority_policy=policy,
                  scheduler="priority-fcfs", max_num_running_reqs=4,
                  output_dir=str(tmp_path / "out"), log="error")
    req = _requests(tmp_path / "out")
    once = req.filter(pl.col("scheduling_delay_ms").is_not_null()
                      & (pl.col("preemptions") == 0))
    assert once.height > 0
    delay_us = (once["scheduling_delay_ms"] * 1000).round().cast(pl.Int64).to_numpy()
    expected = sign * (1e-6 * delay_us.astype(np.float64))
    assert np.array_equal(once["priority"].to_numpy(), expected + 0.0)
    if sign:
        assert (delay_us > 0).any()  # a queue formed: the priorities are not all zero
    by_class = dict(zip(req["slo_class"], req["slo_priority"], strict=True))
    assert by_class == {"critical": SLO_PRIORITIES["critical"], "batch": 1,
                        "": DEFAULT_SLO_PRIORITY}


def test_replay_reruns_from_its_parquet_provenance(tmp_path: Path) -> None:
    """``blis replay`` writes its command and options into its Parquet files;
    ``blis_fast.rerun`` replays the same trace again to the same stdout and files."""
    trace = tmp_path / "t"
    blis_fast.run(model=MODEL, num_requests=30, rate=20.0, trace_output=str(trace),
                  log="error")
    out, again = tmp_path / "first", tmp_path / "again"
    first = invoke(["replay", "--model", MODEL, "--trace-header", f"{trace}.yaml",
                    "--trace-data", f"{trace}.csv", "--num-instances", "2",
                    "--output-dir", str(out), "--log", "error"])
    assert first.code == 0, first.stderr
    assert (out / "requests.parquet").is_file()
    prov = read_provenance(out / "requests.parquet")
    assert prov.command == "replay"
    assert prov.options["trace_data"] == f"{trace}.csv"
    rerun = blis_fast.rerun(out / "requests.parquet", output_dir=str(again))
    assert rerun.stdout == first.stdout
    names = sorted(p.name for p in out.glob("*.parquet"))
    assert names == sorted(p.name for p in again.glob("*.parquet"))
    for name in names:
        assert pq.read_table(out / name).equals(pq.read_table(again / name),
                                                check_metadata=True), name
