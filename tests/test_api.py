"""The Python API: ``blis_fast.run(**options)`` reproduces the README quick start.

Reference: the case ``tests/reference_cases/cases/quickstart-llama31-8b`` (``blis run --model
meta-llama/llama-3.1-8b-instruct`` with every other flag at its default). Floats are compared
with the parity tolerance (relative 1e-9, ``tests/reference_cases/README.md``), integers exactly.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

import blis_fast
from blis_fast.errors import BlisConfigError
from blis_fast.output.schemas import load_schema, schema_fields
from blis_fast.runner import RunResult

MODEL = "meta-llama/llama-3.1-8b-instruct"
CASE = Path(__file__).resolve().parent / "reference_cases" / "cases" / "quickstart-llama31-8b"
REL_TOL = 1e-9

POLARS_TYPES = {"string": pl.String, "int64": pl.Int64, "int32": pl.Int32,
                "float64": pl.Float64, "bool": pl.Boolean, "list<string>": pl.List(pl.String),
                "list<int64>": pl.List(pl.Int64), "list<float64>": pl.List(pl.Float64)}


def _close(a, b) -> bool:
    if isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return a == b
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=0.0)


@pytest.fixture(scope="module")
def reference() -> dict:
    if not (CASE / "results.json").is_file():
        pytest.skip(f"parity case not found at {CASE}")
    return json.loads((CASE / "results.json").read_text())


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    cwd = tmp_path_factory.mktemp("api-cwd")
    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = blis_fast.run(model=MODEL, log="error")
    finally:
        os.chdir(old)
    assert list(cwd.iterdir()) == [], "the API wrote files although no output was asked for"
    return result


def test_run_returns_a_run_result(quickstart: RunResult) -> None:
    assert isinstance(quickstart, RunResult)
    assert quickstart.prepared.table.n == 100
    assert quickstart.prepared.engine.options.num_instances == 1
    assert len(quickstart.per_instance) == 1
    assert quickstart.per_instance[0]["instance_id"] == "instance_0"
    assert quickstart.stdout.startswith("=== Simulation Metrics ===\n")


def test_summary_equals_reference_field_by_field(quickstart: RunResult, reference: dict) -> None:
    expected = {k: v for k, v in reference.items() if k != "requests"}
    assert list(quickstart.summary) == list(expected)
    bad = {k: (quickstart.summary[k], v) for k, v in expected.items()
           if not _close(quickstart.summary[k], v)}
    assert not bad, bad
    # one instance: the per-instance block carries the same numbers under its own id
    inst = dict(quickstart.per_instance[0], instance_id="cluster")
    assert all(_close(inst[k], v) for k, v in expected.items())


def test_requests_frame_equals_reference_per_request(quickstart: RunResult,
                                                     reference: dict) -> None:
    frame = quickstart.requests_frame()
    assert isinstance(frame, pl.DataFrame)
    ref = reference["requests"]
    assert frame.height == len(ref) == 100
    assert frame["request_id"].n_unique() == frame.height
    assert frame.schema == pl.Schema(
        {f["name"]: POLARS_TYPES[f["type"]] for f in schema_fields("requests")})
    rows = {row["request_id"]: row for row in frame.iter_rows(named=True)}
    columns = {"ttft_ms": "ttft_ms", "itl_ms": "itl_ms", "e2e_ms": "e2e_ms",
               "scheduling_delay_ms": "scheduling_delay_ms",
               "num_prefill_tokens": "num_prefill_tokens", "num_decode_tokens": "num_decode_tokens",
               "handled_by": "handled_by"}
    bad = []
    for want in ref:
        got = rows[want["requestID"]]
        if got["arrival_us"] != round(want["arrived_at"] * 1e6):
            bad.append((want["requestID"], "arrival_us", got["arrival_us"], want["arrived_at"]))
        for mine, theirs in columns.items():
            if not _close(got[mine], want.get(theirs, "")):
                bad.append((want["requestID"], mine, got[mine], want.get(theirs)))
        assert got["completed"] is True and got["length_capped"] is False
    assert not bad, bad[:10]
    # the frame's order is the results file's: ids sorted as strings, then by arrival
    assert frame["request_id"].to_list() == [r["requestID"] for r in ref]


def test_requests_columns_are_consistent_with_the_frame(quickstart: RunResult) -> None:
    cols = quickstart.requests
    frame = quickstart.requests_frame()
    assert len(cols) == frame.height
    by_id = dict(zip(frame["request_id"].to_list(), frame["ttft_ms"].to_list(), strict=True))
    for rid, ttft in zip(cols.request_id, cols.ttft_us, strict=True):
        assert by_id[rid] == pytest.approx(ttft / 1e3, rel=1e-12)


@pytest.fixture(scope="module")
def with_outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunResult, Path]:
    out = tmp_path_factory.mktemp("api-out") / "nested" / "dir"
    result = blis_fast.run(model=MODEL, log="error", output_dir=str(out))
    return result, out


def test_output_dir_holds_exactly_the_two_parquet_files(with_outputs) -> None:
    _, out = with_outputs
    assert sorted(p.name for p in out.iterdir()) == ["requests.parquet", "summary.parquet"]


@pytest.mark.parametrize("name", ["summary", "requests"])
def test_parquet_schema_equals_schema_file(with_outputs, name: str) -> None:
    _, out = with_outputs
    path = out / f"{name}.parquet"
    assert pq.read_schema(path).remove_metadata() == load_schema(name)
    frame = pl.read_parquet(path)
    assert frame.schema == pl.Schema(
        {f["name"]: POLARS_TYPES[f["type"]] for f in schema_fields(name)})


def test_summary_parquet_values_equal_run_result(with_outputs, reference: dict) -> None:
    result, out = with_outputs
    frame = pl.read_parquet(out / "summary.parquet")
    assert frame.height == 1
    row = frame.row(0, named=True)
    expected = dict(result.summary_row)  # the reference's summary + our cost/fleet columns
    expected.setdefault("kv_allocation_failures", 0)  # omitted from JSON when 0
    assert row["gpu_seconds"] > 0 and row["cost_usd"] is None and row["peak_replicas"] is None
    assert set(row) == set(expected)
    assert {k: v for k, v in row.items() if v != expected[k]} == {}
    ref = {k: v for k, v in reference.items() if k != "requests"}
    assert all(_close(row[k], v) for k, v in ref.items())


def test_requests_parquet_values_equal_run_result(with_outputs) -> None:
    result, out = with_outputs
    frame = pl.read_parquet(out / "requests.parquet")
    expected = result.requests_frame()
    assert frame.equals(expected, null_equal=True)
    assert frame.height == len(result.requests) == 100
    cols = result.requests
    order = {rid: i for i, rid in enumerate(cols.request_id)}
    idx = np.array([order[r] for r in frame["request_id"].to_list()])
    np.testing.assert_array_equal(frame["arrival_us"].to_numpy(), cols.arrival_us[idx])
    np.testing.assert_allclose(frame["e2e_ms"].to_numpy(), cols.e2e_us[idx] / 1e3, rtol=1e-12)
    np.testing.assert_allclose(frame["itl_ms"].to_numpy(), cols.itl_us[idx] / 1e3, rtol=1e-12)
    assert frame["handled_by"].to_list() == [f"instance_{i}" for i in cols.handled_by[idx]]


def test_api_and_cli_print_the_same(quickstart: RunResult, tmp_path: Path) -> None:
    import contextlib
    import io

    from blis_fast.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["run", "--model", MODEL, "--log", "error"])
    assert out.getvalue() == quickstart.stdout


def test_api_errors_are_typed_not_exits() -> None:
    with pytest.raises(BlisConfigError, match="--rate"):
        blis_fast.run(model=MODEL, rate=0, log="error")
    with pytest.raises(BlisConfigError, match="no_such_option"):
        blis_fast.run(model=MODEL, no_such_option=1)
    with pytest.raises(BlisConfigError, match="--num-requests"):
        blis_fast.run(model=MODEL, num_requests="many")


@pytest.mark.parametrize(("keyword", "value"), [
    ("rate", None), ("rate", [1.0]), ("rate", 1 + 2j), ("rate", np.array([1.0])),
    ("rate", 10**400), ("rate", True), ("rate", np.True_), ("rate", " 5"), ("rate", "1e400"),
    ("num_requests", 2**70), ("num_requests", 20.0), ("num_requests", np.float64(20.0)),
    ("num_requests", False), ("num_requests", None), ("num_requests", "\u0665"),
    ("seed", 2**64), ("seed", -(2**63) - 1), ("horizon", 2**63),
    ("alpha_coeffs", [1.0, None, 1.0]), ("alpha_coeffs", 5), ("alpha_coeffs", ""),
    ("summarize_trace", "yes"), ("summarize_trace", 2), ("summarize_trace", None),
], ids=lambda v: repr(v)[:30])
def test_api_refuses_what_the_cli_refuses(keyword: str, value: object) -> None:
    """Every keyword goes through the CLI flag's Go parser (its text for a Python number):
    the error is a BlisConfigError naming the keyword and the flag, never a TypeError or
    OverflowError (before the gonum parsers rate=None raised TypeError, rate=10**400
    OverflowError, and seed=2**64 / num_requests=20.0 were accepted)."""
    with pytest.raises(BlisConfigError) as exc:
        blis_fast.run(model=MODEL, log="error", **{keyword: value})
    message = str(exc.value)
    assert message.startswith(f"{keyword}=") and "--" + keyword.replace("_", "-") in message
    assert "\n" not in message


def test_api_accepts_numpy_scalars_and_go_spellings() -> None:
    """NumPy integer/float scalars and Go-only spellings give the run their plain values give."""
    base = dict(model=MODEL, log="error", alpha_coeffs=[100, 1, 100],
                beta_coeffs=[1000, 10, 5])
    plain = blis_fast.run(**base, num_requests=20, rate=2.5, seed=42).stdout
    assert blis_fast.run(**base, num_requests=np.int64(20), rate=np.float64(2.5),
                         seed=np.uint8(42)).stdout == plain
    assert blis_fast.run(**base, num_requests="0x14", rate="0x1.4p1", seed="0o52").stdout == plain
    assert blis_fast.run(**{**base, "alpha_coeffs": np.array([100.0, 1.0, 100.0]),
                            "beta_coeffs": "1_000,0xap0,5"},
                         num_requests=20, rate=2.5, seed=42).stdout == plain


def test_policy_diagnostics_are_logged() -> None:
    """``--log info`` names the policies in force and the weighted-routing profile (CLU-7.30)."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("blis_fast")
    logger.addHandler(handler)
    try:
        blis_fast.run(model="meta-llama/llama-3.1-8b-instruct", num_requests=3, log="info",
                      routing_policy="weighted", scheduler="sjf")
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert ("Policy config: admission=always-admit, routing=weighted, priority=constant, "
            "scheduler=sjf") in messages
    assert ("Weighted routing scorers: precise-prefix-cache:2.0, queue-depth:1.0, "
            "kv-utilization:1.0") in messages


def test_the_option_rows_document_the_python_api():
    """help(blis_fast.api.run) lists every keyword under its --help heading, from the rows."""
    from blis_fast.api import run
    from blis_fast.options import RUN_OPTIONS

    doc = run.__doc__
    headings = [line.strip() for line in doc.splitlines() if line.strip().endswith(":")
                and line.startswith("    ") and not line.startswith("        ")]
    assert headings[-len({s.group for s in RUN_OPTIONS}):] == list(
        dict.fromkeys(f"{s.group}:" for s in RUN_OPTIONS))
    for spec in RUN_OPTIONS:
        line = next(ln for ln in doc.splitlines() if ln.strip().startswith(f"{spec.field} ("))
        assert line.strip().endswith(spec.help)
    assert "        rate (float, default 1): " in doc
    assert "        num_requests (int, default 100)" in doc
