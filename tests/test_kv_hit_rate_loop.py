"""The KV hit-rate loop (KVO-11.3, KVO-10.3; the August reference's #1598): ``blis observe
--scrape-kv-metrics`` records the server's hit rate in the trace header, ``blis replay
--metrics-path`` writes the simulator's ``cache_hit_rate``, ``blis calibrate --sim-metrics``
holds one against the other.

The server is the loopback recording server with a scripted ``/metrics`` (``--metrics-script``):
counters it controls, faults a real vLLM cannot be made to show. Golden numbers are hand
computed from the scripted counters; the calibrate inputs are the April case
cal-header-warmup-rtt's with an ``observed_kv_metrics`` block added.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import invoke
from parity import CASES_DIR

from blis_fast.errors import BlisInputError
from blis_fast.observe.command import ObserveOptions, run_observe
from blis_fast.observe.kv_metrics import KVMetricsError, derive_hit_rate, parse_metrics_text
from blis_fast.testing.record_server import running_record_server
from blis_fast.workload.replay import load_trace_header
from blis_fast.workload.trace_v2 import ObservedKVMetrics

MODEL = "meta-llama/llama-3.1-8b-instruct"
OFFLOAD = "kv_offload:\n  cpu_bytes_to_use: 1048576000\n"

TIERED_START = (
    "# HELP vllm:kv_offload_tiering_block_queries Block lookups in the offload tiers.\n"
    "# TYPE vllm:kv_offload_tiering_block_queries counter\n"
    'vllm:kv_offload_tiering_block_queries_total{tier="cpu"} 100\n'
    'vllm:kv_offload_tiering_block_queries_total{tier="disk"} 50\n'
    'vllm:kv_offload_tiering_block_queries_created{tier="cpu"} 1.7e9\n'
    'vllm:kv_offload_tiering_block_hits_total{tier="cpu"} 10\n'
    "vllm:kv_offload_tiering_read_time_total 1.5\n"
    "vllm:gpu_prefix_cache_queries_total 7\n")
TIERED_END = (
    'vllm:kv_offload_tiering_block_queries_total{tier="cpu"} 900 1700000000000\n'
    'vllm:kv_offload_tiering_block_queries_total{tier="disk"} 250\n'
    'vllm:kv_offload_tiering_block_hits_total{tier="cpu"} 310\n'
    'vllm:kv_offload_tiering_block_hits_total{tier="disk"} 33\n'
    "vllm:kv_offload_tiering_read_time_total 4\n"
    "vllm:kv_offload_tiering_write_time_total 0.25\n"
    "vllm:gpu_prefix_cache_queries_total 70\n")
TIERED_BLOCK = ("observed_kv_metrics:\n    source: tiered\n    hit_rate: 0.333\n"
                "    block_hits: 333\n    block_queries: 1000\n    read_time_total: 2.5\n"
                "    write_time_total: 0.25\n    vllm_commit: abc123\n")
"""Hits 310 + 33 - 10 = 333 of queries 900 + 250 - 150 = 1000; read 4 - 1.5, write 0.25 - 0."""


# ---- parsing and deriving -----------------------------------------------------------------

def test_samples_are_summed_over_labels_with_total_dropped():
    got = parse_metrics_text(TIERED_START)
    assert got["vllm:kv_offload_tiering_block_queries"] == 150  # cpu + disk
    assert got["vllm:kv_offload_tiering_block_queries_created"] == 1.7e9  # its own name
    assert got["vllm:gpu_prefix_cache_queries"] == 7
    assert parse_metrics_text(TIERED_END)["vllm:kv_offload_tiering_block_queries"] == 1150


def test_tiered_counters_win_and_give_deltas():
    block = derive_hit_rate(parse_metrics_text(TIERED_START), parse_metrics_text(TIERED_END),
                            "abc123")
    assert block == ObservedKVMetrics("tiered", 0.333, 333, 1000, 2.5, 0.25, "abc123")
    assert block.header_text() == TIERED_BLOCK


@pytest.mark.parametrize("hits, queries", [("vllm:gpu_prefix_cache_hits",
                                            "vllm:gpu_prefix_cache_queries"),
                                           ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries")])
def test_gpu_prefix_cache_counters_are_the_fallback(hits, queries):
    # the older name (the reference's) and the V1 name (blis_fast's addition) read alike;
    # a name missing at the start counts from 0
    start = {queries: 40.0}
    end = {queries: 240.0, hits: 50.0, "vllm:gpu_prefix_cache_hit_rate": 0.9}
    block = derive_hit_rate(start, end)
    assert block == ObservedKVMetrics("gpu-prefix-cache-fallback", 0.25, 50, 200)
    assert "read_time_total" not in block.header_text()


def test_the_gauge_is_the_last_resort():
    block = derive_hit_rate({}, {"vllm:gpu_prefix_cache_hit_rate": 0.625}, "c")
    assert block == ObservedKVMetrics("gpu-prefix-cache-fallback", 0.625, 0, 0, vllm_commit="c")


Q, H = "vllm:kv_offload_tiering_block_queries", "vllm:kv_offload_tiering_block_hits"


@pytest.mark.parametrize("start, end, message", [
    ({Q: 10.0}, {Q: 10.0, H: 0.0}, "did not grow over the window"),
    ({Q: 10.0}, {Q: 20.0, H: 11.0}, "a hit rate above 1"),
    ({Q: 10.0}, {Q: 5.0, H: 1.0}, f"counter {Q} went backwards"),
    ({Q: 0.0, H: 9.0}, {Q: 20.0, H: 1.0}, f"counter {H} went backwards"),
    ({}, {Q: math.nan, H: 1.0}, "is not a finite number"),
    ({}, {Q: math.inf}, "is not a finite number"),
    ({}, {Q: 1e30, H: 1.0}, "more than any real count"),
    ({}, {"vllm:gpu_prefix_cache_hit_rate": 1.5}, "not a rate in [0, 1]"),
    ({}, {"vllm:gpu_prefix_cache_hit_rate": math.nan}, "not a rate in [0, 1]"),
    ({}, {"vllm:num_requests_running": 1.0}, "no KV-cache counters in /metrics"),
])
def test_a_window_without_a_sound_rate_gives_no_block(start, end, message):
    with pytest.raises(KVMetricsError, match="^.*" + message.replace("[", r"\[")
                       .replace("]", r"\]")):
        derive_hit_rate(start, end)


def test_text_that_is_not_exposition_format_is_an_error():
    with pytest.raises(KVMetricsError, match="not Prometheus exposition format"):
        parse_metrics_text("<html>oops</html>\n")


# ---- the header block ---------------------------------------------------------------------

def test_header_block_reads_back_and_is_strict(tmp_path):
    head = tmp_path / "h.yaml"
    head.write_text("trace_version: 2\nmode: real\n" + TIERED_BLOCK)
    assert load_trace_header(str(head))["observed_kv_metrics"] == ObservedKVMetrics(
        "tiered", 0.333, 333, 1000, 2.5, 0.25, "abc123")
    head.write_text("trace_version: 2\nobserved_kv_metrics:\n    source: tiered\n"
                    "    hit_rate: 0.5\n    tier: cpu\n")
    with pytest.raises(BlisInputError, match=r"unknown key 'tier' in .*observed_kv_metrics"):
        load_trace_header(str(head))


# ---- observe against the scripted server ---------------------------------------------------

def _observe(tmp: Path, script: list | None, **flags) -> tuple[str, list[dict]]:
    """One small observation (3 requests) in this process; the header text and the requests
    the server received, in order."""
    record = tmp / "received.jsonl"
    path = None
    if script is not None:
        path = tmp / "script.json"
        path.write_text(json.dumps(script))
    with running_record_server(record, metrics_script=path) as url:
        run_observe(ObserveOptions(
            server_url=url, model="m", trace_header=str(tmp / "t.yaml"),
            trace_data=str(tmp / "t.csv"), rate=50.0, num_requests=3, prompt_tokens=20,
            prompt_tokens_stdev=5, output_tokens=5, output_tokens_stdev=2,
            given=frozenset({"rate", "num_requests"}) | frozenset(flags), **flags))
    received = [json.loads(line) for line in record.read_text().splitlines()]
    return (tmp / "t.yaml").read_text(), received


@pytest.fixture(scope="module")
def tiered_trace(tmp_path_factory) -> Path:
    """An observation whose scrapes show the tiered counters of TIERED_START/END."""
    tmp = tmp_path_factory.mktemp("tiered")
    text, received = _observe(tmp, [TIERED_START, TIERED_END], scrape_kv_metrics=True,
                              vllm_commit="abc123")
    assert text.endswith("network: {}\n" + TIERED_BLOCK)
    # the window: after the token-ratio request, around the workload's three requests
    assert [(r["method"], r["path"]) for r in received] == (
        [("POST", "/v1/completions"), ("GET", "/metrics")] + [("POST", "/v1/completions")] * 3
        + [("GET", "/metrics")])
    (tmp / "offload.yaml").write_text(OFFLOAD)
    return tmp


def test_observe_writes_the_block_after_the_april_header(tiered_trace):
    assert (tiered_trace / "t.yaml").read_text().count("observed_kv_metrics:") == 1


def test_observe_without_the_flag_never_scrapes(tmp_path, caplog):
    text, received = _observe(tmp_path, [TIERED_START, TIERED_END], vllm_commit="abc")
    assert "observed_kv_metrics" not in text and text.endswith("network: {}\n")
    assert all(r["path"] != "/metrics" for r in received)
    assert "--vllm-commit without --scrape-kv-metrics: ignored" in caplog.text


@pytest.mark.parametrize("script, gets, message", [
    ([{"status": 500, "body": "down"}, TIERED_END], 1,
     "the scrape before the workload failed: GET http://127.0.0.1:"),
    ([TIERED_START, "<html>busy</html>\n"], 2, "not Prometheus exposition format"),
    ([TIERED_END, TIERED_START], 2, "went backwards over the window"),
    ([TIERED_START, TIERED_START], 2, "did not grow over the window"),
])
def test_a_failed_window_warns_and_writes_no_block(tmp_path, caplog, script, gets, message):
    text, received = _observe(tmp_path, script, scrape_kv_metrics=True)
    assert "observed_kv_metrics" not in text and text.endswith("network: {}\n")
    assert sum(r["path"] == "/metrics" for r in received) == gets  # no end scrape after a bad start
    warned = [r.getMessage() for r in caplog.records if "--scrape-kv-metrics" in r.getMessage()]
    assert len(warned) == 1 and message in warned[0], warned
    assert warned[0].endswith("the trace header will have no observed_kv_metrics")
    assert len((tmp_path / "t.csv").read_text().splitlines()) == 4  # the trace is whole


def test_an_interrupted_window_writes_no_block(tmp_path):
    """Ctrl-C ends the window early: the trace is written, the hit rate is not (no end
    scrape: the counters would cover requests the trace shows as aborted)."""
    record, script = tmp_path / "received.jsonl", tmp_path / "script.json"
    script.write_text(json.dumps([TIERED_START, TIERED_END]))
    with running_record_server(record, token_delay_ms=100, metrics_script=script) as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "blis_fast.cli", "observe", "--server-url", url, "--model",
             "m", "--rate", "20", "--num-requests", "200", "--prompt-tokens", "20",
             "--prompt-tokens-stdev", "5", "--output-tokens", "8", "--output-tokens-stdev", "2",
             "--record-itl", "--drain-timeout", "0.2", "--scrape-kv-metrics",
             "--trace-header", str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv")],
            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline and not (
                record.exists() and len(record.read_text().splitlines()) >= 5):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "the observation was interrupted, so the window has no end scrape" in err
    assert "observed_kv_metrics" not in (tmp_path / "t.yaml").read_text()
    paths = [json.loads(line)["path"] for line in record.read_text().splitlines()]
    assert paths.count("/metrics") == 1


@pytest.mark.parametrize("url", ["ftp://host/metrics", "localhost:9090/metrics", "http://"])
def test_a_bad_metrics_url_is_refused_before_sending(tmp_path, url):
    with running_record_server(tmp_path / "received.jsonl") as server:
        res = invoke(["observe", "--server-url", server, "--model", "m", "--rate", "5",
                      "--num-requests", "2", "--scrape-kv-metrics", "--kv-metrics-url", url,
                      "--trace-header", str(tmp_path / "t.yaml"),
                      "--trace-data", str(tmp_path / "t.csv")])
    assert res.code == 2 and res.stderr.count("\n") == 1
    assert "--kv-metrics-url must be an http:// or https:// URL" in res.stderr
    assert (tmp_path / "received.jsonl").read_text() == ""
    assert not (tmp_path / "t.yaml").exists()


# ---- replay ----------------------------------------------------------------------------------

def _replay(trace: Path, out: Path, *extra: str):
    return invoke(["replay", "--model", MODEL, "--trace-header", str(trace / "t.yaml"),
                   "--trace-data", str(trace / "t.csv"), *extra])


def test_a_tiered_observation_needs_an_offload_config(tiered_trace, tmp_path):
    res = _replay(tiered_trace, tmp_path, "--metrics-path", str(tmp_path / "m.json"))
    assert res.code == 2 and res.stderr.count("\n") == 1 and res.stdout == ""
    assert "source=\"tiered\"" in res.stderr and "--kv-offload-config" in res.stderr
    assert not (tmp_path / "m.json").exists()


def test_replay_writes_cache_hit_rate_and_keeps_the_block(tiered_trace, tmp_path):
    res = _replay(tiered_trace, tmp_path, "--kv-offload-config",
                  str(tiered_trace / "offload.yaml"), "--metrics-path", str(tmp_path / "m.json"),
                  "--results-path", str(tmp_path / "r.json"), "--trace-output",
                  str(tmp_path / "re"))
    assert res.code == 0, res.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    keys = list(metrics)
    # the reference's MetricsOutput order: after preemption_count, before dropped_unservable
    assert keys[keys.index("preemption_count") + 1] == "cache_hit_rate"
    assert keys[keys.index("cache_hit_rate") + 1] == "dropped_unservable"
    assert 0 <= metrics["cache_hit_rate"] <= 1 and len(metrics["requests"]) == 3
    sims = json.loads((tmp_path / "r.json").read_text())  # SimResults, as before
    assert sorted(s["request_id"] for s in sims) == [0, 1, 2]
    assert (tmp_path / "re.yaml").read_text().endswith(TIERED_BLOCK)  # copied, not measured


def test_replay_metrics_file_matches_stdout_and_run_keeps_april_keys(tmp_path):
    """``cache_hit_rate`` is the cluster's stdout Cache Hit Rate (the instances' mean); a plain
    run's metrics file has the April keys, a run with the tier chain has the key too."""
    (tmp_path / "offload.yaml").write_text(OFFLOAD)
    base = ["--model", MODEL, "--num-instances", "2", "--prefix-tokens", "256",
            "--num-requests", "40", "--rate", "20"]
    plain = invoke(["run", *base, "--metrics-path", str(tmp_path / "plain.json"),
                    "--trace-output", str(tmp_path / "gen")])
    chain = invoke(["run", *base, "--metrics-path", str(tmp_path / "chain.json"),
                    "--kv-offload-config", str(tmp_path / "offload.yaml")])
    replay = invoke(["replay", "--model", MODEL, "--num-instances", "2", "--trace-header",
                     str(tmp_path / "gen.yaml"), "--trace-data", str(tmp_path / "gen.csv"),
                     "--metrics-path", str(tmp_path / "rep.json")])
    for res in (plain, chain, replay):
        assert res.code == 0, res.stderr
    assert "cache_hit_rate" not in json.loads((tmp_path / "plain.json").read_text())
    for res, name in ((chain, "chain.json"), (replay, "rep.json")):
        rate = json.loads((tmp_path / name).read_text())["cache_hit_rate"]
        assert rate > 0.1  # 256 shared prefix tokens per request
        assert f"Cache Hit Rate: {rate:.4f}\n" in res.stdout


def test_a_gpu_fallback_observation_replays_without_offload(tiered_trace, tmp_path):
    for name in ("t.csv",):
        shutil.copy(tiered_trace / name, tmp_path / name)
    (tmp_path / "t.yaml").write_text((tiered_trace / "t.yaml").read_text().replace(
        "source: tiered", "source: gpu-prefix-cache-fallback"))
    res = _replay(tmp_path, tmp_path, "--metrics-path", str(tmp_path / "m.json"))
    assert res.code == 0, res.stderr
    assert "cache_hit_rate" in json.loads((tmp_path / "m.json").read_text())


# ---- calibrate -------------------------------------------------------------------------------

CAL = CASES_DIR / "cal-header-warmup-rtt"
BLOCK_070 = ("observed_kv_metrics:\n    source: gpu-prefix-cache-fallback\n"
             "    hit_rate: 0.7\n    block_hits: 70\n    block_queries: 100\n")


@pytest.fixture
def cal(tmp_path, monkeypatch) -> Path:
    """The April case's inputs, its header with an observed rate of 0.70, and a metrics file
    whose cache_hit_rate is 0.75."""
    for name in ("observed.yaml", "observed.csv", "sim.json"):
        shutil.copy(CAL / name, tmp_path / name)
    (tmp_path / "hr.yaml").write_text((CAL / "observed.yaml").read_text() + BLOCK_070)
    (tmp_path / "m.json").write_text('{"instance_id": "cluster", "cache_hit_rate": 0.75}')
    (tmp_path / "plain.json").write_text('{"instance_id": "cluster", "cache_hit_rate": null}')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _calibrate(header: str, *extra: str):
    return invoke(["calibrate", "--trace-header", header, "--trace-data", "observed.csv",
                   "--sim-results", "sim.json", "--report", "r.json", *extra])


def test_hit_rate_and_ttft_verdicts_join_the_april_report(cal):
    res = _calibrate("hr.yaml", "--sim-metrics", "m.json")
    assert res.code == 0, res.stderr
    report = json.loads((cal / "r.json").read_text())
    april = json.loads((CAL / "calibration.json").read_text())
    assert list(report) == [*april, "hit_rate", "ttft_tolerance"]
    assert {k: report[k] for k in april} == april
    # |0.75 - 0.70| x 100 is 5.000000000000004 in floating point: inside the 5 pp band
    assert report["hit_rate"] == {"real_hit_rate": 0.7, "sim_hit_rate": 0.75,
                                  "abs_error_pp": abs(0.75 - 0.7) * 100, "tolerance_pp": 5,
                                  "within": True, "source": "gpu-prefix-cache-fallback"}
    assert report["hit_rate"]["abs_error_pp"] > 5
    mape = april["metrics"]["ttft"]["request_level"]["mape"]  # 0.9256
    assert report["ttft_tolerance"] == {"mape": mape, "threshold": 0.15, "within": False}
    assert ("KV hit rate (gpu-prefix-cache-fallback): real 0.7000, sim 0.7500, error 5.00 pp "
            "(tolerance 5.00 pp) [WITHIN]") in res.stderr
    assert "TTFT MAPE 92.6% (threshold 15.0%) [EXCEEDS]" in res.stderr


def test_tighter_bounds_change_the_verdicts(cal):
    res = _calibrate("hr.yaml", "--sim-metrics", "m.json", "--hit-rate-tolerance-pp", "4.99",
                     "--ttft-mape-threshold", "0.93")
    assert res.code == 0, res.stderr
    report = json.loads((cal / "r.json").read_text())
    assert report["hit_rate"]["within"] is False and report["hit_rate"]["tolerance_pp"] == 4.99
    assert report["ttft_tolerance"]["within"] is True
    assert "[EXCEEDS]" in res.stderr and "TTFT MAPE 92.6% (threshold 93.0%) [WITHIN]" in res.stderr


@pytest.mark.parametrize("extra, warning", [
    ([], "no --sim-metrics was given: no hit-rate comparison"),
    (["--sim-metrics", "plain.json"], "--sim-metrics plain.json has no cache_hit_rate"),
])
def test_a_missing_sim_rate_skips_the_comparison_with_a_warning(cal, extra, warning):
    res = _calibrate("hr.yaml", *extra)
    assert res.code == 0, res.stderr
    report = json.loads((cal / "r.json").read_text())
    assert "hit_rate" not in report and "ttft_tolerance" in report
    assert warning in res.stderr


def test_an_april_calibration_keeps_the_april_report(cal):
    res = _calibrate("observed.yaml")
    assert res.code == 0, res.stderr
    assert (cal / "r.json").read_bytes() == (CAL / "calibration.json").read_bytes()
    res = _calibrate("observed.yaml", "--sim-metrics", "m.json")  # the loop asked for
    assert "--sim-metrics not used: the trace header observed.yaml has no observed_kv_metrics" \
        in res.stderr
    assert list(json.loads((cal / "r.json").read_text()))[-1] == "ttft_tolerance"


@pytest.mark.parametrize("extra, message", [
    (["--hit-rate-tolerance-pp", "-1"], "--hit-rate-tolerance-pp must be a finite number >= 0"),
    (["--hit-rate-tolerance-pp", "NaN"], "--hit-rate-tolerance-pp must be a finite number >= 0"),
    (["--ttft-mape-threshold", "+Inf"], "--ttft-mape-threshold must be a finite number >= 0"),
    (["--sim-metrics", "none.json"], "read --sim-metrics none.json"),
    (["--sim-metrics", "observed.csv"], "parse --sim-metrics observed.csv"),
    (["--sim-metrics", "bad.json"], "--sim-metrics bad.json: cache_hit_rate must be a fraction"),
])
def test_bad_loop_inputs_exit_2_with_one_line_and_no_report(cal, extra, message):
    (cal / "bad.json").write_text('{"cache_hit_rate": 1.5}')
    res = _calibrate("hr.yaml", *extra)
    assert res.code == 2 and res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert not (cal / "r.json").exists()


def test_a_corrupt_observed_rate_is_refused(cal):
    (cal / "hr.yaml").write_text((CAL / "observed.yaml").read_text()
                                 + BLOCK_070.replace("0.7", "7"))
    res = _calibrate("hr.yaml", "--sim-metrics", "m.json")
    assert res.code == 2 and "observed_kv_metrics.hit_rate must be a fraction in [0, 1]" \
        in res.stderr and not (cal / "r.json").exists()


def test_sim_metrics_serves_both_modes_and_the_bounds_only_one(cal):
    res = _calibrate("hr.yaml", "--sim-metrics", "m.json")
    assert "not used" not in res.stderr  # --sim-metrics is read outside adapter mode too
    res = invoke(["calibrate", "--adapter-reference", "none.json", "--sim-metrics", "m.json",
                  "--report", "a.json", "--hit-rate-tolerance-pp", "3"])
    assert "--hit-rate-tolerance-pp not used with --adapter-reference: ignored" in res.stderr


def test_the_whole_loop_on_the_scripted_server(tiered_trace, tmp_path):
    """observe (tiered counters, rate 0.333) -> replay with the offload config -> calibrate."""
    m, r = tmp_path / "m.json", tmp_path / "r.json"
    res = _replay(tiered_trace, tmp_path, "--kv-offload-config",
                  str(tiered_trace / "offload.yaml"), "--metrics-path", str(m),
                  "--results-path", str(r))
    assert res.code == 0, res.stderr
    sim = json.loads(m.read_text())["cache_hit_rate"]
    res = invoke(["calibrate", "--trace-header", str(tiered_trace / "t.yaml"), "--trace-data",
                  str(tiered_trace / "t.csv"), "--sim-results", str(r), "--sim-metrics", str(m),
                  "--report", str(tmp_path / "rep.json")])
    assert res.code == 0, res.stderr
    hit = json.loads((tmp_path / "rep.json").read_text())["hit_rate"]
    assert hit["real_hit_rate"] == 0.333 and hit["sim_hit_rate"] == sim
    assert hit["abs_error_pp"] == abs(sim - 0.333) * 100 and hit["source"] == "tiered"


# ---- a real vLLM server (CPU build, tiny model; -m realserver) -------------------------------

@pytest.mark.realserver
def test_real_vllm_prefix_cache_counters_give_a_block(tmp_path):
    """Released vLLM (0.32, V1 engine) names its counters vllm:prefix_cache_hits/_queries: the
    reference's scrape finds nothing there, blis_fast's records them as the GPU fallback. Six
    requests share a 320-token prefix (vLLM's CPU blocks hold 128 tokens), so later ones hit
    the prefix cache."""
    from blis_fast.testing.vllm_server import MODEL_NAME, VllmServer, VllmUnavailable

    (tmp_path / "spec.yaml").write_text(
        'version: "2"\nseed: 3\ncategory: language\naggregate_rate: 4.0\nnum_requests: 6\n'
        "clients:\n  - id: c\n    rate_fraction: 1.0\n    prefix_group: sys\n"
        "    prefix_length: 320\n    arrival:\n      process: constant\n"
        "    input_distribution:\n      type: gaussian\n"
        "      params: {mean: 20, std_dev: 0, min: 20, max: 20}\n"
        "    output_distribution:\n      type: gaussian\n"
        "      params: {mean: 4, std_dev: 0, min: 4, max: 4}\n")
    server = VllmServer()
    try:
        server.start()
    except VllmUnavailable as exc:
        pytest.skip(f"real vLLM server unavailable: {exc}")
    try:
        res = run_observe(ObserveOptions(
            server_url=server.url, model=MODEL_NAME, workload_spec=str(tmp_path / "spec.yaml"),
            timeout=120, scrape_kv_metrics=True, vllm_commit="v0.32.0",
            trace_header=str(tmp_path / "t.yaml"), trace_data=str(tmp_path / "t.csv"),
            given=frozenset({"workload_spec", "timeout"})))
    finally:
        server.stop()
    block = res.observed_kv
    print(f"\nobserved_kv_metrics: {block}")
    assert block is not None and block.source == "gpu-prefix-cache-fallback"
    assert 0 < block.block_hits <= block.block_queries and block.hit_rate > 0
    prompts = sum(o.record.server_input_tokens for o in res.result.observed)
    assert block.block_queries >= prompts - len(res.result.observed)  # queried tokens
    assert load_trace_header(str(tmp_path / "t.yaml"))["observed_kv_metrics"] == block
