"""Parquet outputs: files carry exactly the schemas kept in schemas/*.json; writes are atomic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _output_parity import load_results, request_columns, results_cases

from blis_fast.data import data_path
from blis_fast.errors import BlisOutputError
from blis_fast.output import parquet as pqo
from blis_fast.output.parquet import write_requests_parquet, write_summary_parquet
from blis_fast.output.schemas import ARROW_TYPES, load_schema
from blis_fast.output.summary import InstanceMetrics, RequestColumns, build_metrics_output


def _schema_doc(name: str) -> dict:
    return json.loads((data_path("schemas") / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["summary", "requests"])
def test_schema_files_are_well_formed(name: str) -> None:
    doc = _schema_doc(name)
    names = [f["name"] for f in doc["fields"]]
    assert len(names) == len(set(names))
    for f in doc["fields"]:
        assert f["type"] in ARROW_TYPES
        assert f["name"] == f["name"].lower() and " " not in f["name"]
        assert f["description"]


def _file_matches_schema_json(path: Path, name: str) -> None:
    got = pq.read_schema(path)
    doc = _schema_doc(name)
    assert got.names == [f["name"] for f in doc["fields"]]
    for field, spec in zip(got, doc["fields"], strict=True):
        assert field.type == ARROW_TYPES[spec["type"]], field.name
        assert field.nullable == spec["nullable"], field.name
    assert got.remove_metadata() == load_schema(name)


def test_summary_parquet(tmp_path: Path) -> None:
    m = InstanceMetrics(
        completed=2,
        total_output_tokens=10,
        sim_ended_time_us=2_000_000,
        ttft_us=np.array([1000.0, 3000.0]),
        e2e_us=np.array([5000.0, 7000.0]),
        scheduling_delay_us=np.array([10, 20]),
        itl_values_us=np.array([100, 200]),
        itl_counts=np.array([3, 1]),
    )
    summary = build_metrics_output("cluster", m)
    path = tmp_path / "summary.parquet"
    write_summary_parquet(path, summary)
    _file_matches_schema_json(path, "summary")
    df = pl.read_parquet(path)
    assert df.height == 1
    row = df.row(0, named=True)
    for k, v in summary.items():
        assert row[k] == v
    assert row["kv_allocation_failures"] == 0
    assert os.listdir(tmp_path) == ["summary.parquet"]


def test_summary_rejects_unknown_fields(tmp_path: Path) -> None:
    summary = build_metrics_output("cluster", InstanceMetrics())
    summary["bogus"] = 1
    with pytest.raises(ValueError):
        write_summary_parquet(tmp_path / "s.parquet", summary)
    assert os.listdir(tmp_path) == []


CASES = results_cases()


@pytest.mark.skipif(not CASES, reason="parity cases not available")
def test_requests_parquet_from_case(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "timeout-5s-overload")
    records = load_results(case)["requests"]
    cols = request_columns(records[::-1])
    path = tmp_path / "requests.parquet"
    write_requests_parquet(path, cols)
    _file_matches_schema_json(path, "requests")
    df = pl.read_parquet(path)
    assert df["request_id"].to_list() == [r["requestID"] for r in records]
    done = df.filter(pl.col("completed"))
    assert done.height == sum(1 for r in records if r["e2e_ms"] > 0)
    assert df.filter(~pl.col("completed"))["e2e_ms"].null_count() == df.height - done.height
    exp_e2e = [r["e2e_ms"] for r in records if r["e2e_ms"] > 0]
    assert done["e2e_ms"].to_list() == exp_e2e
    assert df["arrival_us"].to_list() == [round(r["arrived_at"] * 1e6) for r in records]


def test_requests_parquet_empty(tmp_path: Path) -> None:
    path = tmp_path / "requests.parquet"
    write_requests_parquet(path, RequestColumns.empty())
    _file_matches_schema_json(path, "requests")
    assert pq.read_table(path).num_rows == 0


def test_atomic_write_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "summary.parquet"
    write_summary_parquet(path, build_metrics_output("cluster", InstanceMetrics(completed=0)))
    before = path.read_bytes()

    def boom(table: pa.Table, where: str) -> None:
        Path(where).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(pqo.pq, "write_table", boom)
    with pytest.raises(BlisOutputError, match="disk full"):  # the OSError as one clear line
        write_summary_parquet(path, build_metrics_output("cluster", InstanceMetrics(completed=5)))
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["summary.parquet"]
