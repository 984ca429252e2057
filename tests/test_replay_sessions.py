"""``blis replay --session-mode closed-loop`` (DELTA-65): a trace's sessions replayed with
follow-ups generated at completion, their lengths and think times taken from the trace."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import yaml

import blis_fast
from blis_fast.cli import main
from blis_fast.options import build_options
from blis_fast.runner import execute_replay

MODEL = "meta-llama/llama-3.1-8b-instruct"
HORIZON = 200_000_000


@pytest.fixture(scope="module")
def session_trace(tmp_path_factory):
    """A trace of 12 closed-loop 3-round sessions (exported by ``blis run``), plus its rows."""
    d = tmp_path_factory.mktemp("trace")
    spec = {"version": "2", "seed": 11, "aggregate_rate": 30.0, "num_requests": 36,
            "clients": [{
                "id": "chat", "rate_fraction": 1.0, "prefix_group": "sys", "prefix_length": 32,
                "arrival": {"process": "poisson"},
                "input_distribution": {"type": "gaussian", "params": {
                    "mean": 80, "std_dev": 20, "min": 20, "max": 200}},
                "output_distribution": {"type": "gaussian", "params": {
                    "mean": 40, "std_dev": 10, "min": 5, "max": 100}},
                "reasoning": {"multi_turn": {"max_rounds": 3, "think_time_us": 100_000}}}]}
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    blis_fast.run(model=MODEL, workload_spec=str(d / "spec.yaml"),
                  trace_output=str(d / "t"))
    with open(d / "t.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return d, rows


def _replay(d, **extra):
    opts = {"model": MODEL, "trace_header": str(d / "t.yaml"), "trace_data": str(d / "t.csv")}
    opts.update(extra)
    return execute_replay(build_options(opts))


def test_closed_loop_replays_every_round_with_the_traces_lengths(session_trace, tmp_path):
    d, rows = session_trace
    res = _replay(d, session_mode="closed-loop", horizon=HORIZON,
                  trace_output=str(tmp_path / "out"), results_path=str(tmp_path / "res.json"))
    table = res.simulation.table
    n0 = sum(1 for r in rows if r["round_index"] == "0")
    assert table.n == len(rows) > n0  # every recorded round, rounds >= 1 made by the engine
    assert len(table.extra_ids) == len(rows) - n0
    recorded = {(r["session_id"], int(r["round_index"])): r for r in rows}
    completion = {}
    for k in range(table.n):
        key = (table.sessions[table.session_idx[k]], int(table.round_index[k]))
        rec = recorded[key]
        # sequence samplers: a follow-up has its round's recorded lengths (a prefix comes back
        # only with a prefix group; multi-turn rounds carry none)
        prefix = int(rec["prefix_length"]) if rec["prefix_group"] else 0
        assert int(table.input_len[k]) == int(rec["input_tokens"]) + prefix
        assert int(table.output_len[k]) == int(rec["output_tokens"])
        completion[key] = int(table.arrival_us[k]) + int(res.simulation.e2e_us[k])
    for k in range(n0, table.n):
        sid = table.sessions[table.session_idx[k]]
        rnd = int(table.round_index[k])
        gap = (int(recorded[(sid, rnd)]["arrival_time_us"])
               - int(recorded[(sid, rnd - 1)]["arrival_time_us"]))
        # think time = the trace's arrival gap between the two rounds, after the parent ended
        assert int(table.arrival_us[k]) == completion[(sid, rnd - 1)] + max(gap, 0)
    # the exported trace and the results file hold the injected requests only
    with open(tmp_path / "out.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == n0
    assert len(json.loads((tmp_path / "res.json").read_text())) == n0


def test_think_time_flag_replaces_the_trace_gaps(session_trace):
    d, rows = session_trace
    res = _replay(d, session_mode="closed-loop", horizon=HORIZON, think_time_ms=7)
    sim = res.simulation
    table = sim.table
    ends = {}
    for k in range(table.n):
        ends[(int(table.session_idx[k]), int(table.round_index[k]))] = (
            int(table.arrival_us[k]) + int(sim.e2e_us[k]))
    follow = [k for k in range(table.n) if table.round_index[k] > 0]
    assert follow
    for k in follow:
        parent = ends[(int(table.session_idx[k]), int(table.round_index[k]) - 1)]
        assert int(table.arrival_us[k]) == parent + 7_000


def test_fixed_mode_replays_the_recorded_arrivals(session_trace):
    d, rows = session_trace
    res = _replay(d, horizon=HORIZON)
    table = res.simulation.table
    assert not table.extra_ids and table.n == len(rows)
    assert np.array_equal(table.arrival_us,
                          np.array([int(r["arrival_time_us"]) for r in rows]))


def test_closed_loop_is_deterministic(session_trace):
    d, _rows = session_trace
    one = _replay(d, session_mode="closed-loop", horizon=HORIZON,
                  think_time_dist="lognormal:mu=3,sigma=0.5")
    two = _replay(d, session_mode="closed-loop", horizon=HORIZON,
                  think_time_dist="lognormal:mu=3,sigma=0.5")
    assert one.stdout == two.stdout
    assert one.requests_frame().equals(two.requests_frame())


@pytest.mark.parametrize(("args", "message"), [
    (["--session-mode", "open"], '--session-mode must be "fixed" or "closed-loop", got "open"'),
    (["--think-time-ms", "5"], "--think-time-ms requires --session-mode closed-loop"),
    (["--think-time-dist", "constant:value=1ms"],
     "--think-time-dist requires --session-mode closed-loop"),
    (["--session-mode", "closed-loop", "--think-time-ms", "5", "--think-time-dist",
      "constant:value=1ms"], "--think-time-ms and --think-time-dist are mutually exclusive"),
    (["--session-mode", "closed-loop", "--think-time-ms", "-1"],
     "--think-time-ms must be non-negative, got -1"),
    (["--session-mode", "closed-loop", "--think-time-dist", "uniform:a=1"],
     '--think-time-dist: unsupported think-time-dist type "uniform"'),
])
def test_bad_session_flags(session_trace, capsys, args, message):
    d, _rows = session_trace
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--model", MODEL, "--trace-header", str(d / "t.yaml"),
              "--trace-data", str(d / "t.csv"), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_non_consecutive_rounds_are_rejected(session_trace, tmp_path, capsys):
    d, rows = session_trace
    broken = [dict(r) for r in rows if r["round_index"] != "1"]  # drop every round 1
    with open(tmp_path / "t.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(broken)
    (tmp_path / "t.yaml").write_text((d / "t.yaml").read_text())
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--model", MODEL, "--trace-header", str(tmp_path / "t.yaml"),
              "--trace-data", str(tmp_path / "t.csv"), "--session-mode", "closed-loop"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "non-consecutive round indices (expected 1, got 2)" in err[0]


@pytest.mark.parametrize(("column", "value"), [
    ("input_tokens", " 80"), ("input_tokens", "80 "), ("input_tokens", "1_000"),
    ("input_tokens", "\u0668\u0660"), ("input_tokens", "+-80"), ("input_tokens", "0x50"),
    ("arrival_time_us", "1e3"), ("deadline_us", "99999999999999999999"),
    ("reason_ratio", " 0.5"), ("reason_ratio", "1e400"), ("reason_ratio", "\uff10"),
])
def test_trace_csv_numbers_are_read_as_go_reads_them(session_trace, tmp_path, capsys, column,
                                                     value):
    """Integer columns are strconv.Atoi / ParseInt(s, 10, 64) and reason_ratio is ParseFloat
    (sim/workload/tracev2.go): no spaces, separators, base prefixes or non-ASCII digits (which
    Python's int() and float() accepted before)."""
    d, rows = session_trace
    edited = [dict(r) for r in rows]
    edited[0][column] = value
    with open(tmp_path / "t.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(edited)
    (tmp_path / "t.yaml").write_text((d / "t.yaml").read_text())
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--model", MODEL, "--trace-header", str(tmp_path / "t.yaml"),
              "--trace-data", str(tmp_path / "t.csv")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace-data" in err[0] and f"invalid {column}" in err[0], err


def test_trace_csv_reason_ratio_takes_go_spellings(session_trace, tmp_path):
    """ParseFloat accepts a hex float and digit separators: 0x1p-1 and 0.5_0 read as 0.5."""
    from blis_fast.workload.replay import load_trace_records

    d, rows = session_trace
    edited = [dict(r) for r in rows]
    edited[0]["reason_ratio"], edited[1]["reason_ratio"] = "0x1p-1", "0.5_0"
    with open(tmp_path / "t.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(edited)
    assert load_trace_records(str(tmp_path / "t.csv")).reason_ratio[:2].tolist() == [0.5, 0.5]
