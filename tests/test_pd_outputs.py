"""requests.parquet's P/D columns: what happened to each disaggregated request, including the
outcomes the reference projects as if completed (README, known reference behaviour)."""

from __future__ import annotations

import numpy as np
import polars as pl

import blis_fast
from blis_fast.kernels.cluster.pd import PDCounter

MODEL = "meta-llama/llama-3.1-8b-instruct"
PD_COLUMNS = ["disaggregated", "pd_outcome", "prefill_instance", "decode_instance",
              "prefill_ttft_ms", "decode_scheduling_delay_ms", "transfer_start_us",
              "transfer_end_us", "kv_blocks_transferred", "transfer_concurrency"]


def test_pd_columns_tell_outcomes_apart(tmp_path):
    res = blis_fast.run(model=MODEL, num_instances=4, prefill_instances=3, decode_instances=1,
                        pd_decider="always", total_kv_blocks=900, num_requests=150, rate=40.0,
                        timeout=2, pd_transfer_contention=True, output_dir=str(tmp_path),
                        log="error")
    df = pl.read_parquet(tmp_path / "requests.parquet")
    cnt = res.simulation.pd.counters
    counts = dict(df["pd_outcome"].value_counts().iter_rows())
    assert counts.get("dropped_at_decode", 0) == cnt[PDCounter.DROPPED_AT_DECODE_KV] > 0
    assert counts.get("completed", 0) == cnt[PDCounter.DECODE_COMPLETED] > 0
    assert counts.get("decode_timed_out", 0) == cnt[PDCounter.DECODE_TIMED_OUT]
    assert df["disaggregated"].all() and df["prefill_instance"].is_in(
        ["instance_0", "instance_1", "instance_2"]).all()
    assert (df["decode_instance"] == "instance_3").all()
    moved = df.filter(pl.col("transfer_end_us").is_not_null())
    assert (moved["transfer_end_us"] > moved["transfer_start_us"]).all()
    assert (moved["transfer_concurrency"] >= 1).all()
    dropped = df.filter(pl.col("pd_outcome") == "dropped_at_decode")
    assert dropped["transfer_end_us"].is_null().all()
    # the reference's projection: a drop's E2E is the time to the drop (here 0)
    assert (dropped["e2e_ms"] == 0.0).all()


def test_pd_columns_are_null_without_pd(tmp_path):
    blis_fast.run(model=MODEL, num_requests=20, output_dir=str(tmp_path), log="error")
    df = pl.read_parquet(tmp_path / "requests.parquet")
    assert df.height == 20
    for name in PD_COLUMNS:
        assert df[name].is_null().all(), name


def test_local_requests_in_a_pd_run(tmp_path):
    blis_fast.run(model=MODEL, num_instances=3, prefill_instances=1, decode_instances=2,
                  pd_decider="never", num_requests=30, rate=10.0, output_dir=str(tmp_path),
                  log="error")
    df = pl.read_parquet(tmp_path / "requests.parquet")
    assert (df["pd_outcome"] == "local").all() and (~df["disaggregated"]).all()
    assert df["transfer_start_us"].is_null().all()
    assert np.isin(df["handled_by"].to_numpy(), ["instance_1", "instance_2"]).all()


def test_replay_runs_pd_like_run(tmp_path):
    """``blis replay`` of a run's own trace with the same P/D flags disaggregates the same
    requests on the same pools (the trace carries arrivals and lengths)."""
    import contextlib
    import io

    from blis_fast.options import build_options
    from blis_fast.runner import execute_replay

    pd_flags = {"num_instances": 3, "prefill_instances": 1, "decode_instances": 2,
                "pd_decider": "always", "log": "error"}
    trace = tmp_path / "trace"
    run = blis_fast.run(model=MODEL, num_requests=30, rate=10.0, trace_output=str(trace),
                        **pd_flags)
    with contextlib.redirect_stderr(io.StringIO()):
        res = execute_replay(build_options({"model": MODEL, "trace_header": f"{trace}.yaml",
                                            "trace_data": f"{trace}.csv", **pd_flags}))
    cnt = res.simulation.pd.counters
    assert cnt[PDCounter.PARENTS] == 30 == cnt[PDCounter.XFER_COMPLETED]
    # replay's horizon (twice the last arrival) can cut the last decodes
    s = res.summary
    assert s["injected_requests"] == 30 == s["completed_requests"] + s["still_running"]
    assert s["completed_requests"] == cnt[PDCounter.DECODE_COMPLETED] >= 25
    assert "=== PD Metrics ===\nDisaggregated Requests: 30\n" in res.stdout
    # the exported trace marks them incomplete (reference behaviour), the replay still runs them
    assert run.stdout.count("Disaggregated Requests: 30") == 1
