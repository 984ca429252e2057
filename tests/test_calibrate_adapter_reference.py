"""``blis calibrate --adapter-reference`` (LORA-9.1..9.4): the checks in the reference's order,
the report's figures worked out by hand from ``|blis - dt| / |dt|``, and the stderr verdicts.

The reference case lora-calibrate-adapter-reference (tests/test_parity.py) checks the report
byte for byte against the August reference's; these tests cover the paths it does not take.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import invoke

# DT: aware ttft 100 ms, 50 tok/s; blind ttft 80 ms, 40 tok/s.
DT = {"model": "m", "adapter_aware": {"ttft": 100, "output_throughput": 50,
                                      "total_throughput": 999},
      "adapter_blind": {"ttft": 80, "output_throughput": 40}, "provenance": {"note": "x"}}
# BLIS aware: ttft 110 ms, 1200 tokens in 20 s = 60 tok/s; blind: 55 ms, 1200 / 30 s = 40 tok/s.
AWARE = {"ttft_mean_ms": 110, "total_output_tokens": 1200, "vllm_estimated_duration_s": 20,
         "requests": [{"id": "r0"}], "adapters": {"a0": {"load_count": 1}}}
BLIND = {"ttft_mean_ms": 55, "total_output_tokens": 1200, "vllm_estimated_duration_s": 30}

BASE = ["calibrate", "--adapter-reference", "dt.json", "--sim-metrics", "aware.json",
        "--report", "r.json"]


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """A working directory holding dt.json, aware.json and blind.json."""
    for name, obj in (("dt.json", DT), ("aware.json", AWARE), ("blind.json", BLIND)):
        (tmp_path / name).write_text(json.dumps(obj))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def report_of(work: Path) -> dict:
    return json.loads((work / "r.json").read_text())


def test_report_figures_by_hand_with_blind(work):
    result = invoke(BASE + ["--sim-metrics-blind", "blind.json"])
    assert result.code == 0, result.stderr
    assert result.stdout == ""
    # ttft: |110-100|/100 = 0.1; ratios 110/55 = 2 vs 100/80 = 1.25: |2-1.25|/1.25 = 0.6.
    # throughput: |60-50|/50 = 0.2 (= the threshold: within); 60/40 = 1.5 vs 50/40 = 1.25: 0.2.
    expected = (
        '{\n  "model": "m",\n  "mape_threshold": 0.2,\n  "metrics": [\n'
        '    {\n      "metric": "ttft",\n      "dt_value": 100,\n      "blis_value": 110,\n'
        '      "mape": 0.1,\n      "within_threshold": true,\n      "delta_mape": 0.6\n    },\n'
        '    {\n      "metric": "throughput",\n      "dt_value": 50,\n      "blis_value": 60,\n'
        '      "mape": 0.2,\n      "within_threshold": true,\n      "delta_mape": 0.2\n    }\n'
        '  ],\n  "all_within_threshold": true\n}')
    assert (work / "r.json").read_text() == expected  # two-space indent, no trailing newline
    assert result.stderr.splitlines() == [
        'level=INFO msg="Adapter-reference comparison (m) written to r.json (MAPE threshold 20%)"',
        'level=INFO msg="  ttft        BLIS=110.00 DT=100.00 MAPE=10.0% [WITHIN] '
        'delta-normalized MAPE=60.0%"',
        'level=INFO msg="  throughput  BLIS=60.00 DT=50.00 MAPE=20.0% [WITHIN] '
        'delta-normalized MAPE=20.0%"',
    ]


def test_exceeding_metric_is_a_warning_and_the_verdict_fails_with_exit_0(work):
    result = invoke(BASE + ["--adapter-mape-threshold", "0.15"])
    assert result.code == 0, result.stderr
    report = report_of(work)
    assert report["mape_threshold"] == 0.15
    assert [m["within_threshold"] for m in report["metrics"]] == [True, False]
    assert report["all_within_threshold"] is False
    assert all("delta_mape" not in m for m in report["metrics"])  # no blind file: no delta
    lines = result.stderr.splitlines()
    assert lines[0].endswith('written to r.json (MAPE threshold 15%)"')
    assert lines[1] == 'level=INFO msg="  ttft        BLIS=110.00 DT=100.00 MAPE=10.0% [WITHIN]"'
    assert lines[2] == ('level=WARNING msg="  throughput  BLIS=60.00 DT=50.00 MAPE=20.0% '
                        '[EXCEEDS]"')
    assert lines[3].startswith('level=WARNING msg="SC-007 not satisfied on all metrics for m '
                               'at MAPE<=15% ')
    assert len(lines) == 4


def test_zero_blind_value_skips_that_delta_with_a_warning(work):
    (work / "dt.json").write_text(json.dumps({**DT, "adapter_blind": {"output_throughput": 40}}))
    result = invoke(BASE + ["--sim-metrics-blind", "blind.json"])
    assert result.code == 0, result.stderr
    ttft, tput = report_of(work)["metrics"]
    assert "delta_mape" not in ttft and tput["delta_mape"] == 0.2
    skipped = [ln for ln in result.stderr.splitlines() if "diagnostic skipped" in ln]
    assert len(skipped) == 1 and 'skipped for "ttft"' in skipped[0]
    assert skipped[0].startswith("level=WARNING")


def test_inputs_decode_like_go_encoding_json(work):
    """Keys match case-insensitively (exact first), unknown keys are ignored, null leaves the
    earlier value, a later duplicate wins; the BLIS figures are ttft_mean_ms and
    total_output_tokens / vllm_estimated_duration_s."""
    (work / "dt.json").write_text(
        '{"MODEL": "x", "model": "m", "Adapter_Aware": {"TTFT": 40, "output_throughput": 64},'
        ' "adapter_aware": {"ttft": 50}, "adapter_blind": null, "extra": [1, {"a": 2}]}')
    (work / "aware.json").write_text(
        '{"ttft_mean_ms": 60, "ttft_mean_ms": null, "TOTAL_OUTPUT_TOKENS": 96,'
        ' "vllm_estimated_duration_s": 2, "instance_id": "cluster", "new_key": "s"}')
    result = invoke(BASE)
    assert result.code == 0, result.stderr
    report = report_of(work)
    assert report["model"] == "m"
    ttft, tput = report["metrics"]
    # The second adapter_aware object sets ttft only: output_throughput keeps 64.
    assert (ttft["dt_value"], ttft["blis_value"], ttft["mape"]) == (50, 60, 0.2)
    assert (tput["dt_value"], tput["blis_value"], tput["mape"]) == (64, 48, 0.25)


def test_trace_flags_are_ignored_with_a_warning(work):
    result = invoke(BASE + ["--trace-header", "none.yaml", "--plot", "p.png"])
    assert result.code == 0, result.stderr
    assert result.stderr.splitlines()[0] == (
        'level=WARNING msg="--trace-header, --plot not used with --adapter-reference: ignored"')
    assert not (work / "p.png").exists()


def _write(work: Path, name: str, text: str) -> None:
    (work / name).write_text(text)


# Each case also carries the errors that come later in the order, so the first one must win.
ERRORS = [
    (["calibrate", "--adapter-reference", "none.json", "--adapter-mape-threshold", "0"], {},
     "--sim-metrics is required with --adapter-reference (BLIS aggregate MetricsOutput from "
     "run/replay --metrics-path)"),
    (["calibrate", "--adapter-reference", "none.json", "--sim-metrics", "aware.json",
      "--adapter-mape-threshold", "0"], {}, "--report is required"),
    (BASE + ["--adapter-mape-threshold", "0", "--sim-metrics", "none.json"],
     {"dt.json": "{"}, "--adapter-mape-threshold must be a finite number > 0, got 0"),
    (BASE + ["--adapter-mape-threshold", "NaN"], {}, "finite number > 0, got NaN"),
    (BASE + ["--adapter-mape-threshold", "+Inf"], {}, "finite number > 0, got +Inf"),
    (BASE + ["--adapter-mape-threshold", "-0.5"], {}, "finite number > 0, got -0.5"),
    (["calibrate", "--adapter-reference", "none.json", "--sim-metrics", "none.json",
      "--report", "r.json"], {}, "reading adapter reference none.json: "),
    (BASE, {"dt.json": "{", "aware.json": "{"}, "parsing adapter reference dt.json: "),
    (BASE, {"dt.json": '{"adapter_aware": {"ttft": "95"}}'},
     "parsing adapter reference dt.json: cannot unmarshal string into adapter_aware.ttft"),
    (BASE, {"dt.json": '{"adapter_aware": {"ttft": NaN}}'}, "parsing adapter reference dt.json"),
    (BASE, {"dt.json": '{"adapter_aware": {"ttft": 1e400}}'}, "number 1e400"),
    (BASE, {"dt.json": '[]'}, "parsing adapter reference dt.json"),
    (BASE, {"dt.json": '{"adapter_aware": {"ttft": 0, "output_throughput": 7.5}}',
            "aware.json": "{"},
     "adapter reference dt.json: adapter_aware ttft/output_throughput must be positive "
     "(got ttft=0 tput=7.5)"),
    (BASE, {"dt.json": 'null'}, "must be positive (got ttft=0 tput=0)"),
    (BASE, {"dt.json": json.dumps({**DT, "adapter_blind": {"ttft": -1}})},
     "adapter_blind ttft/output_throughput must be >= 0 (got ttft=-1 tput=0)"),
    (BASE[:4] + ["none.json", "--report", "r.json", "--sim-metrics-blind", "none.json"], {},
     "Failed to read sim metrics from none.json: "),
    (BASE, {"aware.json": "{,}"}, "Failed to parse sim metrics JSON from aware.json: "),
    (BASE, {"aware.json": '{"total_output_tokens": 1.5, "vllm_estimated_duration_s": 2}'},
     "Failed to parse sim metrics JSON from aware.json: cannot unmarshal number 1.5 into "
     "total_output_tokens"),
    (BASE, {"aware.json": '{"requests": {}, "vllm_estimated_duration_s": 2}'},
     "Failed to parse sim metrics JSON from aware.json: cannot unmarshal object into requests"),
    (BASE + ["--sim-metrics-blind", "none.json"], {"aware.json": '{"ttft_mean_ms": 5}'},
     "sim metrics aware.json: vllm_estimated_duration_s must be > 0 to compute throughput, "
     "got 0"),
    (BASE, {"aware.json": '{"vllm_estimated_duration_s": -1.5}'}, "got -1.5"),
    (BASE, {"aware.json": '{"vllm_estimated_duration_s": 1, "total_output_tokens": -3}'},
     "sim metrics aware.json: total_output_tokens must be >= 0, got -3"),
    (BASE + ["--sim-metrics-blind", "none.json"], {},
     "Failed to read sim metrics from none.json: "),
    (BASE + ["--sim-metrics-blind", "blind.json"], {"blind.json": "{}"},
     "sim metrics blind.json: vllm_estimated_duration_s must be > 0"),
    (BASE[:-1] + ["no/such/dir/r.json"], {}, "--report no/such/dir/r.json: "),
    (BASE[:-1] + ["dt.json"], {}, "--report dt.json: is also an input of this run"),
    # ratio of the DT side overflows (1e10 / 1e-300): NaN error, which JSON cannot hold.
    (BASE + ["--sim-metrics-blind", "blind.json"],
     {"dt.json": json.dumps({**DT, "adapter_blind": {"ttft": 1e-300, "output_throughput": 1},
                             "adapter_aware": {"ttft": 1e10, "output_throughput": 1}})},
     "adapter-reference report: metrics[0] (ttft) delta_mape is NaN; JSON cannot hold it"),
]


@pytest.mark.parametrize(("argv", "files", "message"), ERRORS)
def test_each_error_in_order_one_line_exit_2_no_report(work, argv, files, message):
    for name, text in files.items():
        _write(work, name, text)
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    result = invoke(argv)
    assert result.code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("blis: error: ")
    assert message in result.stderr, result.stderr
    assert {p.name: p.read_bytes() for p in work.iterdir()} == before  # nothing written


def test_adapter_flags_without_adapter_reference_are_named_as_ignored(work):
    result = invoke(["calibrate", "--sim-metrics-blind", "blind.json",
                     "--adapter-mape-threshold", "0.5"])
    assert result.code == 2  # the trace mode's own first check
    lines = result.stderr.splitlines()
    assert lines == ['level=WARNING msg="--sim-metrics-blind, --adapter-mape-threshold not used '
                     'without --adapter-reference: ignored"',
                     "blis: error: --trace-header is required"]
