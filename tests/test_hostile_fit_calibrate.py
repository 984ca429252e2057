"""Hostile input to ``blis fit``, ``blis calibrate`` and the evolve benchmark's files (issue 28
items 3-5): inputs an output would clobber, fits without data or without limits, readers that
would read forever or trust absurd figures.

Every refusal asserts exit code 2, one stderr line naming the culprit, no traceback and the
working folder unchanged. Reads that used to block (a FIFO) or stream forever (``/dev/zero``)
run ``blis`` in a subprocess with a timeout. The property test at the end feeds random and
mutated bytes to every calibrate/fit reader: a parsed result or one ``BlisError``, nothing else.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parity import CASES_DIR
from test_hostile_input import MODEL, blis, refused_cleanly, snapshot, write

from blis_fast.errors import BlisError
from blis_fast.testing.synthetic_trace import make_observed_trace

CAL_CASE = CASES_DIR / "cal-itl"  # an observed trace with its ITL file and a replay's results
CAL = ["calibrate", "--trace-header", "observed.yaml", "--trace-data", "observed.csv",
       "--sim-results", "sim.json", "--report", "r.json"]
FIT = ["fit", "--trace-header", "t.yaml", "--trace-data", "t.csv", "--model", MODEL]


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> tuple[Path, Path]:
    """A 30-request observed trace of known blackbox coefficients (about a second to make)."""
    tmp = tmp_path_factory.mktemp("hostile-fit")
    header, data = make_observed_trace(tmp / "t", alpha=(2000.0, 1.0, 0.0),
                                       beta=(6000.0, 8.0, 150.0), rate=10, seed=1,
                                       num_requests=30, prompt_tokens=100, output_tokens=20)
    return Path(header), Path(data)


@pytest.fixture
def work(tmp_path: Path, small_trace) -> Path:
    """A folder with the small trace (t.yaml/t.csv) and the cal-itl case's calibrate inputs."""
    d = tmp_path / "work"
    d.mkdir()
    shutil.copy(small_trace[0], d / "t.yaml")
    shutil.copy(small_trace[1], d / "t.csv")
    for name in ("observed.yaml", "observed.csv", "sim.json", "itl.csv"):
        shutil.copy(CAL_CASE / name, d / name)
    return d


def _rewrite_rows(path: Path, change) -> None:
    """Apply ``change(row_dict)`` to every data row of a trace CSV."""
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        change(row)
        writer.writerow(row)
    path.write_text(out.getvalue())


# ------------------------------------------------------------- item 3: inputs are not outputs


@pytest.mark.parametrize("target", ["t.yaml", "t.csv", "itl.csv"])
@pytest.mark.parametrize("flag", ["--report", "--out-coeffs"])
def test_fit_refuses_an_output_naming_a_holdout_file(work: Path, flag: str, target: str) -> None:
    """Each of HEADER, DATA and ITL of ``--holdout`` is an input: an output naming it is
    refused before the fit, and the file is left as it was."""
    shutil.copy(work / "t.csv", work / "h.csv")
    holdout = "t.yaml:h.csv:itl.csv" if target != "t.csv" else "t.yaml:t.csv"
    line = refused_cleanly([*FIT, "--holdout", holdout, "--max-evaluations", "2",
                            flag, target], work, flag)
    assert "--holdout" in line and "input" in line


def test_evolve_init_refuses_to_rewrite_the_benchmark_it_reads(work: Path) -> None:
    code, _, err = blis(["evolve", "init", "openevolve", "--out", "ev"], work)
    assert code == 0, err
    bench = work / "ev" / "benchmark.yaml"
    bench.write_text(bench.read_text() + "# my notes\n")
    line = refused_cleanly(["evolve", "init", "openevolve", "--benchmark", str(bench),
                            "--out", "ev"], work, "--out")
    assert "--benchmark" in line


# ------------------------------------------------------ item 4: fits without data or limits


def test_fit_refuses_more_starts_than_evaluations(work: Path) -> None:
    refused_cleanly([*FIT, "--starts", "6", "--max-evaluations", "5", "--report", "r.json"],
                    work, "--starts")


def test_fit_refuses_a_billion_starts_at_once(work: Path) -> None:
    """``--starts 1000000000`` with a budget as large: refused in bounded time and memory
    (a search object per start would be made up front)."""
    started = time.perf_counter()
    refused_cleanly([*FIT, "--starts", "1000000000", "--max-evaluations", "2000000000"], work,
                    "--starts")
    assert time.perf_counter() - started < 30


def test_the_starts_share_max_evaluations_exactly(small_trace) -> None:
    from blis_fast.fit.optimize import evaluations_per_search, fit
    from blis_fast.fit.problem import load_fit_trace

    assert evaluations_per_search(7, 3) == [3, 2, 2]
    assert evaluations_per_search(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError):
        evaluations_per_search(3, 4)
    ft = load_fit_trace(*map(str, small_trace))
    result = fit([ft], {"model": MODEL}, {"ttft": 1.0, "itl": 1.0, "e2e": 1.0},
                 max_evaluations=7, starts=3, time_limit_s=600)
    assert len(result.losses) == 7 and len(result.search_losses) == 3


def test_the_time_limit_bounds_the_whole_fit_not_each_start(small_trace) -> None:
    """With the time spent after the first evaluation, no later start begins (each used to get
    its own --time-limit, so N starts took N times as long)."""
    from blis_fast.fit.optimize import fit
    from blis_fast.fit.problem import load_fit_trace

    ft = load_fit_trace(*map(str, small_trace))
    result = fit([ft], {"model": MODEL}, {"ttft": 1.0, "itl": 1.0, "e2e": 1.0},
                 max_evaluations=20_000, starts=20, time_limit_s=1e-3)
    assert result.stopped == "time-limit"
    assert len(result.losses) == 1 and len(result.search_losses) == 1


def _all_negative(row: dict) -> None:
    row["first_chunk_time_us"] = str(int(row["send_time_us"]) - 5)


def _backwards_send(row: dict) -> None:
    row["send_time_us"] = str(int(row["last_chunk_time_us"]) + 1)


@pytest.mark.parametrize(("change", "extra", "needle"), [
    (None, ["--warmup-requests", "1000"], "warm-up"),
    (_all_negative, [], "negative TTFT or E2E"),
    (_backwards_send, [], "negative TTFT or E2E"),
    (None, ["--total-kv-blocks", "1"], "KV cache too small"),
], ids=["all-warm-up", "negative-ttft", "negative-e2e", "kv-too-small"])
def test_fit_refuses_a_trace_without_usable_pairs_before_the_search(work: Path, change, extra,
                                                                     needle) -> None:
    """Calibrate refuses these inputs; fit used to search a constant 1e9 loss and print
    coefficients at their bounds with exit 0."""
    if change is not None:
        _rewrite_rows(work / "t.csv", change)
    started = time.perf_counter()
    line = refused_cleanly([*FIT, *extra, "--report", "r.json", "--out-coeffs", "c.json"],
                           work, "--trace-data")
    assert needle in line
    assert time.perf_counter() - started < 60  # no search ran: seconds, not a 60 s time limit


def test_a_holdout_without_usable_pairs_is_refused_naming_holdout(work: Path) -> None:
    shutil.copy(work / "t.csv", work / "h.csv")
    _rewrite_rows(work / "h.csv", _all_negative)
    refused_cleanly([*FIT, "--holdout", "t.yaml:h.csv", "--report", "r.json"], work,
                    "--holdout")


def test_huge_weights_keep_the_loss_a_weighted_mean() -> None:
    """Weights of 1e308 used to overflow the weighted sum (inf / inf), so every evaluation
    scored the same; the loss is scale-free in the weights."""
    from blis_fast.fit.problem import trace_loss

    errors = {"ttft": 0.5, "itl": 0.1, "e2e": 0.25}
    for scale in (1.0, 1e-300, 1e300, 1e308):
        w = {"ttft": scale, "itl": 0.0, "e2e": scale}
        assert trace_loss(errors, w) == pytest.approx(0.375, rel=1e-12)
    assert trace_loss(errors, {"ttft": 1e308, "itl": 1.0, "e2e": 1.0}) == \
        pytest.approx(0.5, rel=1e-12)


def test_fit_with_huge_weights_reports_a_real_loss(work: Path) -> None:
    code, _, err = blis([*FIT, "--weight-ttft", "1e308", "--weight-e2e", "1e308",
                         "--max-evaluations", "3", "--report", "r.json"], work)
    # three evaluations do not improve on the start: "did not fit" (exit 3, issue 30), the
    # report still written
    assert code == 3, err
    report = json.loads((work / "r.json").read_text())
    assert 0 < report["loss"] < 10 and len(set(report["losses"])) > 1


# ------------------------------------------------------ item 5: readers that read forever


@pytest.mark.parametrize("flag", ["--sim-results", "--itl-data", "--trace-header"])
def test_calibrate_refuses_dev_zero_and_a_fifo(work: Path, flag: str) -> None:
    """/dev/zero used to be read until memory ran out, a FIFO without a writer to block the
    command forever: both are refused before reading (a subprocess guards the hang)."""
    args = list(CAL)
    os.mkfifo(work / "pipe")
    for source in ("/dev/zero", "pipe"):
        if flag in args:
            args[args.index(flag) + 1] = source
        else:
            args += [flag, source]
        line = refused_cleanly(args, work, flag, subprocess_=True)
        assert "not a regular file" in line


def test_fit_refuses_an_itl_file_that_is_dev_zero(work: Path) -> None:
    refused_cleanly([*FIT, "--itl-data", "/dev/zero"], work, "--itl-data", subprocess_=True)


def test_evolve_refuses_a_spec_file_that_never_ends(work: Path) -> None:
    """An evolve benchmark's ``spec_file`` goes through the same checked reader."""
    os.mkfifo(work / "spec.fifo")
    for spec in ("/dev/zero", "spec.fifo"):
        write(work / "bench.yaml", f"workloads:\n  - name: w\n    spec_file: {spec}\n")
        line = refused_cleanly(["evolve", "init", "openevolve", "--benchmark", "bench.yaml",
                                "--out", "ev"], work, "spec_file", subprocess_=True)
        assert "not a regular file" in line
    write(work / "spec.yaml", b"num_requests: 3\n\xff\xfe\n")
    write(work / "bench.yaml", "workloads:\n  - name: w\n    spec_file: spec.yaml\n")
    assert "UTF-8" in refused_cleanly(["evolve", "init", "openevolve", "--benchmark",
                                       "bench.yaml", "--out", "ev"], work, "spec_file")
    write(work / "spec.yaml", "[" * 100_000)
    refused_cleanly(["evolve", "init", "openevolve", "--benchmark", "bench.yaml", "--out", "ev"],
                    work, "spec_file", subprocess_=True)


def test_non_utf8_inputs_are_one_line(work: Path) -> None:
    write(work / "sim.json", b'[{"request_id": 0, "ttft_us": 1\xff}]')
    assert "UTF-8" in refused_cleanly(CAL, work, "--sim-results")
    shutil.copy(CAL_CASE / "sim.json", work / "sim.json")
    write(work / "bad.csv", b"request_id,chunk_index,timestamp_us\n0,0,\xfe\n")
    assert "UTF-8" in refused_cleanly([*CAL, "--itl-data", "bad.csv"], work, "--itl-data")
    header = json.dumps({"trace_version": 2, "time_unit": "us"}).encode()
    write(work / "observed.yaml", header[:-1] + b', "mode": "\xc3"}')
    refused_cleanly(CAL, work, "--trace-header")


@pytest.mark.parametrize("rtt", ["1e306", "-3", ".inf", ".nan", "3600001"])
def test_an_absurd_header_rtt_is_refused(work: Path, rtt: str) -> None:
    text = (work / "observed.yaml").read_text().replace("measured_rtt_ms: 0.8",
                                                        f"measured_rtt_ms: {rtt}")
    write(work / "observed.yaml", text)
    assert "measured_rtt_ms" in refused_cleanly(CAL, work, "--trace-header")
    shutil.copy(work / "observed.yaml", work / "t.yaml")
    refused_cleanly(FIT, work, "measured_rtt_ms")


def test_an_itl_file_with_swapped_columns_is_refused(work: Path) -> None:
    """The reference skips the first row unread, so swapped columns were read as each other
    (chunk indexes as µs timestamps): silently wrong ITL figures."""
    rows = (work / "itl.csv").read_text().splitlines()
    swapped = ["timestamp_us,chunk_index,request_id"] + [",".join(r.split(",")[::-1])
                                                         for r in rows[1:]]
    write(work / "itl.csv", "\n".join(swapped) + "\n")
    line = refused_cleanly([*CAL, "--itl-data", "itl.csv"], work, "--itl-data")
    assert "request_id,chunk_index,timestamp_us" in line
    write(work / "itl.csv", "\n".join(rows[1:]) + "\n")  # no header row at all
    refused_cleanly([*CAL, "--itl-data", "itl.csv"], work, "--itl-data")


def test_a_row_whose_e2e_is_shorter_than_its_ttft_is_refused(work: Path) -> None:
    def swap(row: dict) -> None:
        if row["request_id"] == "2":
            row["first_chunk_time_us"], row["last_chunk_time_us"] = \
                row["last_chunk_time_us"], row["first_chunk_time_us"]

    _rewrite_rows(work / "observed.csv", swap)
    line = refused_cleanly(CAL, work, "--trace-data")
    assert "request_id 2" in line and "before first_chunk_time_us" in line


@pytest.mark.parametrize("value", ["-1", "1e-300", "5e-324", "-inf"])
def test_a_negative_or_vanishing_bandwidth_is_refused(work: Path, value: str) -> None:
    refused_cleanly([*CAL, "--network-bandwidth-mbps", value], work, "--network-bandwidth-mbps")


@pytest.mark.parametrize(("field", "value"), [("ttft_us", "1e308"), ("e2e_us", "-5"),
                                              ("input_tokens", "-1")])
def test_absurd_sim_result_figures_are_refused(work: Path, field: str, value: str) -> None:
    sims = json.loads((work / "sim.json").read_text())
    text = json.dumps(sims).replace(f'"{field}": {sims[0][field]}', f'"{field}": {value}', 1)
    write(work / "sim.json", text)
    assert field in refused_cleanly(CAL, work, "--sim-results")


def test_the_checks_leave_the_reference_case_unchanged(work: Path) -> None:
    """The new checks refuse nothing a well-formed observation has: cal-itl still calibrates
    to the reference's report."""
    code, _, err = blis([*CAL, "--itl-data", "itl.csv"], work)
    assert code == 0, err
    assert json.loads((work / "r.json").read_text()) == \
        json.loads((CAL_CASE / "calibration.json").read_text())


# ------------------------------------------ property: every calibrate / fit reader, mutated


def _seeds() -> list[bytes]:
    header = (CAL_CASE / "observed.yaml").read_text()
    import yaml

    as_json = json.dumps(yaml.safe_load(header)).encode()
    return [header.encode(), as_json, (CAL_CASE / "observed.csv").read_bytes()[:3000],
            (CAL_CASE / "itl.csv").read_bytes()[:2000], (CAL_CASE / "sim.json").read_bytes()[:2000]]


_SEEDS = _seeds()


_TOKENS = [b"[", b"{", b"}", b",", b'"', b"-", b"1e308", b"NaN", b"Infinity", b"null",
           b"99999999999999999999", b"-1", b"\n", b"\x00", b"\xff", b"0,0,0\n",
           b"request_id,chunk_index,timestamp_us\n", b"&a ", b"*a", b": ", b"\r"]
_EDITS = st.lists(st.tuples(st.sampled_from(["set", "put", "cut", "copy"]),
                            st.floats(0.0, 1.0), st.integers(1, 200), st.sampled_from(_TOKENS),
                            st.integers(0, 255)), min_size=1, max_size=8)


def _mutate(data: st.DataObject) -> bytes:
    """A seed file with up to 8 edits: a byte set, a token put in, a span cut or copied."""
    blob = bytearray(data.draw(st.sampled_from(_SEEDS)))
    for kind, where, size, token, byte in data.draw(_EDITS):
        at = min(int(where * len(blob)), max(len(blob) - 1, 0))
        if kind == "set" and blob:
            blob[at] = byte
        elif kind == "put":
            blob[at:at] = token
        elif kind == "cut":
            del blob[at:at + size % 40 + 1]
        else:
            blob[at:at] = blob[at:at + size]
    return bytes(blob)


def _readers(good: Path):
    """Each calibrate/fit reader, called on a fuzzed path with the other inputs well-formed."""
    from blis_fast.calibrate.inputs import load_itl, load_observed_trace, load_sim_results
    from blis_fast.fit.problem import load_fit_trace

    header, data = str(good / "observed.yaml"), str(good / "observed.csv")
    return {"sim-results": load_sim_results, "itl": load_itl,
            "trace-header": lambda p: load_observed_trace(p, data),
            "trace-data": lambda p: load_observed_trace(header, p),
            "fit-trace": lambda p: load_fit_trace(header, p, None),
            "fit-itl": lambda p: load_fit_trace(header, data, p)}


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_calibrate_and_fit_readers_survive_random_and_mutated_input(data: st.DataObject,
                                                                    tmp_path: Path) -> None:
    """Random bytes and mutations of a trace header (YAML and JSON), a trace CSV, an ITL CSV
    and a SimResult JSON: every reader returns or raises one BlisError line."""
    good = tmp_path / "good"
    if not good.exists():
        good.mkdir()
        for name in ("observed.yaml", "observed.csv"):
            shutil.copy(CAL_CASE / name, good / name)
    blob = data.draw(st.binary(max_size=2000)) if data.draw(st.booleans()) else _mutate(data)
    path = tmp_path / "fuzz"
    path.write_bytes(blob)
    for name, read in _readers(good).items():
        started = time.perf_counter()
        try:
            read(str(path))
        except BlisError as exc:
            assert "\n" not in str(exc).strip(), f"{name}: a multi-line error: {exc}"
        except Exception as exc:  # noqa: BLE001 - the property under test
            pytest.fail(f"{name}: {type(exc).__name__}: {exc}\ninput={blob[:300]!r}")
        assert time.perf_counter() - started < 20, f"{name} took too long"
    assert snapshot(good) == {str(good / n): ("file", (CAL_CASE / n).read_bytes())
                              for n in ("observed.yaml", "observed.csv")}
