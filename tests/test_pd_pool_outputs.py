"""pools.parquet and summary.parquet's P/D columns: the same figures as the ``=== PD Metrics
===`` block, the P/D counters and requests.parquet aggregated by pool."""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.kernels.cluster.pd import ParentField, PDCounter
from blis_fast.output.pd import PD_SUMMARY_COLUMNS
from blis_fast.output.schemas import load_schema, schema_fields

MODEL = "meta-llama/llama-3.1-8b-instruct"


def _block(stdout: str) -> dict[str, str]:
    """The ``=== PD Metrics ===`` lines as label -> text after the colon."""
    text = stdout[stdout.index("=== PD Metrics ===\n"):]
    out = {}
    for line in text.splitlines()[1:]:
        if ":" not in line:
            break
        label, value = line.split(":", 1)
        out[label] = value.strip()
    return out


def _dist(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", text)}


def _check_against_counters(res) -> pl.DataFrame:
    """The invariants every P/D run keeps; returns the pools frame."""
    pools = res.pools_frame()
    cnt = res.simulation.pd.counters
    par = res.simulation.pd.par
    cfg = res.simulation.config
    p, d, s = cfg.pd.prefill, cfg.pd.decode, cfg.pd.shared
    assert pools["pool"].to_list() == [name for name, k in
                                       (("prefill", p), ("decode", d), ("shared", s)) if k]
    assert pools["instances"].sum() == p + d + s
    split = par[:, ParentField.FLAG] == 1
    assert pools["decode_sub_requests"].sum() == cnt[PDCounter.PARENTS] == split.sum()
    assert pools["prefill_sub_requests"].sum() == np.count_nonzero(
        split & (par[:, ParentField.PREFILL] >= 0))
    assert pools["transfers_received"].sum() == np.count_nonzero(
        split & (par[:, ParentField.T_XFER_DONE] > 0))
    assert pools["decode_completed"].sum() == cnt[PDCounter.DECODE_COMPLETED]
    assert pools["decode_timeouts"].sum() == cnt[PDCounter.DECODE_TIMED_OUT]
    assert pools["decode_kv_drops"].sum() == cnt[PDCounter.DROPPED_AT_DECODE_KV]
    assert pools["transfers_sent"].sum() >= pools["transfers_received"].sum()
    assert pools["kv_blocks_sent"].sum() >= pools["kv_blocks_received"].sum()
    assert (pools["kv_bytes_sent"] == (pools["kv_blocks_sent"] * cfg.pd.block_bytes)
            .round().cast(pl.Int64)).all()
    per_instance = {m["instance_id"]: m["completed_requests"] for m in res.per_instance}
    for row in pools.iter_rows(named=True):
        assert row["completed"] == sum(per_instance[i] for i in row["instance_ids"])
        assert 0.0 <= row["kv_mean_utilization"] <= row["kv_peak_utilization"] <= 1.0
    summary = res.summary_row
    assert summary["pd_decode_completed"] == cnt[PDCounter.DECODE_COMPLETED]
    assert summary["pd_dropped_at_decode_kv"] == cnt[PDCounter.DROPPED_AT_DECODE_KV]
    assert summary["pd_disaggregated_requests"] == pools["transfers_received"].sum()
    # the block's throughputs: the prefill (decode) row plus the shared row
    seconds = max(m["vllm_estimated_duration_s"] for m in res.per_instance)
    if seconds > 0:
        by = dict(zip(pools["pool"], pools["completed"], strict=True))
        assert summary["pd_prefill_throughput"] == pytest.approx(
            (by.get("prefill", 0) + by.get("shared", 0)) / seconds, rel=1e-12)
        assert summary["pd_decode_throughput"] == pytest.approx(
            (by.get("decode", 0) + by.get("shared", 0)) / seconds, rel=1e-12)
    if (par[split, ParentField.T_DONE] > 0).all():  # every parent in requests.parquet
        reqs = res.requests_frame()
        pool_of = {i: row["pool"] for row in pools.iter_rows(named=True)
                   for i in row["instance_ids"]}
        for column, key in (("decode_sub_requests", "decode_instance"),
                            ("prefill_sub_requests", "prefill_instance"),
                            ("local_requests", "handled_by")):
            rows = reqs if key != "handled_by" else reqs.filter(pl.col("pd_outcome") == "local")
            counted = rows[key].drop_nulls().replace_strict(pool_of).value_counts()
            assert dict(counted.iter_rows()) == {
                p: c for p, c in zip(pools["pool"], pools[column], strict=True) if c}, column
    if split.any():
        block = _block(res.stdout)
        assert int(block["Disaggregated Requests"]) == summary["pd_disaggregated_requests"]
        assert block["Prefill Throughput"] == f"{summary['pd_prefill_throughput']:.4f} sub-req/s"
        assert block["Decode Throughput"] == f"{summary['pd_decode_throughput']:.4f} sub-req/s"
    return pools


def test_pools_agree_with_the_block_and_requests(tmp_path):
    """1 prefill + 2 decode + 1 shared, contention on: every pool figure against the stdout
    block, the counters and requests.parquet grouped by pool."""
    res = blis_fast.run(model=MODEL, num_instances=4, prefill_instances=1, decode_instances=2,
                        prefill_decode_instances=1, pd_decider="always",
                        routing_policy="least-loaded", pd_transfer_contention=True,
                        num_requests=200, rate=40.0, output_dir=str(tmp_path), log="error")
    pools = _check_against_counters(res)
    assert pools.equals(pl.read_parquet(tmp_path / "pools.parquet"))
    assert pl.read_parquet_schema(tmp_path / "pools.parquet") == dict(
        zip(load_schema("pools").names, pl.from_arrow(load_schema("pools").empty_table())
            .dtypes, strict=True))
    by = {row["pool"]: row for row in pools.iter_rows(named=True)}
    assert by["prefill"]["prefill_sub_requests"] == 200 == by["prefill"]["transfers_sent"]
    assert by["decode"]["decode_completed"] + by["shared"]["decode_completed"] == 200
    assert by["prefill"]["itl_mean_ms"] is None and by["decode"]["itl_mean_ms"] > 0
    assert by["decode"]["prefill_ttft_mean_ms"] is None
    assert by["decode"]["gpus"] == 2 and by["decode"]["tp"] == 1
    # summary.parquet: the block's figures, typed (ms for the block's µs)
    summary = pl.read_parquet(tmp_path / "summary.parquet").row(0, named=True)
    block = _block(res.stdout)
    assert summary["pd_disaggregated_requests"] == int(block["Disaggregated Requests"]) == 200
    assert f"{summary['pd_load_imbalance_ratio']:.4f}" == block["Load Imbalance Ratio"]
    for label, prefix in (("Parent TTFT (us)", "pd_parent_ttft"),
                          ("KV Transfer Duration (us)", "pd_kv_transfer")):
        printed = _dist(block[label])
        for stat in ("mean", "p50", "p95", "p99"):
            assert f"{summary[f'{prefix}_{stat}_ms'] * 1e3:.1f}" == f"{printed[stat]:.1f}"
    assert summary["pd_peak_concurrent_transfers"] == int(block["Peak Concurrent Transfers"])
    assert f"{summary['pd_mean_transfer_queue_depth']:.4f}" == \
        block["Mean Transfer Queue Depth"]
    # requests.parquet aggregated by pool
    reqs = pl.read_parquet(tmp_path / "requests.parquet")
    pool_of = {i: row["pool"] for row in pools.iter_rows(named=True)
               for i in row["instance_ids"]}
    reqs = reqs.with_columns(
        pl.col("prefill_instance").replace_strict(pool_of, default=None).alias("prefill_pool"),
        pl.col("decode_instance").replace_strict(pool_of, default=None).alias("decode_pool"))
    pre = reqs.group_by("prefill_pool").agg(
        pl.len().alias("n"), pl.col("prefill_ttft_ms").mean().alias("mean"),
        pl.col("prefill_ttft_ms").quantile(0.5, "linear").alias("p50"),
        pl.col("prefill_ttft_ms").quantile(0.99, "linear").alias("p99"),
        pl.col("scheduling_delay_ms").quantile(0.99, "linear").alias("wait99"))
    for row in pre.iter_rows(named=True):
        pool = by[row["prefill_pool"]]
        assert pool["prefill_sub_requests"] == row["n"]
        assert pool["prefill_ttft_mean_ms"] == pytest.approx(row["mean"], rel=1e-12)
        assert pool["prefill_ttft_p50_ms"] == pytest.approx(row["p50"], rel=1e-12)
        assert pool["prefill_ttft_p99_ms"] == pytest.approx(row["p99"], rel=1e-12)
        assert pool["prefill_wait_p99_ms"] == pytest.approx(row["wait99"], abs=1e-9)
    dec = reqs.with_columns(
        (pl.col("arrival_us") + pl.col("decode_scheduling_delay_ms") * 1e3
         - pl.col("transfer_end_us")).alias("wait_us"),
        (pl.col("e2e_ms") - pl.col("decode_scheduling_delay_ms")).alias("own_e2e_ms"),
    ).group_by("decode_pool").agg(
        pl.len().alias("n"), (pl.col("pd_outcome") == "completed").sum().alias("done"),
        pl.col("kv_blocks_transferred").sum().alias("blocks"),
        (pl.col("wait_us").mean() / 1e3).alias("wait_mean"),
        (pl.col("wait_us").quantile(0.99, "linear") / 1e3).alias("wait99"),
        pl.col("own_e2e_ms").mean().alias("e2e_mean"))
    assert sorted(dec["decode_pool"].to_list()) == ["decode", "shared"]
    for row in dec.iter_rows(named=True):
        pool = by[row["decode_pool"]]
        assert pool["decode_sub_requests"] == row["n"] == pool["transfers_received"]
        assert pool["decode_completed"] == row["done"]
        assert pool["kv_blocks_received"] == row["blocks"]
        assert pool["decode_wait_mean_ms"] == pytest.approx(row["wait_mean"], abs=1e-6)
        assert pool["decode_wait_p99_ms"] == pytest.approx(row["wait99"], abs=1e-6)
        assert pool["decode_e2e_mean_ms"] == pytest.approx(row["e2e_mean"], rel=1e-9)


def test_pools_count_drops_and_timeouts(tmp_path):
    """A decode pool short of KV: its drops and timeouts are the counters' and
    requests.parquet's outcomes."""
    res = blis_fast.run(model=MODEL, num_instances=4, prefill_instances=3, decode_instances=1,
                        pd_decider="always", total_kv_blocks=900, num_requests=150, rate=40.0,
                        timeout=2, output_dir=str(tmp_path), log="error")
    pools = _check_against_counters(res)
    decode = pools.filter(pl.col("pool") == "decode").row(0, named=True)
    outcomes = dict(pl.read_parquet(tmp_path / "requests.parquet")["pd_outcome"]
                    .value_counts().iter_rows())
    assert decode["decode_kv_drops"] == outcomes["dropped_at_decode"] > 0
    assert decode["decode_timeouts"] == outcomes.get("decode_timed_out", 0)
    assert decode["kv_peak_utilization"] > 0.5
    summary = pl.read_parquet(tmp_path / "summary.parquet").row(0, named=True)
    assert summary["pd_dropped_at_decode_kv"] == decode["decode_kv_drops"]
    assert "Dropped at Decode KV: 0\n" in res.stdout  # the block keeps the reference's 0
    assert summary["pd_peak_concurrent_transfers"] is None  # no contention


def test_no_pools_file_without_pd(tmp_path):
    res = blis_fast.run(model=MODEL, num_requests=20, output_dir=str(tmp_path), log="error")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.parquet", "summary.parquet"]
    assert res.pools is None and res.pools_frame() is None
    summary = pl.read_parquet(tmp_path / "summary.parquet")
    assert summary.select(PD_SUMMARY_COLUMNS).null_count().row(0) == (1,) * len(
        PD_SUMMARY_COLUMNS)


def test_pd_summary_columns_are_in_the_schema():
    names = [f["name"] for f in schema_fields("summary")]
    start = names.index(PD_SUMMARY_COLUMNS[0])  # one block, in the module's order
    assert names[start:start + len(PD_SUMMARY_COLUMNS)] == list(PD_SUMMARY_COLUMNS)
    assert all(f["nullable"] for f in schema_fields("summary") if f["name"].startswith("pd_"))


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(prefill=st.integers(0, 2), decode=st.integers(0, 2), shared=st.integers(0, 2),
       extra=st.integers(0, 1),
       decider=st.sampled_from(["always", "never", "prefix-threshold"]),
       contention=st.booleans(), requests=st.integers(5, 40),
       policy=st.sampled_from(["least-loaded", "round-robin"]))
def test_pool_invariants(prefill, decode, shared, extra, decider, contention, requests, policy):
    """Over small layouts: pools sum to the P/D counters and give the block's figures."""
    if shared == 0 and (prefill == 0 or decode == 0):
        prefill, decode = max(prefill, 1), max(decode, 1)
    res = blis_fast.run(model=MODEL, num_instances=prefill + decode + shared + extra,
                        prefill_instances=prefill, decode_instances=decode,
                        prefill_decode_instances=shared, pd_decider=decider,
                        pd_transfer_contention=contention, routing_policy=policy,
                        num_requests=requests, rate=20.0, log="error")
    _check_against_counters(res)


def test_sweep_over_splits_carries_pd_columns(tmp_path):
    """``blis sweep`` varies the split (zip of pool sizes) and the link; its summary rows carry
    the P/D columns, its ``--requests`` output each configuration's pools."""
    from _sweep import invoke, summary, write_spec

    spec = write_spec(tmp_path, f"""\
base:
  model: {MODEL}
  num_instances: 4
  num_requests: 120
  rate: 40
  pd_decider: always
  routing_policy: least-loaded
zip:
  prefill_instances: [1, 2]
  decode_instances: [3, 2]
grid:
  pd_transfer_bandwidth: [25, 2]
""")
    out = tmp_path / "out"
    result = invoke(["sweep", str(spec), "--out", str(out), "--workers", "1", "--requests"])
    assert result.code == 0, result.stderr
    frame = summary(out)
    assert frame.height == 4 and frame["error"].null_count() == 4
    assert frame.select("prefill_instances", "decode_instances",
                        "pd_transfer_bandwidth").rows() == [
        (1, 3, 25.0), (2, 2, 25.0), (1, 3, 2.0), (2, 2, 2.0)]  # grid outside zip
    assert (frame["pd_disaggregated_requests"] == 120).all()
    assert (frame["pd_decode_completed"] == frame["completed_requests"]).all()
    # a slower link: longer transfers and a later first token, for either split
    for split in frame.partition_by("prefill_instances"):
        fast, slow = split.sort("pd_transfer_bandwidth", descending=True).rows(named=True)
        assert slow["pd_kv_transfer_mean_ms"] > 5 * fast["pd_kv_transfer_mean_ms"] > 0
        assert slow["pd_parent_ttft_mean_ms"] > fast["pd_parent_ttft_mean_ms"]
    # goodput per GPU against the split, from the sweep's own rows
    goodput = frame.with_columns(
        (pl.col("pd_decode_completed") / pl.col("gpu_seconds")).alias("per_gpu_s"))
    assert (goodput["per_gpu_s"] > 0).all()
    for row in frame.iter_rows(named=True):
        pools = pl.read_parquet(out / "pools" / f"config_id={row['config_id']}" /
                                "pools.parquet")
        assert pools["instances"].to_list() == [row["prefill_instances"],
                                                row["decode_instances"]]
        assert pools["transfers_received"].sum() == row["pd_disaggregated_requests"]
        assert pools["gpu_seconds"].sum() == pytest.approx(row["gpu_seconds"])


def test_per_pool_tp_counts_gpus(tmp_path):
    """--decode-tp 2: the decode and shared pools hold two GPUs an instance, in pools.parquet
    and in the run's GPU-seconds and cost; an instance outside the pools keeps --tp."""
    res = blis_fast.run(model=MODEL, num_instances=5, prefill_instances=1, decode_instances=2,
                        prefill_decode_instances=1, decode_tp=2, pd_decider="always",
                        routing_policy="least-loaded", num_requests=40, rate=20.0,
                        gpu_hour_cost=3.6, output_dir=str(tmp_path), log="error")
    pools = pl.read_parquet(tmp_path / "pools.parquet")
    assert pools.select("pool", "tp", "gpus").rows() == [
        ("prefill", 1, 1), ("decode", 2, 4), ("shared", 2, 2)]
    end_s = pools["gpu_seconds"][0]
    summary = pl.read_parquet(tmp_path / "summary.parquet").row(0, named=True)
    assert summary["gpu_seconds"] == pytest.approx((1 + 4 + 2 + 1) * end_s)  # + the idle one
    assert summary["cost_usd"] == pytest.approx(summary["gpu_seconds"] / 1000)
    assert f"GPU-Seconds: {summary['gpu_seconds']:.1f}\n" in res.stdout
