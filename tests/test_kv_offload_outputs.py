"""summary.parquet's KV columns (issue 32): the cache hit and thrashing rates every run has and
the offload chain's counts, checked against the report and the chain's own accounting."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

import blis_fast

CASES = Path(__file__).parent / "reference_cases" / "cases"
MODEL = "meta-llama/llama-3.1-8b-instruct"
ARGS = {"model": MODEL, "latency_model": "roofline", "snapshot_refresh_interval": 0}
OFFLOAD_COLUMNS = ("kv_cpu_mirrored_blocks", "kv_cpu_mirrors_skipped", "kv_cpu_evicted_blocks",
                   "kv_cpu_reloaded_blocks", "kv_promotions", "kv_promotions_refused",
                   "kv_deferrals", "kv_tier_device_class", "kv_tier_reads", "kv_tier_writes",
                   "kv_tier_bytes_read", "kv_tier_bytes_written", "kv_tier_queue_wait_mean_ms")


def _run(case: str, blocks: int, tmp_path: Path, offload: bool = True):
    d = CASES / case
    extra = {"kv_offload_config": str(d / "offload.yaml")} if offload else {}
    result = blis_fast.run(**ARGS, total_kv_blocks=blocks, workload_spec=str(d / "wl.yaml"),
                           output_dir=str(tmp_path), log="error", **extra)
    return result, pl.read_parquet(tmp_path / "summary.parquet").row(0, named=True)


def _printed(stdout: str, label: str) -> float:
    return float(re.search(rf"^{label}: ([0-9.]+)$", stdout, re.M).group(1))


def test_a_tiered_chain_reports_what_its_tiers_did(tmp_path):
    result, row = _run("kvo-class-with-latency-override", 260, tmp_path)
    block_bytes = result.simulation.config.kv_offload.per_block_bytes
    assert row["kv_tier_device_class"] == ["nvme_gen3"]
    # every block newly stored on the CPU tier is written through to the tier (KVO-4.4)
    assert row["kv_tier_writes"] == [row["kv_cpu_mirrored_blocks"]] and row["kv_tier_writes"][0] > 0
    assert row["kv_tier_bytes_written"] == [row["kv_tier_writes"][0] * block_bytes]
    # one read per promoted run, of whole blocks
    assert row["kv_tier_reads"] == [row["kv_promotions"]] and row["kv_promotions"] > 0
    assert row["kv_tier_bytes_read"][0] % block_bytes == 0
    assert row["kv_tier_bytes_read"][0] >= row["kv_tier_reads"][0] * block_bytes
    assert row["kv_tier_queue_wait_mean_ms"][0] >= 0
    # the report's rates, as printed (4 decimals), and the thrashing rate's definition (KVO-10.2)
    assert round(row["cache_hit_rate"], 4) == _printed(result.stdout, "Cache Hit Rate")
    assert round(row["kv_thrashing_rate"], 4) == _printed(result.stdout, "KV Thrashing Rate")
    attempted = row["kv_promotions"] + row["kv_promotions_refused"]
    assert row["kv_thrashing_rate"] == pytest.approx(row["kv_promotions_refused"] / attempted,
                                                     rel=1e-12)


def test_a_cpu_only_chain_has_no_tier_entries(tmp_path):
    result, row = _run("kvo-cpu-only-tiny-budget", 220, tmp_path)
    assert row["kv_tier_device_class"] == [] and row["kv_tier_writes"] == []
    assert row["kv_promotions"] == 0 and row["kv_thrashing_rate"] == 0.0
    assert row["kv_cpu_reloaded_blocks"] > 0
    # blocks stored minus blocks evicted is what the 40-block tier still holds
    held = row["kv_cpu_mirrored_blocks"] - row["kv_cpu_evicted_blocks"]
    assert 0 < held <= result.simulation.config.kv_offload.cpu_blocks
    assert round(row["cache_hit_rate"], 4) == _printed(result.stdout, "Cache Hit Rate")


def test_without_the_chain_its_columns_are_null(tmp_path):
    _result, row = _run("kvo-cpu-only-tiny-budget", 220, tmp_path, offload=False)
    assert all(row[c] is None for c in OFFLOAD_COLUMNS)
    assert row["cache_hit_rate"] is not None and row["kv_thrashing_rate"] == 0.0


REQUEST_CHAIN_COLUMNS = ("kv_promoted_blocks", "kv_deferrals", "kv_fetch_wait_ms")


def test_requests_carry_their_share_of_the_chain(tmp_path):
    """requests.parquet's kv_* columns (issue 32) add up to summary.parquet's counts, and the
    requests whose admission was deferred are the ones that waited."""
    _result, row = _run("kvo-class-with-latency-override", 260, tmp_path)
    req = pl.read_parquet(tmp_path / "requests.parquet")
    assert req["kv_cpu_reloaded_blocks"].sum() == row["kv_cpu_reloaded_blocks"]
    assert req["kv_deferrals"].sum() == row["kv_deferrals"] > 0
    waited = req.filter(pl.col("kv_fetch_wait_ms") > 0)
    assert waited.height > 0 and (waited["kv_deferrals"] > 0).all()
    assert req.filter(pl.col("kv_deferrals") == 0)["kv_fetch_wait_ms"].max() == 0.0
    # promotions landed blocks for the requests that fired them (the exact accounting is
    # property (g) of tests/test_kv_offload_invariants.py)
    assert req["kv_promoted_blocks"].sum() > 0


def test_request_kv_columns_are_null_without_the_tiers_they_describe(tmp_path):
    """No CPU tier: every kv_* request column is null; a chain with a CPU tier alone: reloads
    counted, the chain's records 0; --kv-cpu-blocks (April's tier): reloads only."""
    _run("kvo-cpu-only-tiny-budget", 220, tmp_path / "none", offload=False)
    req = pl.read_parquet(tmp_path / "none" / "requests.parquet")
    for c in ("kv_cpu_reloaded_blocks", *REQUEST_CHAIN_COLUMNS):
        assert req[c].null_count() == req.height > 0
    _result, row = _run("kvo-cpu-only-tiny-budget", 220, tmp_path / "cpu")
    req = pl.read_parquet(tmp_path / "cpu" / "requests.parquet")
    assert req["kv_cpu_reloaded_blocks"].sum() == row["kv_cpu_reloaded_blocks"] > 0
    assert all(req[c].null_count() == 0 and req[c].sum() == 0 for c in REQUEST_CHAIN_COLUMNS)
    d = CASES / "kvo-cpu-only-tiny-budget"
    blis_fast.run(**ARGS, total_kv_blocks=220, kv_cpu_blocks=40, workload_spec=str(d / "wl.yaml"),
                  output_dir=str(tmp_path / "april"), log="error")
    req = pl.read_parquet(tmp_path / "april" / "requests.parquet")
    assert req["kv_cpu_reloaded_blocks"].null_count() == 0
    assert req["kv_cpu_reloaded_blocks"].sum() > 0
    assert all(req[c].null_count() == req.height for c in REQUEST_CHAIN_COLUMNS)
