"""Provenance of the Parquet outputs: every file records the blis_fast version, its schema's
version and the run's options; re-running from those options reproduces stdout and every
file. requests.parquet's analyst columns (client, session, round, first-token time) hold the
run's own figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from _cli import invoke

import blis_fast
from blis_fast.data import data_path
from blis_fast.errors import BlisConfigError, BlisInputError
from blis_fast.options import OPTIONS_BY_FIELD
from blis_fast.output.parquet import write_summary_parquet
from blis_fast.output.provenance import read_provenance
from blis_fast.output.summary import InstanceMetrics, build_metrics_output

MODEL = "meta-llama/llama-3.1-8b-instruct"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
OUTPUT_FIELDS = {name for name, spec in OPTIONS_BY_FIELD.items() if spec.file == "output"}


def _schema_version(name: str) -> int:
    return json.loads((data_path("schemas") / f"{name}.json").read_text())["version"]


def _check_provenance(out: Path, command: str = "run") -> dict[str, object]:
    """Every file of ``out`` names this version, its schema and that schema's version, and
    the same options (all fields, output destinations left out); returns the options."""
    options = None
    for path in sorted(out.glob("*.parquet")):
        meta = pq.read_schema(path).metadata
        assert meta[b"blis_fast.version"].decode() == blis_fast.__version__
        schema = path.name.removesuffix(".parquet")
        assert meta[b"blis_fast.schema"].decode() == schema
        assert int(meta[b"blis_fast.schema_version"]) == _schema_version(schema)
        prov = read_provenance(path)
        assert prov.command == command and prov.hooks == ()
        assert set(prov.options) == set(OPTIONS_BY_FIELD) - OUTPUT_FIELDS
        assert not OUTPUT_FIELDS & set(prov.explicit)
        assert set(prov.resolved_options) == set(prov.options)
        assert options is None or prov.options == options
        options = prov.options
    assert options is not None, "no Parquet file written"
    return options


def _same_files(a: Path, b: Path) -> None:
    """Same file names, same rows, same schema and the same metadata."""
    names = sorted(p.name for p in a.glob("*.parquet"))
    assert names == sorted(p.name for p in b.glob("*.parquet"))
    for name in names:
        ta, tb = pq.read_table(a / name), pq.read_table(b / name)
        assert ta.equals(tb, check_metadata=True), name


def test_cli_run_records_its_options_and_reruns_identically(tmp_path: Path) -> None:
    out = tmp_path / "first"
    spec = str(EXAMPLES / "multiturn-chat-demo.yaml")
    result = invoke(["run", "--model", MODEL, "--num-instances", "2", "--num-requests", "30",
                     "--workload-spec", spec, "--trace-level", "decisions",
                     "--log", "error", "--output-dir", str(out)])
    assert result.code == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["decisions.parquet", "requests.parquet",
                                                     "summary.parquet"]
    options = _check_provenance(out)
    assert options["num_requests"] == 30 and options["workload_spec"] == spec
    assert options["trace_level"] == "decisions" and options["seed"] == 42
    prov = read_provenance(out / "summary.parquet")
    assert set(prov.explicit) == {"model", "num_instances", "num_requests", "workload_spec",
                                  "trace_level", "log"}
    # the resolved options hold what the run resolved: the spec's horizon, the KV blocks
    assert prov.resolved_options["total_kv_blocks"] > 0

    again = tmp_path / "again"
    rerun = blis_fast.rerun(out / "decisions.parquet", output_dir=str(again))
    assert rerun.stdout == result.stdout
    _same_files(out, again)


def test_pd_run_reruns_from_pools_parquet(tmp_path: Path) -> None:
    out, again = tmp_path / "first", tmp_path / "again"
    first = blis_fast.run(model=MODEL, num_instances=3, prefill_instances=1,
                          decode_instances=2, pd_decider="always", num_requests=40, rate=20.0,
                          output_dir=str(out), log="error")
    assert (out / "pools.parquet").is_file()
    options = _check_provenance(out)
    assert options["prefill_instances"] == 1 and options["pd_decider"] == "always"
    rerun = blis_fast.rerun(out / "pools.parquet", output_dir=str(again))
    assert rerun.stdout == first.stdout
    _same_files(out, again)
    # the API's tables carry the same provenance as the files
    assert first.pools_table().schema.metadata == pq.read_schema(out / "pools.parquet").metadata
    # P/D rows get the analyst columns too: projected TTFT -> first-token time
    req = pl.read_parquet(out / "requests.parquet")
    done = req.filter(pl.col("ttft_ms").is_not_null())
    assert done.height > 0
    assert (done["first_token_us"] - done["arrival_us"]
            - (done["ttft_ms"] * 1000).round().cast(pl.Int64)).abs().max() == 0


def test_autoscaled_run_reruns_from_scaling_parquet(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("autoscaler:\n  min_replicas: 1\n")
    out, again = tmp_path / "first", tmp_path / "again"
    first = blis_fast.run(model=MODEL, num_instances=2, model_autoscaler_interval_us=1e6,
                          rate=10.0, num_requests=40, policy_config=str(bundle),
                          output_dir=str(out), log="error")
    assert (out / "scaling.parquet").is_file()
    options = _check_provenance(out)
    assert options["model_autoscaler_interval_us"] == 1e6
    rerun = blis_fast.rerun(out / "scaling.parquet", output_dir=str(again))
    assert rerun.stdout == first.stdout
    _same_files(out, again)


def test_requests_parquet_analyst_columns(tmp_path: Path) -> None:
    """Sessions: ids and rounds from the workload, client ids from the spec, first-token
    time = arrival + TTFT; requests outside sessions have null session columns."""
    res = blis_fast.run(model=MODEL, num_instances=2, num_requests=30,
                        workload_spec=str(EXAMPLES / "multiturn-chat-demo.yaml"),
                        output_dir=str(tmp_path), log="error")
    req = pl.read_parquet(tmp_path / "requests.parquet")
    assert req.height == len(res.requests)
    assert set(req["client_id"].to_list()) == {"multi-turn-chat"}
    assert req["session_id"].null_count() == 0 and req["round_index"].null_count() == 0
    sessions = req.group_by("session_id").agg(pl.col("round_index").sort())
    assert sessions.height > 1
    for rounds in sessions["round_index"].to_list():
        assert rounds == list(range(len(rounds)))  # every round of a session, once
    assert req["round_index"].max() > 0
    # follow-up rounds arrive after their session's earlier rounds' first tokens
    first = req.filter(pl.col("round_index") == 0)
    assert first["request_id"].str.starts_with("request_").all()
    timed = req.filter(pl.col("ttft_ms").is_not_null())
    assert (timed["first_token_us"] - timed["arrival_us"]
            - (timed["ttft_ms"] * 1000).round().cast(pl.Int64)).abs().max() == 0
    assert req.filter(pl.col("ttft_ms").is_null())["first_token_us"].null_count() == (
        req["ttft_ms"].null_count())

    plain = blis_fast.run(model=MODEL, num_requests=10, log="error")
    frame = plain.requests_frame()
    assert frame["session_id"].null_count() == frame.height
    assert frame["round_index"].null_count() == frame.height
    assert frame["client_id"].null_count() == 0
    cols = plain.requests
    arrival = np.asarray(cols.arrival_us)
    ttft = np.asarray(cols.ttft_us)
    by_id = dict(zip(frame["request_id"].to_list(), frame["first_token_us"].to_list(),
                     strict=True))
    for rid, a, t in zip(cols.request_id, arrival, ttft, strict=True):
        assert by_id[rid] == a + round(t)


def test_rerun_refuses_files_without_run_options(tmp_path: Path) -> None:
    path = tmp_path / "summary.parquet"
    write_summary_parquet(path, build_metrics_output("cluster", InstanceMetrics()))
    prov = read_provenance(path)
    assert prov.version == blis_fast.__version__ and prov.options is None
    assert prov.schema_version == _schema_version("summary")
    with pytest.raises(BlisConfigError, match="no run options|not by one simulation"):
        blis_fast.rerun(path)
    bare = tmp_path / "bare.parquet"
    pq.write_table(pq.read_table(path).replace_schema_metadata(None), bare)
    with pytest.raises(BlisInputError, match="no blis_fast provenance"):
        read_provenance(bare)
