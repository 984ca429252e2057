"""Running sweeps: the same rows whichever backend runs them, typed columns, errors, manifest.

The reference is the sweep run in this process (``--workers 1``); two local worker processes and
a local Ray instance must give the same rows and byte-identical summary files.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from _sweep import MODEL, REPO_ROOT, SMALL_SPEC, invoke, summary, write_spec

import blis_fast
from blis_fast.sweep.run import default_chunk_size, run_sweep
from blis_fast.sweep.spec import load_sweep_plan
from blis_fast.sweep.store import metric_fields


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """(spec, output dir) of the small sweep run in this process."""
    root = tmp_path_factory.mktemp("sweep-ref")
    spec = write_spec(root)
    out = root / "out"
    run_sweep(spec, out, workers=1, chunk_size=3)
    return spec, out


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "summary").glob("*.parquet"))}


def _always(metrics: list[str]) -> list[str]:
    """The metrics every run has (the cost and fleet columns are null where they do not
    apply: an unpriced run, a fixed fleet)."""
    from blis_fast.output.schemas import schema_fields

    optional = {f["name"] for f in schema_fields("summary") if f.get("nullable")}
    return [m for m in metrics if m not in optional]


def test_rows_carry_typed_config_columns_and_the_run_summary(reference):
    spec, out = reference
    frame = summary(out)
    assert frame.height == 8
    schema = frame.schema
    assert schema["config_id"] == pl.String and schema["rate"] == pl.Float64
    assert schema["routing_policy"] == pl.String and schema["seed"] == pl.Int64
    assert schema["num_instances"] == pl.Int64 and schema["error"] == pl.String
    metrics = [f.name for f in metric_fields()]
    assert "ttft_p99_ms" in metrics and "instance_id" not in frame.columns
    assert frame.select(pl.col(_always(metrics)).null_count()).sum_horizontal().item() == 0
    assert frame["cost_usd"].null_count() == 8 and frame["gpu_seconds"].null_count() == 0
    assert frame["error"].null_count() == 8
    assert sorted(set(zip(frame["rate"], frame["routing_policy"], frame["seed"], strict=True))) \
        == sorted((r, p, s) for r in (10.0, 40.0) for p in ("least-loaded", "round-robin")
                  for s in (42, 43))
    # a row is what blis run gives for that configuration
    row = frame.filter((pl.col("rate") == 40.0) & (pl.col("routing_policy") == "least-loaded")
                       & (pl.col("seed") == 43)).row(0, named=True)
    direct = blis_fast.run(model=MODEL, num_instances=2, num_requests=300, rate=40,
                           routing_policy="least-loaded", seed=43, log="error").summary_row
    for name in metrics:
        assert row[name] == direct.get(name, 0), name
    assert row["completed_requests"] == 300 and row["ttft_p99_ms"] > 0
    plan = load_sweep_plan(spec)
    assert frame["config_id"].to_list() == [c.config_id for c in plan.configs]
    # no request carries a LoRA adapter: no adapters partitions (tests/test_examples.py has them)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "summary"]


def test_same_spec_gives_byte_identical_summary_files(reference, tmp_path):
    spec, out = reference
    again = tmp_path / "again"
    run_sweep(spec, again, workers=1, chunk_size=3)
    assert _files(again) == _files(out)
    assert len(_files(out)) == 3  # 8 configurations in chunks of 3


def test_two_worker_processes_give_the_same_rows_and_files(reference, tmp_path):
    spec, out = reference
    run = invoke(["sweep", str(spec), "--out", str(tmp_path / "w2"), "--workers", "2",
                  "--chunk-size", "3"])
    assert run.code == 0, run.stderr
    assert "8 configuration(s) run (0 failed)" in run.stdout
    assert summary(tmp_path / "w2").equals(summary(out))
    assert _files(tmp_path / "w2") == _files(out)


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for this module's Ray tests."""
    import ray  # part of the dev extra: this test runs wherever the tests run
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT)}})
    yield ray
    ray.shutdown()


def test_ray_backend_gives_the_same_rows_and_files(reference, ray_session, tmp_path):
    spec, out = reference
    outcome = run_sweep(spec, tmp_path / "ray", backend="ray", chunk_size=3)
    assert (outcome.ran, outcome.errors) == (8, 0)
    assert summary(tmp_path / "ray").equals(summary(out))
    assert _files(tmp_path / "ray") == _files(out)
    assert ray_session.is_initialized()  # a session the caller started is left running


def test_failed_configuration_is_a_row_with_its_error_and_the_sweep_goes_on(tmp_path,
                                                                             monkeypatch):
    from blis_fast import api

    real_run = api.run

    def flaky_run(**kwargs):
        if kwargs["rate"] == 40.0 and kwargs["routing_policy"] == "round-robin":
            raise blis_fast.BlisRuntimeError("engine status 7\nsecond line")
        return real_run(**kwargs)

    monkeypatch.setattr(api, "run", flaky_run)
    spec = write_spec(tmp_path)
    outcome = run_sweep(spec, tmp_path / "out", workers=1, chunk_size=1)
    assert (outcome.ran, outcome.errors) == (8, 2)
    frame = summary(tmp_path / "out")  # all-null metric files read with the others
    failed = frame.filter(pl.col("error").is_not_null())
    assert failed["error"].to_list() == ["BlisRuntimeError: engine status 7"] * 2
    assert set(failed["rate"]) == {40.0} and set(failed["routing_policy"]) == {"round-robin"}
    metrics = [f.name for f in metric_fields()]
    assert failed.select(pl.col(metrics).null_count()).row(0) == (2,) * len(metrics)
    ok = frame.filter(pl.col("error").is_null())
    assert ok.height == 6
    assert ok.select(pl.col(_always(metrics)).null_count()).sum_horizontal().item() == 0
    schemas = {str(pl.read_parquet_schema(p)) for p in (tmp_path / "out" / "summary").iterdir()}
    assert len(schemas) == 1
    # a failed configuration counts as done: resuming runs nothing
    monkeypatch.setattr(api, "run", real_run)
    again = run_sweep(spec, tmp_path / "out", workers=1, resume=True)
    assert (again.ran, again.skipped) == (0, 8)


def test_requests_are_partitioned_by_configuration(tmp_path):
    spec = write_spec(tmp_path, SMALL_SPEC.replace("seeds: 2", "seeds: 1"))
    run = invoke(["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1",
                  "--requests"])
    assert run.code == 0, run.stderr
    frame = summary(tmp_path / "out")
    parts = sorted((tmp_path / "out" / "requests").iterdir())
    assert [p.name for p in parts] == [f"config_id={c}" for c in frame["config_id"]]
    requests = pl.read_parquet(str(tmp_path / "out" / "requests" / "*" / "*.parquet"),
                               hive_partitioning=True)
    counts = requests.group_by("config_id").len().sort("config_id")
    assert counts["len"].to_list() == frame["injected_requests"].to_list() == [300] * 4
    one = frame.row(3, named=True)
    mine = requests.filter(pl.col("config_id") == one["config_id"])
    assert mine["ttft_ms"].mean() == pytest.approx(one["ttft_mean_ms"], rel=1e-12)
    assert mine["e2e_ms"].mean() == pytest.approx(one["e2e_mean_ms"], rel=1e-12)
    assert mine["completed"].sum() == one["completed_requests"]


def test_manifest_records_spec_version_counts_and_runs(reference, tmp_path):
    spec, out = reference
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"] == SMALL_SPEC and manifest["num_configs"] == 8
    assert manifest["blis_fast_version"] == blis_fast.__version__
    (run,) = manifest["runs"]
    assert run["configs_written"] == 8 and run["errors"] == 0 and run["interrupted"] is False
    assert run["started_at"] <= run["finished_at"]
    assert manifest["columns"][0] == "config_id" and manifest["columns"][-1] == "error"


def test_chunk_size_grows_with_the_sweep_up_to_32():
    assert [default_chunk_size(n) for n in (1, 64, 65, 1000, 2048, 10**6)] == [1, 1, 2, 16, 32, 32]


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path):
    spec = write_spec(tmp_path, SMALL_SPEC.replace("seeds: 2", "seeds: 1"))
    run = invoke(["sweep", str(spec), "--out", str(tmp_path / "out"), "--workers", "1"])
    assert run.code == 0
    last = run.stderr.splitlines()[-1]
    assert last.startswith("sweep: 4/4 configs, ") and "ETA 0s" in last


def test_example_questions_script_answers_from_the_sweep(reference, capsys):
    """``examples/sweep_questions.py`` on a real sweep: Q1 picks the policy with the lowest
    seed-mean p99 TTFT at each rate, Q2 reads the highest rate, Q3 the SLO share."""
    import importlib.util

    path = REPO_ROOT / "examples" / "sweep_questions.py"
    module_spec = importlib.util.spec_from_file_location("sweep_questions", path)
    questions = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(questions)
    _, out = reference
    rows = questions.load(str(out))
    best = questions.best_policy_per_rate(rows)
    for rate in (10.0, 40.0):
        means = {pol: sum(r["ttft_p99_ms"] for r in rows.iter_rows(named=True)
                          if r["rate"] == rate and r["routing_policy"] == pol) / 2
                 for pol in ("round-robin", "least-loaded")}
        picked = best.filter(pl.col("rate") == rate).row(0, named=True)
        assert picked["routing_policy"] == min(means, key=means.get)
        assert picked["ttft_p99_ms"] == pytest.approx(min(means.values()), rel=1e-12)
    top = questions.throughput_at_highest_rate(rows)
    assert set(top["rate"]) == {40.0} and top.height == 2
    slo = questions.slo_attainment(rows, ttft_p99_ms=1e9)
    assert slo["max_rate_meeting_slo"].to_list() == [40.0, 40.0]
    questions.main([str(out)])
    assert "Q3 share of seeds" in capsys.readouterr().out


def test_a_dying_worker_process_is_one_clear_error():
    import os

    from blis_fast.errors import BlisRuntimeError
    from blis_fast.sweep.execute import TaskRunner

    with pytest.raises(BlisRuntimeError, match="worker process died.*--resume"):
        with TaskRunner(workers=2) as runner:
            list(runner.map(os._exit, [3, 3]))
