"""Properties of the cluster control plane on random configurations (issue: cluster).

Policy and scorer names come from the package (``_policies.policy_names``): every routing
and admission policy it exposes is drawn.
"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import yaml
from _policies import policy_names, policy_options
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.kernels.cluster import hooks as H
from blis_fast.policies.scorers import SCORERS

MODEL = "meta-llama/llama-3.1-8b-instruct"
NAMES = policy_names()  # every policy name the package accepts, per family
SCORER_NAMES = list(NAMES["scorer"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_inst=st.integers(1, 8), rate=st.floats(1.0, 300.0),
       policy=st.sampled_from(NAMES["routing"]),
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_inst=st.integers(1, 4), rate=st.floats(5.0, 400.0), seed=st.integers(0, 10_000),
       policy=st.sampled_from(NAMES["admission"]), data=st.data())
def test_every_admission_policy_accounts_for_every_request(n_inst, rate, seed, policy, data):
    """Each generated request is either rejected at admission or routed to an instance and
    recorded there (infinite horizon); reject-all rejects all, always-admit none, and a
    policy that sheds by SLO class never sheds a class that is not sheddable."""
    opts = data.draw(policy_options("admission", policy))
    r = blis_fast.run(model=MODEL, num_instances=n_inst, rate=rate, num_requests=60, seed=seed,
                      log="error", **opts)
    rejected = r.simulation.rejected_admission
    handled = np.asarray(r.requests.handled_by)
    assert rejected + len(handled) == 60
    assert handled.size == 0 or (handled.min() >= 0 and handled.max() < n_inst)
    if policy == "reject-all":
        assert rejected == 60
    if policy == "always-admit":
        assert rejected == 0
    if policy in ("gaie-legacy", "tier-shed"):
        # every generated request has the SLO class "": priority 3 unless the bundle says
        adm = yaml.safe_load(Path(opts["policy_config"]).read_text())["admission"]
        priority = adm.get("slo_priorities", {}).get("", 3)
        if policy == "gaie-legacy" and priority >= 0:  # not sheddable (DELTA-39)
            assert rejected == 0
        if policy == "tier-shed" and priority >= adm.get("tier_shed_min_priority", 3):
            assert rejected == 0  # DELTA-38: only classes below the minimum are shed


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
