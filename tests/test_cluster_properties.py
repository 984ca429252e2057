"""Properties of the cluster control plane on random configurations (issue: cluster)."""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.kernels import hooks as H
from blis_fast.policies.routing import ROUTING
from blis_fast.policies.scorers import SCORERS

MODEL = "meta-llama/llama-3.1-8b-instruct"
SCORER_NAMES = SCORERS.valid_names()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_inst=st.integers(1, 8), rate=st.floats(1.0, 300.0),
       policy=st.sampled_from(ROUTING.valid_names()),
       scorers=st.lists(st.sampled_from(SCORER_NAMES), min_size=1, max_size=4, unique=True),
       seed=st.integers(0, 10_000))
def test_routing_targets_stay_inside_the_cluster(n_inst, rate, policy, scorers, seed):
    spec = ",".join(f"{name}:{k + 1}" for k, name in enumerate(scorers))
    extra = {"routing_scorers": spec} if policy == "weighted" else {}
    r = blis_fast.run(model=MODEL, num_instances=n_inst, rate=rate, num_requests=60, seed=seed,
                      routing_policy=policy, prefix_tokens=64, log="error", **extra)
    handled = np.asarray(r.requests.handled_by)
    assert len(handled) == 60
    assert handled.min() >= 0 and handled.max() < n_inst


@settings(max_examples=15, deadline=None)
@given(n_inst=st.integers(1, 8), k=st.integers(1, 12), rate=st.floats(0.5, 200.0))
def test_round_robin_spreads_requests_evenly(n_inst, k, rate):
    r = blis_fast.run(model=MODEL, num_instances=n_inst, rate=rate, num_requests=n_inst * k,
                      log="error")
    counts = np.bincount(np.asarray(r.requests.handled_by), minlength=n_inst)
    assert counts.tolist() == [k] * n_inst


@numba.njit
def _call_scorer(fn, snapshots, request, out):
    fn(snapshots, request, out)


LOAD_COLUMNS = (H.SNAP_QUEUE, H.SNAP_BATCH, H.SNAP_IN_FLIGHT, H.SNAP_KV_UTIL)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from([n for n in SCORER_NAMES if SCORERS.entries[n].function is not None]),
       n_inst=st.integers(2, 8), column=st.sampled_from(LOAD_COLUMNS),
       target=st.integers(0, 7), extra=st.integers(1, 50))
def test_more_load_never_raises_a_score(name, n_inst, column, target, extra):
    """On an idle cluster, adding load to one instance never raises that instance's score."""
    target %= n_inst
    snaps = np.zeros((n_inst, H.SNAP_COLS))
    snaps[:, H.SNAP_FREE_BLOCKS] = 1000.0
    request = np.zeros(H.REQ_COLS)
    request[H.REQ_INPUT_LEN] = 512.0
    before = np.zeros(n_inst)
    _call_scorer(SCORERS.entries[name].function, snaps, request, before)
    loaded = snaps.copy()
    loaded[target, column] = min(1.0, extra / 50.0) if column == H.SNAP_KV_UTIL else float(extra)
    after = np.zeros(n_inst)
    _call_scorer(SCORERS.entries[name].function, loaded, request, after)
    assert after[target] <= before[target]


@settings(max_examples=15, deadline=None)
@given(capacity=st.floats(2_000.0, 50_000.0), refill=st.floats(500.0, 40_000.0),
       rate=st.floats(5.0, 200.0), seed=st.integers(0, 1000))
def test_token_bucket_never_admits_more_than_capacity_plus_refill(capacity, refill, rate, seed):
    r = blis_fast.run(model=MODEL, num_instances=2, rate=rate, num_requests=150, seed=seed,
                      admission_policy="token-bucket", token_bucket_capacity=capacity,
                      token_bucket_refill_rate=refill, trace_level="decisions", log="error")
    d = r.simulation.decisions
    inputs = r.prepared.table.input_len
    admitted = d.admission_request[d.admitted]
    clocks = d.admission_clock[d.admitted]
    spent = np.cumsum(inputs[admitted])
    assert np.all(spent <= capacity + refill * clocks / 1e6 + 1e-6)
