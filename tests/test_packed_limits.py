"""Packed fields never overflow silently: the event key's instance field, its sequence number
and the latency-backend code all have a refused-or-reported limit.

The heap's tie key holds an instance index in ``INSTANCE_BITS`` bits; a larger index would
deliver events to the wrong instance. A backend code the kernel does not know used to fall
through to trained-physics. Both are now errors: the first at validation (exit 2), the second
as a kernel status turned into ``BlisRuntimeError``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from _cli import invoke

from blis_fast import policies
from blis_fast.engine.simulate import run_engine
from blis_fast.errors import BlisRuntimeError
from blis_fast.kernels.engine.heap import MAX_INSTANCES, make_tie, tie_instance, tie_is_instance
from blis_fast.kernels.engine.latency import Backend, is_known_backend, step_time
from blis_fast.options import build_options
from blis_fast.runner import prepare

MODEL = "meta-llama/llama-3.1-8b-instruct"


def test_num_instances_beyond_the_event_key_is_refused(tmp_path):
    res = invoke(["run", "--model", MODEL, "--num-instances", "300000", "--num-requests", "5",
                  "--metrics-path", str(tmp_path / "r.json"), "--log", "error"])
    assert res.code == 2
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and "--num-instances" in lines[0] and str(MAX_INSTANCES) in lines[0]
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "r.json").exists()


def test_the_largest_instance_index_round_trips_through_the_tie_key():
    top = MAX_INSTANCES - 1
    tie = make_tie(True, top, 3, (1 << 40) - 1)
    assert tie_instance(tie) == top and tie_is_instance(tie)
    assert tie > 0  # the sign bit stays clear, so ties keep their order


def test_unknown_backend_code_has_no_step_time():
    prog = np.zeros(1, np.int64)
    for code in (-1, len(Backend), 99):
        assert not is_known_backend(code)
        assert step_time(code, np.zeros(64), 1, prog, prog + 10, prog + 10, prog + 10) == -1
    assert all(is_known_backend(c) for c in range(Backend.PROFILED + 1))


def test_kernel_refuses_an_unknown_backend_code():
    prepared = prepare(build_options({"model": MODEL, "num_requests": 3, "log": "error"}))
    bad = replace(prepared.engine, latency=replace(prepared.latency,
                                                   code=len(Backend)))
    with pytest.raises(BlisRuntimeError, match="latency backend code"):
        run_engine(prepared.table, bad, model=prepared.latency.model)


@pytest.mark.parametrize("family", ["admission", "routing", "priority", "scheduler"])
def test_kernel_refuses_an_unknown_policy_code(monkeypatch, family):
    """A code no kernel branch implements is an error status, never a silent fall-through."""
    from blis_fast.policies.registry import Policy

    prepared = prepare(build_options({"model": MODEL, "num_requests": 3, "log": "error"}))
    registry = policies.family(family)
    monkeypatch.setitem(registry.entries, "bogus", Policy("bogus", 99))
    bad = replace(prepared.engine, policies=replace(prepared.policies, **{family: "bogus"}))
    with pytest.raises(BlisRuntimeError, match="admission, routing, priority, scheduler"):
        run_engine(prepared.table, bad, model=prepared.latency.model)


def test_kernel_refuses_an_unknown_scorer_code(monkeypatch):
    from blis_fast.policies.scorers import SCORERS, Scorer

    prepared = prepare(build_options({"model": MODEL, "num_requests": 3, "log": "error"}))
    # a code between the stateful scorers and the function table
    monkeypatch.setitem(SCORERS.entries, "bogus", Scorer("bogus", reads_cache=False, code=7))
    bad = replace(prepared.engine, policies=replace(
        prepared.policies, routing="weighted", scorers=(("bogus", 1.0),)))
    with pytest.raises(BlisRuntimeError, match="scorer code"):
        run_engine(prepared.table, bad, model=prepared.latency.model)
