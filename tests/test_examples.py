"""Every file under ``examples/`` runs, and does what its comments say (small sizes).

Workload specs go through ``--workload-spec``, policy bundles through ``--policy-config``, the
Python examples are imported and their entry points called. ``test_every_example_is_covered``
fails when a file is added to ``examples/`` without a test here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import blis_fast
from blis_fast.cli import main as cli_main
from blis_fast.config.policy_bundle import load_policy_bundle
from blis_fast.runner import RunResult

MODEL = "meta-llama/llama-3.1-8b-instruct"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = 200  # num_requests override that keeps every run well under a second

BUNDLES = ("epp-estimate-prefix.yaml", "epp-precise-prefix.yaml", "policy-config.yaml",
           "weighted-routing.yaml")
SINGLE_TURN_SPECS = ("inference-perf-shared-prefix.yaml", "prefix-affinity-demo.yaml",
                     "regression_workload_cache_warmup.yaml",
                     "regression_workload_load_spikes.yaml", "servegen-language.yaml")
MULTI_TURN_SPECS = ("multiturn-chat-demo.yaml", "regression_workload_multiturn.yaml")
SCRIPTS = ("custom_scorer.py", "evolve_scorer.py", "pd_split.py", "routing_comparison.py")
SWEEPS = ("sweep.yaml", "lora-sweep.yaml", "kv-offload-sweep.yaml")
LORA = ("lora-adapters.yaml", "lora-workload.yaml")  # the files lora-sweep.yaml runs
AUTOSCALE = ("autoscale-spike.yaml", "autoscale-fast.yaml", "autoscale-slow.yaml")
# run on a real sweep by tests/test_sweep_run.py (test_example_questions_script_answers_from_the_sweep)
SWEEP_SCRIPTS = ("sweep_questions.py",)


def _example(name: str) -> str:
    return str(EXAMPLES / name)


def _run(**options) -> RunResult:
    """One quiet run of the example model on 4 instances unless told otherwise."""
    options.setdefault("num_instances", 4)
    return blis_fast.run(model=MODEL, log="error", **options)


def _import_example(name: str) -> ModuleType:
    """Import ``examples/<name>`` as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{Path(name).stem}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _routed(result: RunResult, rows: np.ndarray | None = None) -> np.ndarray:
    """Requests routed to each instance (optionally only the selected rows)."""
    inst = result.simulation.instance
    if rows is not None:
        inst = inst[rows]
    return np.bincount(inst[inst >= 0], minlength=result.prepared.engine.options.num_instances)


# ------------------------------------------------------------------ the whole directory


def test_every_example_is_covered():
    present = {p.name for p in EXAMPLES.iterdir() if p.is_file()}
    covered = set(BUNDLES + SINGLE_TURN_SPECS + MULTI_TURN_SPECS + SCRIPTS + SWEEPS
                  + SWEEP_SCRIPTS + AUTOSCALE + LORA)
    assert present - covered == set(), "examples without a test in tests/test_examples.py"
    assert covered - present == set(), "tests for examples that no longer exist"


# ------------------------------------------------------------------ policy bundles


@pytest.mark.parametrize("name", BUNDLES)
def test_bundle_policies_are_the_ones_in_force(name):
    """The merged policies of a run with only the bundle are the bundle's own."""
    bundle = load_policy_bundle(_example(name))
    pol = _run(policy_config=_example(name), num_requests=20, rate=10).prepared.policies
    assert pol.routing == bundle.routing_policy
    assert list(pol.scorers) == bundle.scorers
    for got, want in ((pol.admission, bundle.admission_policy),
                      (pol.priority, bundle.priority_policy),
                      (pol.scheduler, bundle.scheduler)):
        assert want == "" or got == want


@pytest.mark.parametrize("name", ["epp-estimate-prefix.yaml", "epp-precise-prefix.yaml"])
def test_epp_profiles_gather_the_shared_prompt(name):
    """Their usage line: on the prefix demo the shared-prompt requests gather on one instance,
    where round-robin spreads them."""
    spec = _example("prefix-affinity-demo.yaml")
    res = _run(policy_config=_example(name), workload_spec=spec, trace_level="decisions",
               summarize_trace=True)
    assert "Target Distribution:" in res.stdout
    assert res.summary["completed_requests"] == SMALL
    shared = res.simulation.table.prefix_length == 256
    assert _routed(res, shared).max() > 0.8 * shared.sum()
    rr = _run(workload_spec=spec)
    assert _routed(rr, shared).max() < 0.4 * shared.sum()


def test_policy_config_token_bucket_rejects_a_burst():
    res = _run(policy_config=_example("policy-config.yaml"), rate=200, num_requests=300,
               trace_level="decisions", summarize_trace=True)
    rejected = res.simulation.rejected_admission
    assert 0 < rejected < 300
    assert f"  Rejected: {rejected}\n" in res.stdout
    assert res.summary["completed_requests"] == 300 - rejected
    # an explicit flag wins over the bundle
    assert _run(policy_config=_example("policy-config.yaml"), admission_policy="always-admit",
                rate=200, num_requests=300).simulation.rejected_admission == 0


def test_weighted_routing_usage_line(capsys):
    """Its usage line through the CLI: one shared 512-token prefix, prefix-affinity dominant."""
    cli_main(["run", "--model", MODEL, "--num-instances", "8", "--policy-config",
              _example("weighted-routing.yaml"), "--prefix-tokens", "512", "--rate", "40",
              "--num-requests", str(SMALL), "--log", "error", "--trace-level", "decisions",
              "--summarize-trace"])  # a failure would raise SystemExit
    out = capsys.readouterr().out
    assert f'"completed_requests": {SMALL}' in out
    # the cached prefix keeps every request on the instance that holds it
    assert "Unique Targets: 1\n" in out


# ------------------------------------------------------------------ workload specs


@pytest.mark.parametrize("name", SINGLE_TURN_SPECS + MULTI_TURN_SPECS)
def test_spec_runs_through_the_cli(name, capsys):
    cli_main(["run", "--model", MODEL, "--num-instances", "4", "--workload-spec",
              _example(name), "--num-requests", str(SMALL), "--log", "error"])
    out = capsys.readouterr().out
    assert '"completed_requests": 0' not in out and '"completed_requests"' in out


def test_inference_perf_expansion():
    res = _run(workload_spec=_example("inference-perf-shared-prefix.yaml"), num_requests=900)
    table = res.simulation.table
    assert res.summary["completed_requests"] == 900
    assert set(table.input_len.tolist()) == {100 + 447}
    assert set(table.output_len.tolist()) == {248}
    assert len({c["prefix_group"] for c in table.clients}) == 9
    assert len(table.clients) == 2 * 9 * 5


def test_inference_perf_runs_to_its_horizon_without_num_requests():
    """The spec's own bound: both stages, 600 s each, at 8 then 20 req/s."""
    table = _run(workload_spec=_example("inference-perf-shared-prefix.yaml"),
                 num_instances=16).simulation.table
    first = int((table.arrival_us < 600_000_000).sum())
    second = int((table.arrival_us >= 600_000_000).sum())
    assert table.arrival_us.max() < 1_200_000_000
    assert 8 * 600 * 0.9 < first < 8 * 600 * 1.1
    assert 20 * 600 * 0.9 < second < 20 * 600 * 1.1


def test_prefix_demo_mix():
    res = _run(workload_spec=_example("prefix-affinity-demo.yaml"))
    shared = res.simulation.table.prefix_length == 256
    assert 0.7 < shared.mean() < 0.9
    assert "standard:" in res.stdout and "batch:" in res.stdout


@pytest.mark.parametrize(("name", "groups"), [
    ("regression_workload_cache_warmup.yaml", {512, 384, 128}),
    ("regression_workload_load_spikes.yaml", {512, 384}),
])
def test_regression_prefix_groups(name, groups):
    res = _run(workload_spec=_example(name), num_requests=400)
    table = res.simulation.table
    assert res.summary["completed_requests"] > 0
    assert set(table.prefix_length.tolist()) == groups | {0}


def test_load_spikes_trap_prefix_only_routing():
    """Prefix-only routing sends the heavy half of the traffic to one instance."""
    spec = _example("regression_workload_load_spikes.yaml")
    prefix_only = _run(workload_spec=spec, num_requests=400, routing_policy="weighted",
                       routing_scorers="prefix-affinity:1")
    load_only = _run(workload_spec=spec, num_requests=400, routing_policy="weighted",
                     routing_scorers="load-balance:1")
    assert _routed(prefix_only).max() > 1.5 * _routed(load_only).max()


def test_servegen_language_tenants_and_network():
    res = _run(workload_spec=_example("servegen-language.yaml"))
    assert "tenant-A:" in res.stdout and "tenant-B:" in res.stdout
    assert "critical:" in res.stdout and "batch:" in res.stdout
    # the batch tenant's Pareto tail reaches far beyond the chat tenant's gaussian
    table = res.simulation.table
    batch = np.array([table.clients[c]["id"] == "high-volume-batch" for c in table.client_idx])
    assert 0.6 < batch.mean() < 0.8
    assert table.input_len[batch].max() > 2048


@pytest.mark.parametrize(("name", "rounds"), [("multiturn-chat-demo.yaml", 5),
                                              ("regression_workload_multiturn.yaml", 5)])
def test_multi_turn_sessions_continue(name, rounds):
    res = _run(workload_spec=_example(name), num_requests=SMALL)
    table = res.simulation.table
    round0 = int((table.round_index == 0).sum())
    assert table.n > round0
    assert len(table.extra_ids) == table.n - round0
    assert all(i.startswith("session_") for i in table.extra_ids)
    assert int(table.round_index.max()) == rounds - 1
    assert res.summary["completed_requests"] > round0


def test_multiturn_demo_sticky_routing_hits_the_cache():
    """Default weighted profile keeps sessions where their context is cached; load-only
    routing scatters them, so its cache hit rate is lower."""
    spec = _example("multiturn-chat-demo.yaml")
    sticky = _run(workload_spec=spec, num_requests=SMALL, routing_policy="weighted")
    scattered = _run(workload_spec=spec, num_requests=SMALL, routing_policy="weighted",
                     routing_scorers="queue-depth:1")
    hit = [float(np.mean(r.simulation.cache_hit_rate)) for r in (sticky, scattered)]
    assert hit[0] > hit[1]


# ------------------------------------------------------------------ Python examples


def test_routing_comparison_tables():
    mod = _import_example("routing_comparison.py")
    synthetic, prefix = mod.run_both(num_requests=400, rate=5000.0)
    rows = {r["config"]: r for r in synthetic.iter_rows(named=True)}
    assert len(rows) == len(mod.SYNTHETIC_CONFIGS)
    assert rows["round-robin"]["per_instance"] == [100] * 4
    for row in rows.values():
        assert sum(row["per_instance"]) == 400
    # the lagging KV signal skews the spread and the tail latency
    kv, qd = rows["weighted kv-utilization:1"], rows["weighted queue-depth:1"]
    assert max(kv["per_instance"]) - min(kv["per_instance"]) > \
        2 * (max(qd["per_instance"]) - min(qd["per_instance"]))
    assert kv["ttft_p99_ms"] > qd["ttft_p99_ms"]
    spread = {r["config"]: max(r["per_instance"]) for r in prefix.iter_rows(named=True)}
    assert spread["weighted prefix-affinity:5,queue-depth:1"] > 2 * spread["round-robin"]


def test_routing_comparison_main_prints_both_parts(capsys):
    _import_example("routing_comparison.py").main(["--num-requests", "100", "--rate", "1000"])
    out = capsys.readouterr().out
    assert "Part 1: 100 requests at 1000 req/s, 4 instances" in out
    assert "Part 2: prefix-affinity-demo.yaml" in out
    assert "kv-utilization:1" in out


def test_custom_scorer_example(capsys):
    _import_example("custom_scorer.py").main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" p99")[0].strip() for line in lines] == ["round-robin", "custom scorer"]
    rr, custom = (float(line.split(":")[1].split()[0]) for line in lines)
    assert custom < rr  # what its docstring promises


def test_evolve_scorer_example(capsys):
    """Its promise: the hand-written candidate beats the least-loaded starting point."""
    records = _import_example("evolve_scorer.py").main(num_requests=600)
    out = capsys.readouterr().out
    assert "least-loaded (starting point) fitness:" in out and "beat the baseline" in out
    assert records["prefix-and-load"]["fitness"] > records["least-loaded"]["fitness"] >= 0


# ------------------------------------------------------------------ sweeps


def test_sweep_example_expands_and_validates():
    """``examples/sweep.yaml``: 2 instance counts x 7 rates x 3 policies x 2 seeds, all valid."""
    from blis_fast.sweep.spec import load_sweep_plan

    plan = load_sweep_plan(EXAMPLES / "sweep.yaml")
    assert len(plan.configs) == 84
    values = [c.values for c in plan.configs]
    assert {v["routing_policy"] for v in values} == {"round-robin", "least-loaded", "weighted"}
    assert {v["num_instances"] for v in values} == {2, 4}
    assert len({c.config_id for c in plan.configs}) == 84
    one = plan.configs[0]
    res = blis_fast.run(**{**plan.run_kwargs(one), "num_requests": 50, "log": "error"})
    assert res.summary["completed_requests"] == 50


def test_lora_sweep_example_varies_capacity_and_bandwidth_and_writes_adapters(tmp_path):
    """``examples/lora-sweep.yaml``: capacity 1..8 x two load bandwidths x 2 seeds, all valid;
    shrunk to capacities 1 and 8 (200 requests), its per-adapter files obey the LoRA rules
    and match a single run's ``adapters.parquet``, and one slot for eight adapters costs TTFT."""
    import polars as pl
    import pyarrow.parquet as pq
    import yaml

    from blis_fast.sweep.run import run_sweep
    from blis_fast.sweep.spec import load_sweep_plan

    plan = load_sweep_plan(EXAMPLES / "lora-sweep.yaml")
    assert len(plan.configs) == 32
    values = [c.values for c in plan.configs]
    assert sorted({v["lora_adapter_capacity"] for v in values}) == list(range(1, 9))
    assert {v["lora_load_bandwidth_bytes_us"] for v in values} == {2.0e3, 2.0e4}

    spec = yaml.safe_load((EXAMPLES / "lora-sweep.yaml").read_text())
    for key in ("workload_spec", "lora_config"):
        spec["base"][key] = _example(spec["base"][key])
    spec["base"]["num_requests"] = SMALL
    spec["grid"] = {"lora_load_bandwidth_bytes_us": [2.0e3], "lora_adapter_capacity": [1, 8]}
    del spec["seeds"]
    small = tmp_path / "lora-sweep.yaml"
    small.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    run_sweep(small, out, workers=1)
    rows = pl.read_parquet(str(out / "summary" / "*.parquet")).sort("lora_adapter_capacity")
    assert rows["completed_requests"].to_list() == [SMALL, SMALL]
    one_slot, all_slots = rows["config_id"].to_list()
    parts = sorted(p.name for p in (out / "adapters").iterdir())
    assert parts == sorted(f"config_id={c}" for c in (one_slot, all_slots))
    adapters = pl.read_parquet(str(out / "adapters" / "*" / "*.parquet"),
                               hive_partitioning=True)
    names = [f"a{k}" for k in range(8)]
    for cid in (one_slot, all_slots):
        mine = adapters.filter(pl.col("config_id") == cid)
        cluster = mine.filter(pl.col("instance_id") == "cluster").sort("adapter")
        assert cluster["adapter"].to_list() == names
        per_instance = (mine.filter(pl.col("instance_id") != "cluster")
                        .group_by("adapter").agg(pl.col("load_count", "eviction_count").sum())
                        .sort("adapter"))
        assert per_instance["load_count"].to_list() == cluster["load_count"].to_list()
        assert per_instance["eviction_count"].to_list() == cluster["eviction_count"].to_list()
    inst = adapters.filter(pl.col("instance_id") != "cluster")
    full = inst.filter(pl.col("config_id") == all_slots)
    assert full["load_count"].max() == 1 and full["eviction_count"].sum() == 0  # all resident
    single = (inst.filter(pl.col("config_id") == one_slot).group_by("instance_id")
              .agg(pl.col("load_count", "eviction_count").sum()))
    # one slot: every load after an instance's first evicts the adapter before it
    assert (single["load_count"] == single["eviction_count"] + 1).all()
    assert single["load_count"].sum() > 10 * full["load_count"].sum()
    ttft = rows["ttft_p99_ms"].to_list()
    assert ttft[0] > 10 * ttft[1]
    # the sweep's file is the one blis run --output-dir writes for the same configuration
    config = next(c for c in plan.configs if c.values["lora_adapter_capacity"] == 1)
    blis_fast.run(**{**plan.run_kwargs(config), "lora_load_bandwidth_bytes_us": 2.0e3,
                     "num_requests": SMALL, "seed": 42, "output_dir": str(tmp_path / "run")})
    single_run = pq.read_table(tmp_path / "run" / "adapters.parquet")
    swept = pq.read_table(out / "adapters" / f"config_id={one_slot}" / "adapters.parquet")
    assert swept.equals(single_run)


def test_pd_split_finds_a_split_by_goodput(tmp_path, capsys):
    """examples/pd_split.py on a 4-GPU budget: every split and the ordinary cluster, goodput
    counted from completed requests within the SLOs, the best printed and plotted."""
    module = _import_example("pd_split.py")
    plot = tmp_path / "split.png"
    table = module.main(["--budget", "4", "--rate", "80", "--num-requests", str(SMALL),
                         "--plot", str(plot)])
    assert table["split"].to_list() == ["1P+3D", "2P+2D", "3P+1D", "ordinary"]
    assert (table["within_slo"] <= table["completed"]).all()
    assert (table["completed"] <= SMALL).all() and (table["goodput_per_gpu"] >= 0).all()
    best = table.sort("goodput_per_gpu", descending=True)["split"][0]
    assert f"best: {best} (" in capsys.readouterr().out
    assert plot.stat().st_size > 1000


# ------------------------------------------------------------------ autoscaling


def test_autoscale_spike_fast_policy_meets_the_slo_and_costs_less(tmp_path):
    """The headers' figures: the fast policy keeps p99 TTFT under 1 s, the slow one does not
    and, overshooting to every node, costs more."""
    import json

    out = {}
    for name in ("fast", "slow"):
        result = _run(num_instances=2, total_kv_blocks=2000,
                      workload_spec=_example("autoscale-spike.yaml"),
                      policy_config=_example(f"autoscale-{name}.yaml"),
                      metrics_path=str(tmp_path / f"{name}.json"))
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        out[name] = (doc["ttft_p99_ms"], doc["cost"]["cost_usd"], doc["cost"]["gpu_seconds"])
        assert "=== Cost ===" in result.stdout
    assert out["fast"][0] < 1000 < out["slow"][0]
    assert out["fast"][1] < out["slow"][1]
    assert round(out["fast"][2]) == 378 and round(out["slow"][2]) == 406


def test_kv_offload_sweep_example_answers_its_question(tmp_path):
    """``examples/kv-offload-sweep.yaml``: 8 CPU budgets x {no tier, NVMe} x 3 seeds, all valid;
    shrunk to one seed and the smallest and largest budgets, the hit rate grows with the CPU
    tier, an NVMe tier raises it at the smallest budget, and where the CPU tier never evicts
    the NVMe tier is only written to: the same run, metric for metric."""
    import polars as pl
    import yaml

    from blis_fast.sweep.run import run_sweep
    from blis_fast.sweep.spec import load_sweep_plan
    from blis_fast.sweep.store import metric_fields

    plan = load_sweep_plan(EXAMPLES / "kv-offload-sweep.yaml")
    assert len(plan.configs) == 48
    spec = yaml.safe_load((EXAMPLES / "kv-offload-sweep.yaml").read_text())
    spec["base"]["workload_spec"] = _example(spec["base"]["workload_spec"])
    spec["grid"]["kv_offload.cpu_bytes_to_use"] = [268435456, 34359738368]
    del spec["seeds"]
    small = tmp_path / "kv-offload-sweep.yaml"
    small.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    run_sweep(small, out, workers=1)
    rows = {(tuple(r["kv_tier_device_class"]), r["kv_offload.cpu_bytes_to_use"]): r
            for r in pl.read_parquet(str(out / "summary" / "*.parquet")).iter_rows(named=True)}
    assert len(rows) == 4 and all(r["error"] is None for r in rows.values())
    cpu, nvme = (), ("nvme_gen4",)
    assert rows[cpu, 268435456]["cache_hit_rate"] < rows[cpu, 34359738368]["cache_hit_rate"]
    assert rows[nvme, 268435456]["cache_hit_rate"] > rows[cpu, 268435456]["cache_hit_rate"]
    assert rows[nvme, 268435456]["kv_promotions"] > 0
    big_cpu, big_nvme = rows[cpu, 34359738368], rows[nvme, 34359738368]
    assert big_nvme["kv_cpu_evicted_blocks"] == 0 and big_nvme["kv_promotions"] == 0
    assert big_nvme["kv_tier_writes"] == [big_nvme["kv_cpu_mirrored_blocks"]]
    tier_columns = {"kv_tier_device_class", "kv_tier_reads", "kv_tier_writes",
                    "kv_tier_bytes_read", "kv_tier_bytes_written", "kv_tier_queue_wait_mean_ms"}
    for f in metric_fields():
        if f.name not in tier_columns:
            assert big_cpu[f.name] == big_nvme[f.name], f.name
