"""Observations the simulator cannot learn from (issue 30): bursts, unstreamed requests and a
late client are flagged per request, by ``blis observe`` at the end of a run and in its files,
and a clean stream raises no flag."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import test_calibrate
import test_observe
from _cli import invoke
from parity import CASES_DIR

from blis_fast.errors import BlisInputError
from blis_fast.fit.verdict import MEAN_TOLERANCE, judge
from blis_fast.observe.quality import (
    BURST_GAP_FLOOR_US,
    CLIENT_LATE_US,
    assess,
    lag_per_request,
    lag_warning,
    trace_client_lag_us,
)
from blis_fast.testing.record_server import running_record_server
from blis_fast.testing.synthetic_trace import make_observed_trace

BURST_LINE = ("requests arrived in one burst: TTFT and ITL of these measure the delivery path, "
              "not the server")


def _trace(ttft_ms, itl_ms, chunks, streaming=True, ok=True):
    """Columns of a synthetic trace: send at 1 s apart, first chunk after ``ttft_ms``, then
    ``chunks - 1`` gaps of ``itl_ms`` each (arrays or scalars)."""
    n = len(ttft_ms)
    send = 1_000_000 * (np.arange(n, dtype=np.int64) + 1)
    first = send + (np.asarray(ttft_ms) * 1000).astype(np.int64)
    ch = np.broadcast_to(np.asarray(chunks, dtype=np.int64), (n,)).copy()
    last = first + (np.asarray(itl_ms) * 1000 * (ch - 1)).astype(np.int64)
    return (np.broadcast_to(streaming, (n,)), np.broadcast_to(ok, (n,)), send, first, last, ch)


# ---- the rule on synthetic traces -------------------------------------------------------------
def test_a_trace_of_bursts_is_flagged_though_its_median_gap_is_zero():
    # the trace: 56 of 60 requests delivered whole (first chunk = last chunk, TTFT = E2E
    # ~ 100 ms), 4 streamed at 2 ms a token; the trace's median gap is 0
    rng = np.random.default_rng(1)
    ttft = np.where(np.arange(60) < 56, rng.uniform(90, 110, 60), rng.uniform(5, 10, 60))
    itl = np.where(np.arange(60) < 56, 0.0, 2.0)
    q = assess(*_trace(ttft, itl, 47))
    assert int(q.burst.sum()) == 56 and not q.burst[56:].any()
    assert q.summary_lines() == [f"56 of 60 {BURST_LINE}"]
    assert int(q.usable.sum()) == 4


def test_near_zero_gaps_are_bursts_whatever_the_other_requests_do():
    # every request read in a few network reads: gaps of 40 µs, under the absolute floor
    q = assess(*_trace(np.full(20, 80.0), np.full(20, 0.04), 30))
    assert 0.04 * 1000 < BURST_GAP_FLOOR_US and q.burst.all()


def test_partly_buffered_requests_are_told_apart_from_the_streams_beside_them():
    # 12 streams at 8-12 ms a token, 6 requests flushed by a proxy in 0.4 ms gaps after
    # 400 ms: above the absolute floor, but a twentieth of the streams' gaps over a sliver
    # of their own E2E
    ttft = np.r_[np.full(12, 30.0), np.full(6, 400.0)]
    itl = np.r_[np.linspace(8, 12, 12), np.full(6, 0.4)]
    q = assess(*_trace(ttft, itl, 40))
    assert q.burst.tolist() == [False] * 12 + [True] * 6


def test_a_clean_stream_raises_no_flag():
    # long prefill, few tokens, varied decode speed: still a stream (no false alarm)
    rng = np.random.default_rng(2)
    ttft = rng.uniform(20, 900, 200)
    itl = rng.uniform(3, 40, 200)
    chunks = rng.integers(3, 200, 200)
    q = assess(*_trace(ttft, itl, chunks))
    assert not q.flagged.any() and q.summary_lines() == []


def test_unstreamed_and_failed_requests():
    streaming = np.array([False, False, True, True])
    ok = np.array([True, True, True, False])
    send = np.array([1, 2, 3, 4]) * 1_000_000
    first = send + 50_000
    last = first + np.array([0, 0, 90_000, 0])
    chunks = np.array([1, 1, 10, 0])
    first[3] = 0
    q = assess(streaming, ok, send, first, last, chunks)
    assert q.not_streamed.tolist() == [True, True, False, False]
    assert q.judged.tolist() == [True, True, True, False]
    assert q.summary_lines() == ["2 of 3 requests were not streamed: their TTFT is their E2E "
                                 "and they have no ITL"]


def test_client_lag_is_attributed_to_the_requests_in_flight():
    # samples every 10 ms from t = 0; the loop was 30 ms late once, at t = 500 ms
    t = np.arange(0, 1_000_000, 10_000)
    lag = np.where(t == 500_000, 30_000, 200)
    send = np.array([100_000, 450_000, 600_000, 0])
    end = np.array([300_000, 520_000, 900_000, 0])
    got = lag_per_request(t, lag, send, end)
    assert got.tolist() == [200, 30_000, 200, -1]
    q = assess(np.ones(4, bool), np.array([1, 1, 1, 0], bool), send, send + 1000, end,
               np.full(4, 1), got)
    assert q.client_late.tolist() == [False, True, False, False]
    assert 30_000 > CLIENT_LATE_US


def test_lag_warning_gives_percentiles_only_over_the_threshold():
    assert lag_warning(np.full(1000, 500)) is None
    assert lag_warning(np.zeros(0)) is None
    lag = np.r_[np.full(980, 500), np.full(20, 50_000)]
    msg = lag_warning(lag)
    assert msg is not None
    assert "p50 0.5 ms" in msg and "p99 50.0 ms" in msg and "max 50.0 ms" in msg
    assert "1000 checks" in msg and "--max-concurrency" in msg


# ---- blis observe against a loopback server ---------------------------------------------------
def _observe(url: str, tmp: Path, *extra: str, n: int = 6) -> tuple[int, str, list[dict]]:
    """test_observe's child-process observe, at 50 req/s, 12 output tokens, with --output-dir."""
    return test_observe._observe(url, tmp, "--output-dir", str(tmp / "out"), *extra, n=n,
                                 rate=50, output_tokens=12)


def test_observe_flags_a_server_that_flushes_each_stream_whole(tmp_path):
    # each stream takes ~13 x 3 ms at the server but reaches the client in one write
    with running_record_server(tmp_path / "r.jsonl", token_delay_ms=3,
                               buffer_stream=True) as url:
        code, err, rows = _observe(url, tmp_path, "--record-itl", "--quality-columns")
    assert code == 0, err
    assert f"6 of 6 {BURST_LINE}" in err
    assert [r["burst"] for r in rows] == ["true"] * 6
    assert all(r["not_streamed"] == "false" and int(r["client_lag_us"]) >= 0 for r in rows)
    for r in rows:  # first chunk = last chunk, over 30 ms after the send
        assert r["first_chunk_time_us"] == r["last_chunk_time_us"]
        assert int(r["first_chunk_time_us"]) - int(r["send_time_us"]) >= 30_000
    table = pq.read_table(tmp_path / "out" / "observed_requests.parquet")
    assert table.column("burst").to_pylist() == [True] * 6
    assert table.column("not_streamed").to_pylist() == [False] * 6
    assert table.schema.metadata[b"blis_fast.schema_version"] == b"2"


def test_observe_raises_no_flag_on_a_real_stream(tmp_path):
    with running_record_server(tmp_path / "r.jsonl", token_delay_ms=3) as url:
        code, err, rows = _observe(url, tmp_path, "--record-itl")
    assert code == 0, err
    assert "burst" not in err and "not streamed" not in err
    assert len(rows[0]) == 27  # the reference's columns only, without --quality-columns
    table = pq.read_table(tmp_path / "out" / "observed_requests.parquet")
    assert table.column("burst").to_pylist() == [False] * 6
    assert table.column("not_streamed").to_pylist() == [False] * 6
    assert all(v >= 0 for v in table.column("client_lag_ms").to_pylist())


def test_observe_says_when_requests_were_not_streamed(tmp_path):
    with running_record_server(tmp_path / "r.jsonl") as url:
        code, err, rows = _observe(url, tmp_path, "--no-streaming", "--quality-columns", n=4)
    assert code == 0, err
    assert "4 of 4 requests were not streamed: their TTFT is their E2E" in err
    assert [r["not_streamed"] for r in rows] == ["true"] * 4
    assert [r["burst"] for r in rows] == ["false"] * 4


def test_observe_warns_when_its_own_event_loop_runs_late(tmp_path, monkeypatch):
    # the first read of every stream holds the event loop for 40 ms (a client starved of CPU):
    # the loop's own lag check sees it, the run ends with the percentiles, and the requests in
    # flight then are flagged
    import time

    from blis_fast.observe.response import StreamParser

    real = StreamParser.feed

    def slow(self, data, now):
        if self.rec.num_chunks == 0:
            time.sleep(0.04)
        return real(self, data, now)

    monkeypatch.setattr(StreamParser, "feed", slow)
    with running_record_server(tmp_path / "r.jsonl", token_delay_ms=3) as url:
        result = invoke(["observe", "--server-url", url, "--model", "m", "--rate", "50",
                         "--num-requests", "6", "--prompt-tokens", "20", "--prompt-tokens-stdev",
                         "5", "--output-tokens", "12", "--output-tokens-stdev", "2",
                         "--record-itl", "--quality-columns", "--trace-header",
                         str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv")])
    assert result.code == 0, result.stderr
    assert "the client's own event loop ran late during the run (lag p50" in result.stderr
    assert "run the client on a less busy machine or lower --max-concurrency" in result.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "t.csv").read_text())))
    late = [r for r in rows if r["client_late"] == "true"]
    assert late and all(int(r["client_lag_us"]) > CLIENT_LATE_US for r in late)
    assert f"{len(late)} of 6 requests were in flight while the client's own event loop" \
        in result.stderr


# ---- blis calibrate ---------------------------------------------------------------------------
case_copy = test_calibrate.case_copy
"""The fixture of test_calibrate: the reference case cal-header-warmup-rtt (10 of whose 24 ok
rows past the warm-up were sent unstreamed) in a temporary working directory."""
CALIBRATE = ["calibrate", "--trace-header", "observed.yaml", "--trace-data", "observed.csv",
             "--sim-results", "sim.json", "--report", "r.json"]
UNSTREAMED = [3, 5, 6, 10, 11, 15, 16, 20, 25, 29]


def test_calibrate_grades_every_pair_by_default_and_says_what_the_flagged_ones_change(case_copy):
    result = invoke(CALIBRATE)
    assert result.code == 0, result.stderr
    # the reference's report, byte for byte
    assert (case_copy / "r.json").read_bytes() == (
        CASES_DIR / "cal-header-warmup-rtt" / "calibration.json").read_bytes()
    assert ("10 of 24 requests were not streamed: their TTFT is their E2E and they have no ITL"
            in result.stderr)
    assert "graded TTFT and ITL on every pair, flagged ones included" in result.stderr
    assert "without them: TTFT real mean=87304µs, sim mean=9473µs (-89.1%, 15 pairs)" \
        in result.stderr


def test_calibrate_exclude_flagged_grades_without_them_and_says_so(case_copy):
    result = invoke(CALIBRATE + ["--exclude-flagged"])
    assert result.code == 0, result.stderr
    report = json.loads((case_copy / "r.json").read_text())
    reference = json.loads((CASES_DIR / "cal-header-warmup-rtt" / "calibration.json").read_text())
    assert report["metrics"]["ttft"]["count"] == 15  # 25 pairs less the 10 unstreamed
    assert report["metrics"]["e2e"] == reference["metrics"]["e2e"]  # E2E on every pair
    q = report["observation_quality"]
    assert q["flagged_request_ids"] == {"burst": [], "not_streamed": UNSTREAMED,
                                        "client_late": []}
    assert q["with_flagged_workload_level"]["ttft"] == \
        reference["metrics"]["ttft"]["workload_level"]
    assert "graded TTFT and ITL without the 10 flagged request(s)" in result.stderr


def test_calibrate_flags_bursts_and_refuses_to_grade_nothing(case_copy):
    # every streamed row delivered whole: first chunk = last chunk
    rows = list(csv.reader(io.StringIO((case_copy / "observed.csv").read_text())))
    head = rows[0]
    first, last = head.index("first_chunk_time_us"), head.index("last_chunk_time_us")
    for r in rows[1:]:
        if r[head.index("streaming")] == "true" and r[head.index("status")] == "ok":
            r[first] = r[last]
    (case_copy / "observed.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    result = invoke(CALIBRATE)
    assert result.code == 0, result.stderr
    assert f"14 of 24 {BURST_LINE}" in result.stderr
    (case_copy / "r.json").unlink()
    result = invoke(CALIBRATE + ["--exclude-flagged"])
    assert result.code == 2
    assert result.stderr.count("\n") == 1
    assert "--exclude-flagged" in result.stderr and "only 1 of 25 TTFT pairs" in result.stderr
    assert not (case_copy / "r.json").exists()


def test_the_lag_column_of_a_quality_trace_is_read_back(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("request_id,x,client_lag_us\n0,a,120\n1,b,25000\n")
    assert trace_client_lag_us(str(path), 2).tolist() == [120, 25000]
    path.write_text("request_id,x,client_lag_us\n0,a,fast\n")
    with pytest.raises(BlisInputError, match="row 2: client_lag_us"):
        trace_client_lag_us(str(path), 1)
    path.write_text("request_id,x\n0,a\n")
    assert trace_client_lag_us(str(path), 1) is None


# ---- blis fit -----------------------------------------------------------------------------------
FIT_MODEL = "meta-llama/llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def bursty_trace(tmp_path_factory):
    """A simulated observation of 60 streamed requests, then the same with every stream of 3
    or more chunks delivered whole (first chunk = last chunk: TTFT = E2E)."""
    tmp = tmp_path_factory.mktemp("bursty")
    header, data = make_observed_trace(tmp / "clean", alpha=(2000.0, 1.0, 0.0),
                                       beta=(6000.0, 8.0, 150.0), rate=8, seed=4,
                                       num_requests=60, prompt_tokens=300,
                                       prompt_tokens_stdev=100, output_tokens=40,
                                       output_tokens_stdev=10)
    rows = list(csv.reader(io.StringIO(Path(data).read_text())))
    head = rows[0]
    first, last = head.index("first_chunk_time_us"), head.index("last_chunk_time_us")
    bursts = 0
    for r in rows[1:]:
        if int(r[head.index("num_chunks")]) >= 3:
            r[first] = r[last]
            bursts += 1
    bursty = tmp / "bursty.csv"
    bursty.write_text("\n".join(",".join(r) for r in rows) + "\n")
    return header, data, str(bursty), bursts


def test_fit_refuses_ttft_on_a_trace_of_bursts_and_fits_e2e_alone(bursty_trace, tmp_path):
    header, _, bursty, bursts = bursty_trace
    assert bursts == 60
    base = ["fit", "--trace-header", header, "--trace-data", bursty, "--model", FIT_MODEL,
            "--max-evaluations", "60", "--report", str(tmp_path / "r.json")]
    refused = invoke(base)
    assert refused.code == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert ("only 0 request(s) usable for TTFT once the flagged ones are left out (60 burst"
            in refused.stderr)
    assert "--weight-ttft 0" in refused.stderr and not (tmp_path / "r.json").exists()
    # E2E alone: the regression start reads the step time off E2E (every TTFT is flagged)
    e2e_only = invoke(base + ["--weight-ttft", "0"])
    assert e2e_only.code == 0, e2e_only.stderr
    assert "fit: converged: mean E2E" in e2e_only.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["traces"][0]["left_out_of_ttft_itl"]["burst"] == list(range(60))
    assert "60 request(s) left out of TTFT and ITL, E2E kept: 60 delivered in one burst" \
        in e2e_only.stderr
    # E2E was fitted on every request; TTFT has no pair left to grade
    assert set(report["traces"][0]["calibration"]["metrics"]) == {"e2e"}
    assert set(report["verdict"]["means"]) == {"e2e"}


def test_a_clean_trace_raises_no_flag_and_fits(bursty_trace, tmp_path):
    header, clean, _, _ = bursty_trace
    res = invoke(["fit", "--trace-header", header, "--trace-data", clean, "--model", FIT_MODEL,
                  "--max-evaluations", "200", "--report", str(tmp_path / "r.json")])
    assert res.code == 0, res.stderr
    assert "left out" not in res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    verdict = report["verdict"]
    assert verdict["result"] == "converged" and verdict["loss_improved"]
    for metric in ("ttft", "e2e"):
        assert abs(verdict["means"][metric]["error"]) <= MEAN_TOLERANCE
    assert "fit: converged: mean TTFT" in res.stderr


def test_a_fit_that_misses_its_training_means_is_not_called_converged(bursty_trace, tmp_path):
    # one evaluation: the search cannot get near the answer
    header, clean, _, _ = bursty_trace
    res = invoke(["fit", "--trace-header", header, "--trace-data", clean, "--model", FIT_MODEL,
                  "--max-evaluations", "1", "--report", str(tmp_path / "r.json"),
                  "--out-coeffs", str(tmp_path / "c.json")])
    assert res.code == 3, res.stderr
    assert "fit: did not fit: mean TTFT" in res.stderr and "converged" not in res.stderr
    verdict = json.loads((tmp_path / "r.json").read_text())["verdict"]
    assert verdict["result"] == "did not fit"
    assert json.loads((tmp_path / "c.json").read_text())["latency_model"] == "blackbox"
    assert res.stdout.startswith("--latency-model blackbox")


def test_the_verdict_needs_every_weighted_mean_within_tolerance_and_a_lower_loss():
    from blis_fast.calibrate.pairing import CalibrationPairs

    pairs = CalibrationPairs()
    for rid in range(4):
        pairs.ttft.add(rid, 100.0, 105.0)
        pairs.e2e.add(rid, 1000.0, 1380.0)  # the issue's +38 %
    weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
    v = judge([pairs], weights, start_loss=0.5, loss=0.2)
    assert not v.fitted and v.word == "did not fit"
    assert v.means["e2e"]["error"] == pytest.approx(0.38) and not v.means["e2e"]["within"]
    assert "mean E2E +38.0% (real 1 ms, sim 1.38 ms) OUT" in v.line()
    assert judge([pairs], dict(weights, e2e=0.0), 0.5, 0.2).fitted  # E2E not fitted
    assert not judge([pairs], dict(weights, e2e=0.0), 0.2, 0.2).fitted  # loss not improved
