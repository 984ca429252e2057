"""User policy hooks through the Python API, and the built-in extension recipe (docs/extending.md)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import cfunc

import blis_fast
from blis_fast.errors import BlisConfigError
from blis_fast.kernels.cluster import hooks as H

BASE = dict(model="meta-llama/llama-3.1-8b-instruct", num_instances=4, rate=40,
            num_requests=300, total_kv_blocks=3000, log="error")


@numba.njit
def prefer_last_instance(snapshots, request, out):
    n = snapshots.shape[0]
    for i in range(n):
        out[i] = 1.0 if i == n - 1 else 0.0


@numba.njit
def shortest_queue(snapshots, request, out):
    for i in range(snapshots.shape[0]):
        out[i] = 1.0 / (1.0 + snapshots[i, H.SNAP_QUEUE] + snapshots[i, H.SNAP_IN_FLIGHT])


def _handled_by(result) -> np.ndarray:
    return np.asarray(result.requests.handled_by)


def test_custom_scorer_drives_routing():
    r = blis_fast.run(**BASE, routing_policy="weighted", routing_scorers="custom:1",
                      custom_scorer=prefer_last_instance)
    assert set(_handled_by(r).tolist()) == {3}
    rr = blis_fast.run(**BASE)
    assert set(_handled_by(rr).tolist()) == {0, 1, 2, 3}


def test_changing_the_scorer_changes_the_routing():
    a = blis_fast.run(**BASE, routing_policy="weighted", routing_scorers="custom:1",
                      custom_scorer=prefer_last_instance)
    b = blis_fast.run(**BASE, routing_policy="weighted", routing_scorers="custom:1",
                      custom_scorer=shortest_queue)
    assert not np.array_equal(_handled_by(a), _handled_by(b))


def test_custom_scheduler_key_reproduces_sjf():
    @numba.njit
    def input_length(features):
        return features[H.KEY_INPUT_LEN]

    kw = dict(BASE, num_instances=1, rate=80, max_num_running_reqs=4)
    custom = blis_fast.run(**kw, scheduler="custom", custom_scheduler_key=input_length)
    sjf = blis_fast.run(**kw, scheduler="sjf")
    assert custom.stdout == sjf.stdout


def test_custom_admission_rejects_what_it_refuses():
    @numba.njit
    def short_inputs_only(snapshots, request):
        return request[H.REQ_INPUT_LEN] < 400

    r = blis_fast.run(**BASE, admission_policy="custom", custom_admission=short_inputs_only)
    inputs = np.asarray(r.requests.num_prefill_tokens)
    assert len(inputs) > 0 and inputs.max() < 400
    assert r.simulation.rejected_admission == BASE["num_requests"] - len(inputs)


def test_custom_needs_a_function():
    with pytest.raises(BlisConfigError, match="custom"):
        blis_fast.run(**BASE, scheduler="custom")
    with pytest.raises(BlisConfigError, match="custom"):
        blis_fast.run(**BASE, routing_policy="weighted", routing_scorers="custom:1")


def test_extension_recipe_registers_a_builtin_scorer(monkeypatch):
    """Follow docs/extending.md: one cfunc with SCORER_SIG, one ``register`` line in
    ``blis_fast/policies/scorers.py`` (here an entry added for the test's duration)."""

    def fewest_running(snapshots, request, out):
        for i in range(snapshots.shape[0]):
            out[i] = 1.0 / (1.0 + snapshots[i, H.SNAP_BATCH])

    from blis_fast.policies.scorers import SCORERS, Scorer

    monkeypatch.setitem(SCORERS.entries, "fewest-running", Scorer(
        "fewest-running", reads_cache=False, function=cfunc(H.SCORER_SIG)(fewest_running)))
    builtin = blis_fast.run(**BASE, routing_policy="weighted",
                            routing_scorers="fewest-running:1")
    as_hook = blis_fast.run(**BASE, routing_policy="weighted", routing_scorers="custom:1",
                            custom_scorer=fewest_running)
    assert builtin.stdout == as_hook.stdout
    assert not np.array_equal(_handled_by(builtin), _handled_by(blis_fast.run(**BASE)))
