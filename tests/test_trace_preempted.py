"""The trace export writes chunk times only while a request's first token stands: one
preempted after it and timed out before its prefill ran again has none (the April reference's
trace for the same command, tests/trace_preempted/)."""

from __future__ import annotations

import csv
from pathlib import Path

from _cli import invoke

HERE = Path(__file__).parent / "trace_preempted"
ARGS = ["run", "--model", "codellama/codellama-34b-instruct-hf", "--seed", "88804",
        "--scheduler", "sjf", "--total-kv-blocks", "400", "--rate", "100", "--workload",
        "chatbot", "--timeout", "1"]


def test_trace_of_a_request_preempted_after_its_first_token(tmp_path):
    res = invoke([*ARGS, "--trace-output", str(tmp_path / "ours")])
    assert res.code == 0, res.stderr
    ours = (tmp_path / "ours.csv").read_text()
    reference = (HERE / "reference.csv").read_text()
    rows = list(csv.DictReader(reference.splitlines()))
    row = rows[39]  # got a first token, was preempted, timed out before re-prefill
    assert row["status"] == "timeout" and row["first_chunk_time_us"] == "0"
    assert ours == reference


def test_the_result_keeps_the_ttft_the_trace_leaves_out():
    import blis_fast

    sim = blis_fast.run(model="codellama/codellama-34b-instruct-hf", seed=88804,
                        scheduler="sjf", total_kv_blocks=400, rate=100, workload="chatbot",
                        timeout=1).simulation
    assert sim.ttft_us[39] > 0 and not sim.ttft_standing[39] and sim.preemptions[39] >= 1
    # a first token stands exactly for the requests that have one and were not preempted after it
    assert (sim.ttft_standing <= (sim.ttft_us >= 0)).all()
