"""Property tests of prefill/decode disaggregation (issue 14, item 5) on random P/D
configurations: pool splits (prefill, decode, shared, role-0 instances), the three deciders
(prefix-threshold with shared prefixes), KV pressure on the decode side, short timeouts,
horizons, contention on/off, link bandwidths from 0.05 to 50 GB/s, routing policies, per-pool
TP, per-pool latency backends (under a roofline or trained-physics global backend) and per-pool
scorer lists (stateless and stateful scorers).

Properties, per disaggregated parent (``res.simulation.pd.par``):

(a) it ends at most once, and exactly once in a run that drains (no horizon): completed,
    dropped at its decode instance, decode timeout, or its prefill dropped / timed out;
(b) timestamps in order: arrival <= prefill enqueue <= transfer start (= the start of its
    last prefill step) <= transfer end = decode enqueue <= its first decode step; completion
    >= transfer end except decode timeouts past the deadline (OPEN-PD-4, flagged);
(c) transfer time = max(1, ceil(base + blocks x block bytes x k / bandwidth)), k = the active
    transfers it shared the link with (1 without contention): never faster than the link;
(d) pools: prefill sub-requests run only on prefill-capable instances, decode sub-requests
    and local requests only on decode-capable ones, role-0 instances stay idle;
(e) KV blocks are all free again on every instance when the run drains;
(f) cluster counters: injected = completed + queued + running + dropped + timed out, and
    completed = instance completions - prefill completions;
(g) determinism: the same options twice print the same stdout.

REFERENCE_DEADLOCK: a decode instance's KV can fill with the prompts reserved for decode
sub-requests still waiting in its queue; a head that needs one more block (prompt length a
multiple of the block size, or a preempted sub-request starting over) then never fits, the
batch stays empty and the instance steps without work until the requests time out (the
reference does the same: reservations ignore the queue). Configurations under KV pressure
therefore always have a timeout.
"""

from __future__ import annotations

import contextlib
import io
import math
from unittest import mock

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_invariants import _KVCapture

import blis_fast
from blis_fast.config.pd import ROLE_DECODE, ROLE_PREFILL
from blis_fast.engine import packing
from blis_fast.kernels.cluster.pd import ParentField, PDCounter
from blis_fast.kernels.engine.state import InstanceCounter
from blis_fast.kernels.enums import RequestState
from blis_fast.kernels.kv import kvcache as kvc

MODEL = "meta-llama/llama-3.1-8b-instruct"
SETTINGS = dict(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
F = ParentField


POOL_BACKENDS = ["roofline", "trained-physics", "trained-roofline", "crossmodel", "blackbox"]
POOL_SCORERS = ["queue-depth:1", "precise-prefix-cache:2,queue-depth:1",
                "prefix-affinity:1,load-balance:1", "no-hit-lru:1,kv-utilization:1",
                "active-requests:1,running-requests:2"]


@st.composite
def pd_configs(draw) -> dict:
    """A small valid P/D run (at most 60 requests on at most 6 instances)."""
    n = draw(st.integers(2, 6))
    shared = draw(st.integers(0, n - 2))
    if shared and draw(st.booleans()):
        p = d = 0
    else:
        p = draw(st.integers(1, n - shared - 1))
        d = draw(st.integers(1, n - shared - p))
    opts = {
        "model": MODEL, "num_instances": n, "prefill_instances": p, "decode_instances": d,
        "prefill_decode_instances": shared,
        "pd_decider": draw(st.sampled_from(["always", "always", "never", "prefix-threshold"])),
        "num_requests": draw(st.integers(1, 60)),
        "rate": draw(st.sampled_from([2.0, 20.0, 200.0])),
        "seed": draw(st.integers(0, 1000)),
        "routing_policy": draw(st.sampled_from(["round-robin", "least-loaded", "weighted"])),
        "prompt_tokens": 300, "prompt_tokens_stdev": 200, "prompt_tokens_min": 1,
        "prompt_tokens_max": 900, "output_tokens": 60, "output_tokens_stdev": 50,
        "output_tokens_min": 1, "output_tokens_max": 200, "log": "error",
    }
    if opts["pd_decider"] == "prefix-threshold":
        opts["pd_prefix_threshold"] = draw(st.integers(0, 400))
        opts["prefix_tokens"] = draw(st.sampled_from([0, 128, 256]))
    if draw(st.booleans()):
        opts["latency_model"] = "trained-physics"
    if p > 0:
        opts["pd_transfer_bandwidth"] = draw(st.sampled_from([0.05, 1.0, 25.0, 50.0]))
        opts["pd_transfer_base_latency"] = draw(st.sampled_from([0.0, 0.05, 2.0]))
        if draw(st.booleans()):
            opts["prefill_tp"] = 2
        # a pool's backend takes the global coefficients: roofline's (all zero) serve only
        # roofline and blackbox, trained-physics' serve every backend
        backends = (POOL_BACKENDS if opts.get("latency_model") == "trained-physics"
                    else ["roofline", "blackbox"])
        for pool in ("prefill", "decode"):
            if draw(st.booleans()):
                opts[f"{pool}_latency_model"] = draw(st.sampled_from(backends))
    for pool in ("prefill", "decode"):  # scorer lists route shared pods too
        if draw(st.booleans()):
            opts[f"{pool}_routing_scorers"] = draw(st.sampled_from(POOL_SCORERS))
    opts["pd_transfer_contention"] = draw(st.booleans())
    pressure = draw(st.booleans())
    if pressure:  # decode-side drops and preemption
        opts["total_kv_blocks"] = draw(st.integers(100, 400))
    if pressure or draw(st.booleans()):
        # under KV pressure a timeout is needed: reserved decode KV can leave a decode
        # instance whose queue head never fits (the reference spins empty steps until the
        # deadlines, REFERENCE_DEADLOCK below)
        opts["timeout"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        opts["horizon"] = draw(st.integers(200_000, 5_000_000))
    return opts


def _run(opts: dict):
    cap = _KVCapture()
    with contextlib.redirect_stderr(io.StringIO()), mock.patch.object(packing, "new_kv_state",
                                                                       cap):
        return blis_fast.run(**opts), cap.kv


@settings(max_examples=200, **SETTINGS)
@given(opts=pd_configs())
def test_pd_invariants(opts: dict) -> None:
    res, kv = _run(opts)
    sim = res.simulation
    pd = sim.pd
    assert pd is not None
    n = sim.table.n
    par = pd.par
    cnt = pd.counters
    split = np.flatnonzero(par[:, F.FLAG] == 1)
    drained = "horizon" not in opts
    arrival = sim.table.arrival_us
    roles = res.prepared.engine.pd.roles(opts["num_instances"])

    # (a) each parent ends at most once; exactly once when the run drains
    done = par[split, F.T_DONE] > 0
    prefill_state = sim.state[split + n]
    prefill_failed = np.isin(prefill_state, (RequestState.DROPPED, RequestState.TIMED_OUT))
    assert not (done & prefill_failed).any()
    assert (cnt[PDCounter.DECODE_COMPLETED] + cnt[PDCounter.DECODE_TIMED_OUT]
            + cnt[PDCounter.DROPPED_AT_DECODE_KV]) == int(done.sum())
    if drained:
        assert (done | prefill_failed).all()
        assert cnt[PDCounter.XFER_INITIATED] == cnt[PDCounter.XFER_COMPLETED]
        assert cnt[PDCounter.ACTIVE] == 0 and cnt[PDCounter.CORRUPTED] == 0

    # (b) timestamps in order
    started = split[par[split, F.T_XFER_START] > 0]
    a = arrival[started]
    assert (a <= par[started, F.T_PREFILL_ENQUEUE]).all()
    assert (par[started, F.T_PREFILL_ENQUEUE] <= par[started, F.T_PREFILL_DONE]).all()
    assert (par[started, F.T_PREFILL_DONE] == par[started, F.T_XFER_START]).all()
    moved = split[par[split, F.T_XFER_DONE] > 0]
    assert (par[moved, F.T_XFER_DONE] > par[moved, F.T_XFER_START]).all()
    assert (par[moved, F.T_DECODE_ENQUEUE] == par[moved, F.T_XFER_DONE]).all()
    scheduled = moved[sim.sched_delay_us[moved] >= 0]
    assert (arrival[scheduled] + sim.sched_delay_us[scheduled]
            >= par[scheduled, F.T_XFER_DONE]).all()
    finished = moved[par[moved, F.T_DONE] > 0]
    early = finished[par[finished, F.T_DONE] < par[finished, F.T_XFER_DONE]]
    assert (par[early, F.PAST_DEADLINE] == 1).all()  # only past-deadline timeouts
    assert int(cnt[PDCounter.PAST_DEADLINE]) == int((par[:, F.PAST_DEADLINE] == 1).sum())

    # (c) transfer time from the link
    pdc = res.prepared.engine.pd
    bw, base = pdc.bandwidth_gbps * 1000.0, pdc.base_latency_ms * 1000.0
    for r in moved.tolist():
        k = max(int(par[r, F.XFER_ACTIVE]), 1)
        nbytes = float(par[r, F.BLOCKS]) * pdc.block_bytes
        expect = max(1, math.ceil(base + nbytes / (bw / k if k > 1 else bw)))
        assert par[r, F.T_XFER_DONE] - par[r, F.T_XFER_START] == expect
        if nbytes > 0:
            dur = par[r, F.T_XFER_DONE] - par[r, F.T_XFER_START]
            assert nbytes / max(dur - base, 1e-9) <= bw * (1 + 1e-9) + 1.0
    if not pdc.contention:
        assert (par[:, F.XFER_ACTIVE] == 0).all()

    # (d) pools
    pre_rows = split + n
    on = sim.instance[pre_rows]
    assert ((roles[on[on >= 0]] & ROLE_PREFILL) != 0).all()
    work_rows = np.flatnonzero(sim.instance[:n] >= 0)
    assert ((roles[sim.instance[work_rows]] & ROLE_DECODE) != 0).all()
    idle = np.flatnonzero(roles == 0)
    assert (sim.counters[idle, InstanceCounter.STEPS] == 0).all()
    for i in idle.tolist():
        assert not (sim.instance == i).any()

    # (e) KV blocks all free once drained
    if drained:
        totals = kv.meta[:, kvc.KVMeta.TOTAL]
        assert (kv.meta[:, kvc.KVMeta.FREE] == totals).all()

    # (f) cluster counters
    s = res.summary
    assert s["injected_requests"] == (s["completed_requests"] + s["still_queued"]
                                      + s["still_running"] + s["dropped_unservable"]
                                      + s["timed_out_requests"])
    per_instance = sum(m["completed_requests"] for m in res.per_instance)
    assert s["completed_requests"] == per_instance - int(cnt[PDCounter.PREFILL_COMPLETED])


@settings(max_examples=8, **SETTINGS)
@given(opts=pd_configs())
def test_pd_runs_are_deterministic(opts: dict) -> None:
    first, _ = _run(opts)
    second, _ = _run(opts)
    assert first.stdout == second.stdout
