"""A run that keeps stepping without work is stopped with one clear error instead of filling
the memory with its step log (Status.NO_PROGRESS, ``engine.simulate.step_budget``)."""

from __future__ import annotations

import pytest

import blis_fast
from blis_fast.engine import simulate as engine_simulate
from blis_fast.errors import BlisRuntimeError
from tests._cli import invoke

MODEL = "meta-llama/llama-3.1-8b-instruct"
RUN = dict(model=MODEL, num_requests=200, rate=50.0, seed=3, log="error")


def test_the_budget_is_far_above_the_steps_of_runs_that_progress(monkeypatch):
    budgets = []
    real = engine_simulate.step_budget

    def recorded(*args):
        budgets.append(real(*args))
        return budgets[-1]

    monkeypatch.setattr(engine_simulate, "step_budget", recorded)
    # one request per batch: a decode step per output token, the most steps per token
    res = blis_fast.run(**dict(RUN, max_num_running_reqs=1))
    assert res.summary["completed_requests"] > 100
    steps = len(res.simulation.step_time)
    tokens = int(res.simulation.table.input_len.sum() + res.simulation.table.output_len.sum())
    assert budgets == [16 * tokens + 1_000_000]
    assert 0 < steps < tokens < budgets[0] // 16


def test_a_run_past_the_step_budget_stops_with_one_error(monkeypatch, tmp_path):
    monkeypatch.setattr(engine_simulate, "step_budget", lambda *args: 1500)
    with pytest.raises(BlisRuntimeError, match="more steps than its requests' tokens can need"):
        blis_fast.run(**dict(RUN, max_num_running_reqs=1))  # thousands of steps
    out = tmp_path / "m.json"
    res = invoke(["run", "--model", MODEL, "--num-requests", "200", "--rate", "50", "--seed", "3",
                  "--max-num-running-reqs", "1", "--metrics-path", str(out)])
    assert res.code != 0
    lines = res.stderr.strip().splitlines()
    assert "--timeout" in lines[-1] and "Traceback" not in res.stderr
    assert not out.exists()
