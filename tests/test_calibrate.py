"""``blis calibrate``: pairing accounting, network shifts, ITL pairs, input decoding, the CLI's
error handling and ``--plot``.

Golden numbers come from the reference cases (cal-*, replay-obs-calibrate-input) or from hand
computation; the hypothesis test checks the row accounting on arbitrary traces.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from _cli import invoke
from hypothesis import given, settings
from hypothesis import strategies as st
from parity import CASES_DIR

from blis_fast.calibrate.calibration import calibrate
from blis_fast.calibrate.inputs import ITLData, SimResult, load_itl, load_sim_results
from blis_fast.calibrate.pairing import pair_requests, transfer_delay_us
from blis_fast.calibrate.plot import plot_calibration
from blis_fast.errors import BlisError
from blis_fast.workload.replay import TraceRecords


def make_records(ids, send, first, last, inp=None, out=None) -> TraceRecords:
    """A TraceRecords with the given ids, timings and token counts (other columns empty)."""
    n = len(ids)
    values = {}
    for f in dataclasses.fields(TraceRecords):
        if f.type.startswith("list"):
            values[f.name] = [False] * n if "bool" in f.type else [""] * n
        else:
            values[f.name] = np.zeros(n, dtype=np.int64)
    values["reason_ratio"] = np.zeros(n)
    values["status"] = ["ok"] * n
    for name, col in (("request_id", ids), ("send_us", send), ("first_chunk_us", first),
                      ("last_chunk_us", last), ("input_tokens", inp or [10] * n),
                      ("output_tokens", out or [5] * n)):
        values[name] = np.array(col, dtype=np.int64)
    return TraceRecords(**values)


def sim(rid, ttft=1000.0, e2e=5000.0, n_in=10, n_out=5) -> SimResult:
    return SimResult(rid, ttft, e2e, n_in, n_out)


# ---- pairing ------------------------------------------------------------------------------

rows = st.lists(st.tuples(st.integers(0, 15), st.integers(-50, 50), st.integers(-50, 50)),
                max_size=40)


@settings(max_examples=200, deadline=None)
@given(rows, st.lists(st.integers(0, 15), max_size=30), st.integers(-2, 6))
def test_every_row_is_paired_excluded_or_unmatched_exactly_once(trace_rows, sim_ids, warm_up):
    ids = [r[0] for r in trace_rows]
    send = [1_000 for _ in trace_rows]
    first = [1_000 + r[1] for r in trace_rows]
    last = [1_000 + r[1] + r[2] for r in trace_rows]
    sims = [sim(i, ttft=float(k), e2e=float(k + 1)) for k, i in enumerate(sim_ids)]
    p = pair_requests(make_records(ids, send, first, last), sims, warm_up=warm_up, rtt_us=0,
                      bandwidth_mbps=0.0)
    n = len(trace_rows)
    assert p.warm_up_excluded + p.matched + p.unmatched_no_sim == n
    assert p.warm_up_excluded == sum(1 for i in ids if i < warm_up)
    assert p.unmatched_no_sim == sum(1 for i in ids if i >= warm_up and i not in sim_ids)
    negative = sum(1 for i, f, l_ in zip(ids, first, last, strict=True)
                   if i >= warm_up and i in sim_ids and (f < 1_000 or l_ < 1_000))
    assert p.negative_latency == negative
    assert len(p.ttft.real) == len(p.e2e.real) == p.matched - negative
    # The reference's report counts a negative-latency row as matched and as unmatched.
    assert p.num_requests == n + negative
    matched_ids = {i for i in ids if i >= warm_up and i in sim_ids}
    assert p.unmatched_sim == sum(1 for i in sim_ids if i not in matched_ids)
    assert all(v >= 0 for v in p.ttft.real + p.e2e.real)


def test_duplicated_sim_id_last_entry_wins_and_failed_rows_count_twice():
    rec = make_records([0, 1, 2], [100, 100, 100], [300, 0, 150], [900, 0, 400])
    sims = [sim(0, ttft=1.0), sim(1), sim(0, ttft=7.0), sim(2, n_out=6), sim(9)]
    p = pair_requests(rec, sims, warm_up=0, rtt_us=0, bandwidth_mbps=0.0)
    assert p.ttft.request_id == [0, 2] and p.ttft.real == [200.0, 50.0]
    assert p.ttft.sim == [7.0, 1000.0]
    assert (p.matched, p.negative_latency, p.unmatched_real, p.num_requests) == (3, 1, 1, 4)
    assert p.unmatched_sim == 1  # id 9 (the two entries of id 0 are both matched)
    assert p.token_mismatches == 1  # id 2: 5 output tokens observed, 6 simulated


def test_rtt_and_bandwidth_shift_the_sim_side():
    # 100 input tokens at 100 Mbps: 100*4*8 bits / 1e8 bit/s = 32 µs; 5 output tokens: 1.6 µs
    assert transfer_delay_us(100.0, 100) == pytest.approx(32.0, rel=1e-15)
    assert transfer_delay_us(0.0, 100) == 0.0 and transfer_delay_us(-5.0, 100) == 0.0
    rec = make_records([0], [0], [10_000], [50_000], inp=[100], out=[5])
    p = pair_requests(rec, [sim(0, 1000.0, 5000.0, 100, 5)], warm_up=0, rtt_us=2500,
                      bandwidth_mbps=100.0)
    assert p.ttft.sim == [pytest.approx(1000 + 2500 + 32.0, rel=1e-15)]
    assert p.e2e.sim == [pytest.approx(5000 + 2500 + 32.0 + 1.6, rel=1e-15)]


def test_itl_pairs_sort_chunks_skip_negative_deltas_and_drop_all_negative():
    rec = make_records([0, 1, 2, 3], [0] * 4, [10] * 4, [100] * 4)
    sims = [sim(0, 1000.0, 5000.0, n_out=5), sim(1, n_out=1), sim(2), sim(3)]
    itl_rows = [  # (request, chunk, timestamp)
        (0, 2, 130), (0, 0, 100), (0, 1, 110),   # shuffled: deltas 10, 20 -> 15
        (1, 0, 50), (1, 1, 40), (1, 2, 70),      # deltas -10 (skipped), 30 -> 30
        (2, 0, 90), (2, 1, 80),                  # all negative: dropped
        (3, 0, 10),                              # one chunk: no pair
    ]
    itl = ITLData(*(np.array(c, dtype=np.int64) for c in zip(*itl_rows, strict=True)))
    p = pair_requests(rec, sims, warm_up=0, rtt_us=0, bandwidth_mbps=0.0, itl=itl)
    assert p.itl.request_id == [0, 1]
    assert p.itl.real == [15.0, 30.0]
    assert p.itl.sim == [(5000.0 - 1000.0) / 4, 0.0]  # one output token: sim ITL 0
    assert p.itl_dropped == 1 and "request 2 ITL dropped" in p.warnings[0]


# ---- inputs -------------------------------------------------------------------------------

def test_sim_results_decode_like_go(tmp_path):
    path = tmp_path / "sim.json"
    path.write_text('[{"REQUEST_ID": 3, "ttft_us": 1e3, "e2e_us": 2, "input_tokens": 7, '
                    '"output_tokens": null, "slo_class": "x", "extra": [1]}, null]')
    assert load_sim_results(str(path)) == [SimResult(3, 1000.0, 2.0, 7, 0),
                                           SimResult(0, 0.0, 0.0, 0, 0)]
    path.write_text("null")
    assert load_sim_results(str(path)) == []


@pytest.mark.parametrize("text", [
    '[{"request_id": 1.5}]', '[{"request_id": "1"}]', '[{"ttft_us": NaN}]',
    '[{"e2e_us": 1e400}]', '{"request_id": 1}', '[1]', '[{"request_id": 1}',
    '[{"request_id": 9223372036854775808}]',
])
def test_sim_results_errors_name_the_flag(tmp_path, text):
    path = tmp_path / "sim.json"
    path.write_text(text)
    with pytest.raises(BlisError, match="--sim-results"):
        load_sim_results(str(path))


def test_itl_file_errors(tmp_path):
    path = tmp_path / "itl.csv"
    path.write_text("request_id,chunk_index,timestamp_us\n0,0,10\n0,1,25\n")
    itl = load_itl(str(path))
    assert itl.timestamp_us.tolist() == [10, 25]
    for body, match in (("0,0,-1\n", "timestamp_us must be >= 0"), ("0,x,1\n", "chunk_index"),
                        ("0,1\n", "2 fields"), ("0,1,1_0\n", "timestamp_us")):
        path.write_text("request_id,chunk_index,timestamp_us\n" + body)
        with pytest.raises(BlisError, match=match):
            load_itl(str(path))
    path.write_text("")
    with pytest.raises(BlisError, match="--itl-data"):
        load_itl(str(path))


def test_rtt_from_header_is_truncated_to_whole_microseconds(tmp_path):
    src = CASES_DIR / "cal-warmup-explicit-rtt-flag"
    header = (src / "observed.yaml").read_text().replace("measured_rtt_ms: 3.7",
                                                         "measured_rtt_ms: 0.0019")
    (tmp_path / "h.yaml").write_text(header)
    args = (str(tmp_path / "h.yaml"), str(src / "observed.csv"), str(src / "sim.json"))
    assert calibrate(*args).rtt_us == 1
    assert calibrate(*args, network_rtt_us=0).rtt_us == 0
    assert calibrate(*args).warm_up == 2  # the header's warm_up_requests
    assert calibrate(*args, warmup_requests=-3).warm_up == -3  # any other value as given


# ---- the command --------------------------------------------------------------------------

@pytest.fixture
def case_copy(tmp_path, monkeypatch) -> Path:
    """The inputs of case cal-header-warmup-rtt in a temporary working directory."""
    src = CASES_DIR / "cal-header-warmup-rtt"
    for name in ("observed.yaml", "observed.csv", "sim.json"):
        shutil.copy(src / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


BASE = ["calibrate", "--trace-header", "observed.yaml", "--trace-data", "observed.csv",
        "--sim-results", "sim.json"]


@pytest.mark.parametrize(("extra", "message"), [
    ([], "--report is required"),
    (["--report", "r.json", "--warmup-requests", "x"], "--warmup-requests"),
    (["--report", "r.json", "--network-bandwidth-mbps", "NaN"], "--network-bandwidth-mbps"),
    (["--report", "r.json", "--network-rtt-us", "-2"], "--network-rtt-us"),
    (["--report", "r.json", "--itl-data", "none.csv"], "--itl-data"),
    (["--report", "r.json", "--plot", "p.xyz"], "--plot"),
    (["--report", "no/such/dir/r.json"], "--report"),
    (["--report", "r.json", "--plot", "no/such/dir/p.png"], "--plot"),
])
def test_bad_flags_exit_2_with_one_line_and_no_file(case_copy, extra, message):
    before = sorted(p.name for p in case_copy.iterdir())
    result = invoke(BASE + extra)
    assert result.code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert sorted(p.name for p in case_copy.iterdir()) == before


def test_report_and_plot(case_copy):
    result = invoke(BASE + ["--report", "r.json", "--plot", "cal.png"])
    assert result.code == 0, result.stderr
    assert result.stdout == ""
    expected = (CASES_DIR / "cal-header-warmup-rtt" / "calibration.json").read_bytes()
    assert (case_copy / "r.json").read_bytes() == expected
    assert "Matched pairs: 27 (warm-up excluded: 3, unmatched real: 2, unmatched sim: 3)" \
        in result.stderr
    head = (case_copy / "cal.png").read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    assert struct.unpack(">II", head[16:24]) == (1000, 800)
    assert not [p for p in case_copy.iterdir() if p.name.endswith(".tmp")]


def test_plot_draws_every_pair():
    src = CASES_DIR / "cal-header-warmup-rtt"
    result = calibrate(str(src / "observed.yaml"), str(src / "observed.csv"),
                       str(src / "sim.json"))
    plot = plot_calibration(result.pairs, result.report)
    n = result.report["metrics"]["ttft"]["count"]
    assert n == 25
    scatter_ttft = plot.figure.axes[0]
    assert scatter_ttft.collections[0].get_offsets().shape == (n, 2)  # one point per pair
    assert scatter_ttft.get_title() == "TTFT per request (25 pairs, MAPE 92.6%, r 0.331)"
    real, sim_ms = plot.series["ttft scatter"]
    assert real.size == sim_ms.size == n
    np.testing.assert_array_equal(real, np.array(result.pairs.ttft.real) / 1000)
    xs, ys = plot.series["e2e sim cdf"]
    np.testing.assert_array_equal(xs, np.sort(np.array(result.pairs.e2e.sim) / 1000))
    assert ys[-1] == 1.0 and ys.size == n
    assert set(plot.series) == {"ttft scatter", "ttft real cdf", "ttft sim cdf",
                                "e2e scatter", "e2e real cdf", "e2e sim cdf"}


def test_replay_then_calibrate_reproduces_the_reference_report(case_copy):
    """The whole loop on the reference's observed trace: replay writes the SimResults the
    reference wrote (case replay-obs-calibrate-input), calibrate the reference's report."""
    (case_copy / "sim.json").unlink()
    replay = invoke(["replay", "--trace-header", "observed.yaml", "--trace-data", "observed.csv",
                     "--model", "meta-llama/llama-3.1-8b-instruct", "--results-path",
                     "sim.json"])
    assert replay.code == 0, replay.stderr
    assert json.loads((case_copy / "sim.json").read_text()) == json.loads(
        (CASES_DIR / "cal-header-warmup-rtt" / "sim.json").read_text())
    result = invoke(BASE + ["--report", "r.json"])
    assert result.code == 0, result.stderr
    assert (case_copy / "r.json").read_bytes() == (
        CASES_DIR / "cal-header-warmup-rtt" / "calibration.json").read_bytes()


@pytest.mark.parametrize(("column", "text"), [
    (0, "1_0"), (19, "99999999999999999999"), (20, " 5"), (9, "+0x10"),
])
def test_trace_integers_parse_like_go_atoi(tmp_path, column, text):
    """The trace loader (shared with replay) refuses what Go's strconv.Atoi/ParseInt refuse,
    with one error naming the file: underscores, spaces, other bases, values beyond int64."""
    import csv

    from blis_fast.workload.replay import load_trace_records

    src = CASES_DIR / "cal-warmup-zero-flag" / "observed.csv"
    rows = list(csv.reader(src.open(newline="")))
    rows[1][column] = text
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)
    with pytest.raises(BlisError, match=r"--trace-data .*row 2: invalid"):
        load_trace_records(str(path))
