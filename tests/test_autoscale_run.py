"""Autoscaled runs end to end (AS-2..AS-6): the traps of the reference reproduced and each one
warned about once, instance rows grown by restarting, and the invariants of issue 15 over
random autoscaler configurations (hypothesis)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.engine import fleet
from blis_fast.kernels.cluster.autoscale import AsInst, AsVar
from blis_fast.kernels.engine.state import InstanceCounter
from blis_fast.kernels.enums import InstanceKind, Lifecycle, Registration

MODEL = "meta-llama/llama-3.1-8b-instruct"
BASE = dict(model=MODEL, latency_model="roofline", snapshot_refresh_interval=0, log="warn")
LOAD = dict(rate=40, num_requests=160, prompt_tokens=600, output_tokens=300,
            total_kv_blocks=300)


def _bundle(tmp_path: Path, text: str, name: str = "bundle.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _pools(nodes: int, gpus: int = 1, extra: str = "", warm: bool = True,
           loading: float = 0.5, interval: float = 500000, down: float = 2e6) -> str:
    return f"""\
node_pools:
  - {{name: h100, gpu_type: H100, gpus_per_node: {gpus}, gpu_memory_gib: 80,
     initial_nodes: {nodes}, max_nodes: {nodes}}}
instance_lifecycle:
  loading_delay: {{mean: {loading}}}
  warm_start_initial_instances: {str(warm).lower()}
autoscaler:
  interval_us: {interval}
  scale_down_stabilization_window_us: {down}
{extra}"""


def _run(caplog, **kw):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="blis_fast"):
        res = blis_fast.run(**{**BASE, **kw})
    return res, [r.getMessage() for r in caplog.records]


def _one(messages: list[str], text: str) -> str:
    hits = [m for m in messages if text in m]
    assert len(hits) == 1, (text, messages)
    return hits[0]


def test_flag_alone_drains_every_instance_and_warns(caplog):
    """AS trap 2.1: the t = 0 tick sees an idle cluster and drains all; nothing recovers."""
    res, messages = _run(caplog, num_instances=3, model_autoscaler_interval_us=1e6, rate=10,
                         num_requests=30)
    sim = res.simulation
    assert sim.rejected_routing == 30
    assert [int(s) for s in sim.fleet.inst[:3, AsInst.STATE]] == [Lifecycle.DRAINING] * 3
    drained = _one(messages, "drained the last serving instance")
    assert "at t=0.000 s" in drained and "(instance_2)" in drained
    rejected = _one(messages, "request(s) were rejected at routing because no instance")
    assert rejected.startswith("30 request(s)")


def test_min_replicas_keeps_a_serving_instance(caplog, tmp_path):
    """Our extension: with min_replicas 1 the flag-only drain leaves the last instance (the
    bound is read even when the flag alone enables the autoscaler)."""
    res, messages = _run(caplog, num_instances=3, model_autoscaler_interval_us=1e6, rate=10,
                         num_requests=30,
                         policy_config=_bundle(tmp_path, "autoscaler:\n  min_replicas: 1\n"))
    states = res.simulation.fleet.inst[:3, AsInst.STATE].tolist()
    assert states == [Lifecycle.DRAINING, Lifecycle.DRAINING, Lifecycle.ACTIVE]
    assert res.simulation.rejected_routing == 0
    assert not [m for m in messages if "last serving instance" in m]


def test_scale_up_names_ids_and_counts_failed_placements(caplog, tmp_path):
    """Traps 2.2/2.3: autoscaled ids carry the model name; placements that find no GPU use
    up ids (gaps), each warned once with the count."""
    res, messages = _run(caplog, num_instances=2, policy_config=_bundle(tmp_path, _pools(3)),
                         **LOAD)
    sim = res.simulation
    var = sim.fleet.var
    assert var[AsVar.SCALE_UPS] == 1 and var[AsVar.FAILED_PLACEMENTS] > 0
    assert sim.instance_names[2] == f"autoscale-{MODEL}-000001"
    failed = _one(messages, "scale-up placement(s) found no free GPU")
    assert failed.startswith(f"autoscaler: {var[AsVar.FAILED_PLACEMENTS]} scale-up")
    assert "ids 000002.." in failed
    assert "contain the model name (e.g. autoscale-meta-llama/" in _one(messages, "model name")
    assert (res.requests.handled_by == 2).any()
    assert res.requests.instance_name(2) == f"autoscale-{MODEL}-000001"


def test_startup_instances_that_do_not_fit_are_never_built(caplog, tmp_path):
    """Trap 2.10: 4 startup instances on 2 GPUs: two are built, silently in the reference."""
    res, messages = _run(caplog, num_instances=4, rate=5, num_requests=20,
                         policy_config=_bundle(tmp_path, _pools(1, gpus=2, interval=0)))
    assert res.simulation.instance_names == ["instance_0", "instance_1"]
    assert len(res.per_instance) == 2
    assert "only 2 of the 4 startup instances (tp=1): instance_2..instance_3" in _one(
        messages, "startup instances")


def test_pools_with_room_and_no_autoscaler_match_the_fixed_fleet(tmp_path):
    """Twin check: warm start, enough GPUs, an explicit KV size and no autoscaler give the
    fixed fleet's outputs byte for byte."""
    kw = dict(BASE, num_instances=3, log="error", **LOAD)
    fixed = blis_fast.run(**kw)
    pooled = blis_fast.run(**kw, policy_config=_bundle(tmp_path, _pools(4, interval=0)))
    assert pooled.simulation.fleet is not None
    assert pooled.stdout == fixed.stdout


def test_fleet_rows_grow_by_restarting(monkeypatch, caplog, tmp_path):
    """A run that needs more instance rows than it started with restarts with twice as many
    and gives the same result (deterministic)."""
    kw = dict(num_instances=2, policy_config=_bundle(tmp_path, _pools(3)), **LOAD)
    ref, _ = _run(caplog, **kw)
    calls = []
    real = fleet.new_autoscale_state

    def tracking(setup, cfg, rows, n):
        calls.append(rows)
        return real(setup, cfg, rows, n)

    monkeypatch.setattr(fleet, "initial_rows", lambda cfg: cfg.options.num_instances)
    monkeypatch.setattr(fleet, "new_autoscale_state", tracking)
    grown, _ = _run(caplog, **kw)
    assert calls == [2, 4]
    assert grown.stdout == ref.stdout


def test_fixed_fleet_cost_when_priced():
    """GPU-seconds of a fixed fleet: every instance from 0 to the end of the run."""
    res = blis_fast.run(**BASE | dict(log="error", num_instances=2, rate=10, num_requests=20,
                                      gpu_hour_cost=2.0))
    end = res.simulation.counters[:, InstanceCounter.CLOCK].max() / 1e6
    assert res.stdout.endswith(f"=== Cost ===\nGPU-Seconds: {2 * end:.1f}\n  default: "
                               f"{2 * end:.1f}\nCost (USD): {2 * end / 3600 * 2.0:.4f}\n"
                               f"Cost per 1000 Completed Requests (USD): "
                               f"{2 * end / 3600 * 2.0 * 1000 / 20:.4f}\n")
    plain = blis_fast.run(**BASE | dict(log="error", num_instances=2, rate=10, num_requests=20))
    assert "=== Cost ===" not in plain.stdout


def test_scaling_timeline_and_cost_agree(tmp_path):
    """scaling.parquet: lifecycle rows in order, decisions after their window, and GPU-seconds
    equal to the sum of the instances' lifetimes (placement to termination or the end); a
    pool's gpu_hour_cost wins over the flag."""
    import json

    import polars as pl

    extra = "  scale_up_stabilization_window_us: 1000000\n"
    bundle = _pools(3, extra=extra).replace("max_nodes: 3}", "max_nodes: 3, gpu_hour_cost: 4}")
    out = tmp_path / "out"
    res = blis_fast.run(**BASE | LOAD | dict(log="error", num_instances=2, gpu_hour_cost=1.0,
                                             policy_config=_bundle(tmp_path, bundle),
                                             output_dir=str(out),
                                             metrics_path=str(tmp_path / "r.json")))
    rows = pl.read_parquet(out / "scaling.parquet")
    assert rows["time_us"].is_sorted()
    order = ["loading", "active", "draining", "terminated"]
    end = int(np.max(res.simulation.counters[:, InstanceCounter.CLOCK]))
    lifetime = 0.0
    for _name, grp in rows.group_by("instance", maintain_order=True):
        states = grp["state"].to_list()
        first = order.index(states[0])
        assert states == order[first:first + len(states)]
        gone = grp.filter(pl.col("state") == "terminated")["time_us"].to_list()
        lifetime += (min(gone[0], end) if gone else end) - grp["time_us"][0]
    ups = rows.filter(pl.col("reason") == "scale_up")
    assert ups.height >= 1
    assert ((ups["decision_time_us"] - ups["signal_since_us"]) >= 1_000_000).all()
    assert (ups["time_us"] >= ups["decision_time_us"]).all()
    summary = pl.read_parquet(out / "summary.parquet").row(0, named=True)
    assert summary["gpu_seconds"] == pytest.approx(lifetime / 1e6)
    assert summary["peak_replicas"] == rows["routable_after"].max()
    assert summary["scale_up_events"] == ups.height == res.simulation.fleet.var[AsVar.SCALE_UPS]
    assert summary["scale_down_events"] == rows.filter(pl.col("state") == "draining").height
    cost = json.loads((tmp_path / "r.json").read_text())["cost"]
    assert cost["gpu_seconds"] == pytest.approx(lifetime / 1e6)
    assert cost["cost_usd"] == pytest.approx(lifetime / 1e6 / 3600 * 4.0)
    assert res.stdout.splitlines()[-3] == "  h100: " + f"{lifetime / 1e6:.1f}"


def test_plot_scaling_draws_the_timeline(tmp_path):
    """``blis plot DIR --scaling``: replicas as in scaling.parquet, every request counted once
    in the rate series, a p99 TTFT per window with arrivals."""
    pytest.importorskip("matplotlib")
    import polars as pl

    from blis_fast.sweep.plot import plot_scaling

    out = tmp_path / "out"
    blis_fast.run(**BASE | LOAD | dict(log="error", num_instances=2, output_dir=str(out),
                                       policy_config=_bundle(tmp_path, _pools(3))))
    result = plot_scaling(out, window_s=2.0)
    rows = pl.read_parquet(out / "scaling.parquet")
    xs, ys = result.series["replicas"]
    assert ys.max() == rows["routable_after"].max() and ys[-1] == rows["routable_after"][-1]
    mids, rate = result.series["request_rate"]
    assert round(float(rate.sum()) * 2.0) == LOAD["num_requests"]
    assert np.isfinite(result.series["ttft_p99_ms"][1][rate > 0]).all()
    result.save(tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 1000


# ------------------------------------------------------------------ invariants


@st.composite
def autoscaled_runs(draw):
    nodes = draw(st.integers(1, 5))
    gpus = draw(st.integers(1, 2))
    tp = draw(st.sampled_from([1, 1, 2])) if gpus == 2 else 1
    extra = ""
    lo = draw(st.sampled_from([None, 1, 2]))
    hi = draw(st.sampled_from([None, 3, 4]))
    if lo is not None:
        extra += f"  min_replicas: {lo}\n"
    if hi is not None:
        extra += f"  max_replicas: {hi}\n"
    extra += (f"  scale_up_stabilization_window_us: {draw(st.sampled_from([0, 1e6]))}\n"
              f"  hpa_scrape_delay: {{mean: {draw(st.sampled_from([0, 0.3]))}, "
              f"stddev: {draw(st.sampled_from([0, 0.2]))}}}\n")
    bundle = _pools(nodes, gpus, extra=extra, warm=draw(st.booleans()),
                    loading=draw(st.sampled_from([0.0, 0.5, 2.0])),
                    interval=draw(st.sampled_from([2e5, 5e5, 1e6])),
                    down=draw(st.sampled_from([0, 1e6, 3e6])))
    kw = dict(num_instances=draw(st.integers(1, 3)), tp=tp,
              rate=draw(st.sampled_from([10, 40, 80])), num_requests=draw(st.integers(20, 120)),
              prompt_tokens=600, output_tokens=200, total_kv_blocks=300,
              routing_policy=draw(st.sampled_from(["round-robin", "least-loaded"])),
              seed=draw(st.integers(1, 1000)), log="error")
    return bundle, kw, lo, hi


@settings(max_examples=int(os.environ.get("AS_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(autoscaled_runs())
def test_invariants_over_random_autoscaler_configs(tmp_path, case):
    bundle, kw, lo, hi = case
    path = _bundle(tmp_path, bundle)
    res = blis_fast.run(**BASE | kw, policy_config=path)
    sim = res.simulation
    inst = sim.fleet.inst[: len(sim.instance_names)]
    n_req = sim.registered.shape[0]
    # conservation: every request is rejected or registered at exactly one instance, and each
    # instance's registered requests end in exactly one state
    c = sim.counters
    injected = np.bincount(sim.instance[sim.instance >= 0], minlength=c.shape[0])
    assert np.array_equal(injected, c[:, InstanceCounter.COMPLETED] + sim.still_queued
                          + sim.still_running + c[:, InstanceCounter.DROPPED]
                          + c[:, InstanceCounter.TIMED_OUT])
    rejected = np.isin(sim.registered, (Registration.REJECTED_ADMISSION,
                                        Registration.REJECTED_ROUTING))
    assert int(rejected.sum()) == sim.rejected_admission + sim.rejected_routing
    assert int(injected.sum()) + int(rejected.sum()) == n_req
    # routed only to an instance that was serving: ready <= routing time <= drain time
    routed = sim.instance >= 0
    at = np.asarray(sim.table.arrival_us)[:n_req][routed]
    target = sim.instance[routed]
    ready, drained = inst[target, AsInst.READY], inst[target, AsInst.DRAINED]
    assert (ready >= 0).all() and (ready <= at).all()
    assert ((drained < 0) | (at <= drained)).all()
    # lifecycle order and GPUs
    for row in inst:
        placed, rd, dr, term = (row[AsInst.PLACED], row[AsInst.READY], row[AsInst.DRAINED],
                                row[AsInst.TERMINATED])
        assert placed >= 0 and (rd < 0 or rd >= placed) and (dr < 0 or dr >= rd >= 0)
        assert term < 0 or term >= dr >= 0
        assert row[AsInst.STATE] in (Lifecycle.LOADING, Lifecycle.ACTIVE, Lifecycle.DRAINING,
                                     Lifecycle.TERMINATED)
    held = sim.fleet.gpu_owner >= 0
    live = inst[:, AsInst.STATE] != Lifecycle.TERMINATED
    assert int(held.sum()) == int((inst[live, AsInst.TP]).sum())
    # replica bounds (ours): Active + Loading within max after every placement
    if hi is not None:
        for t in inst[inst[:, AsInst.KIND] == InstanceKind.AUTOSCALED, AsInst.PLACED]:
            alive = (inst[:, AsInst.PLACED] <= t) & ((inst[:, AsInst.DRAINED] < 0)
                                                      | (inst[:, AsInst.DRAINED] > t))
            assert int(alive.sum()) <= max(hi, kw["num_instances"])
    if lo is not None:
        serving = (inst[:, AsInst.STATE] == Lifecycle.ACTIVE) | (
            inst[:, AsInst.STATE] == Lifecycle.LOADING)
        assert int(serving.sum()) >= min(lo, int((inst[:, AsInst.KIND] == 0).sum()))
    # per-instance clocks never go back: each instance's steps in time order
    for i in range(len(inst)):
        times = sim.step_time[sim.step_instance == i]
        assert (np.diff(times) >= 0).all()
    # determinism
    again = blis_fast.run(**BASE | kw, policy_config=path)
    assert again.stdout == res.stdout
    assert np.array_equal(again.simulation.fleet.inst, sim.fleet.inst)


@pytest.mark.parametrize("bad", ["-1", "nan"])
def test_negative_or_nan_interval_is_refused(bad):
    """Trap 2.4: the reference panics; blis refuses it (exit 2 through the CLI)."""
    with pytest.raises(blis_fast.BlisConfigError, match="--model-autoscaler-interval-us must be a"):
        blis_fast.run(model=MODEL, model_autoscaler_interval_us=bad, log="error")
