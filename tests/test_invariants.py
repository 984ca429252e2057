"""Property tests of the engine invariants (spec ENG-9 with DELTA-1..13) on random configurations.

Configurations are drawn by hypothesis: arrival rates 0.5..400 req/s, 1..300 requests,
1..8 instances, small KV caches (60..600 blocks of 4..32 tokens, so preemption is frequent),
chunked prefill on/off, tight batch limits, blackbox latency with random non-negative
coefficients or an analytical backend (roofline, trained-physics, crossmodel,
trained-roofline), optional max-model-len, timeouts, finite or infinite horizons, every
scheduler, priority, routing and admission policy and every routing scorer the package
exposes (names read from the package; parameters, policy bundles included, from
``_policies.POLICY_OPTIONS``: a policy the table does not know fails
``test_strategies_draw_every_policy``), and the tiered CPU KV cache on/off (bounded by a
horizon or timeouts, see TIERED_LIVELOCK).

Every request fits the whole cache on its own (``ceil((input + output) / block size) <= total
blocks``): the reference drops a request whose input alone needs more blocks than the cache
(ENG-3.4.5) and livelocks on one whose input + output does (ENG-4.4).

Properties:

(a) request conservation per instance and for the cluster, and every generated request is
    accounted for (INV-1, ENG-7.7); nothing is left in flight with an infinite horizon;
(b) KV block conservation (INV-4, DELTA-13): free counter == free-list length, in-use blocks ==
    blocks with a reference, reference counts == block lists holding the block, only running
    requests hold blocks (and queued ones with the CPU tier, see TIERED_LIVELOCK), and all
    blocks are free at the end of an infinite-horizon run; the peak never exceeds the cache;
(c) causality per completed request (INV-5): arrival + admission/routing/queueing delays <=
    admission < first token <= end; ITL >= 0; one ITL sample per decode step (DELTA-5);
(d) clock monotonicity (INV-3): per instance, step times strictly increase, durations >= 1,
    nothing beyond the horizon, SimEndedTime = min(clock, horizon) covers every step;
(e) determinism (INV-6): the same options twice give byte-identical stdout, results file,
    Parquet files and trace export, and the API prints what the CLI prints;
(f) round-robin routing spreads N*k requests exactly k per instance, request j on j mod N.

Regression tests at the end pin down defects these properties found (each names its commit).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
from _policies import POLICY_OPTIONS, drawn_policies, policy_names, policy_options
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

import blis_fast
from blis_fast.config.latency_backends import LATENCY_BACKENDS
from blis_fast.engine import packing
from blis_fast.engine.simulate import run_engine
from blis_fast.errors import BlisConfigError
from blis_fast.gonum import INT64_MAX
from blis_fast.kernels.engine.latency import queueing_time
from blis_fast.kernels.engine.state import InstanceCounter
from blis_fast.kernels.enums import Registration, RequestState
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.options import build_options
from blis_fast.runner import prepare

MODEL = "meta-llama/llama-3.1-8b-instruct"
MAX_TOKENS_PER_REQUEST = 1024  # keeps the whole file fast; the cache bound is the real limit
# The CPU KV tier (kv_cpu_blocks > 0) reloads blocks when a GPU allocation fails. Those reloads
# used to overflow a request's block list (TIERED_POOL_OVERFLOW, fixed in 30c545d); set
# TIERED_UNDER_PRESSURE to False to keep random tiered configurations away from reloads
# (the GPU cache then holds every request at once).
TIERED_UNDER_PRESSURE = True
MIN_TIERED_STEP_US = 500  # blackbox beta0 floor with the CPU tier (bounds livelocked runs)

# The CPU tier reproduces a reference quirk (ENG-5.10.4, sim/kv/tiered.go AllocateKVBlocks):
# a reload commits the reloaded prefix blocks to the request, and when the allocation of the
# rest then fails (admission, Phase 2) nothing is rolled back, so a *queued* request keeps
# GPU blocks. Under pressure the queued holders starve the running batch: no request
# completes and, with no timeout and an infinite horizon, the run never ends (its step log
# grows until the process runs out of memory). Tiered configurations under pressure must be
# bounded by a horizon or by timeouts, and queued requests may hold blocks in tiered mode.
# A reproducer (1 instance, 5 requests: a single-tier cache finishes all 5 after 39
# preemptions; with the CPU tier none completes in 1000 s of simulated time, 30985 preemptions):
TIERED_LIVELOCK = dict(
    model=MODEL, log="error", seed=39916801, rate=174.2782323836869, num_requests=5,
    prompt_tokens=215, prompt_tokens_stdev=192, prompt_tokens_min=81, prompt_tokens_max=273,
    output_tokens=494, output_tokens_stdev=494, output_tokens_min=494, output_tokens_max=494,
    total_kv_blocks=121, block_size_in_tokens=8, max_num_running_reqs=41,
    max_num_scheduled_tokens=1041, timeout=-5, priority_policy="slo-based",
    routing_latency=13484, alpha_coeffs=[0.02, 5.88481005718711, 1.9748299112907859],
    beta_coeffs=[2872.0711067368447, 37.61225606394877, 20.584453042776513],
    kv_cpu_blocks=154, kv_transfer_bandwidth=701.1797404395907, kv_transfer_base_latency=10)

# A tiered run whose reloads overflowed a request's slice of the KV block-list pool before
# 30c545d (kernels/kv/kvcache.py new_kv_state sized it ceil((input + output) / block size) + 1
# blocks; the reload commits can append more): request_18 ended with 55 blocks in a 54-block
# slice and overwrote request_19's first entry, reference counts went wrong, then negative.
TIERED_POOL_OVERFLOW = dict(
    model=MODEL, log="error", seed=2731, rate=263.40578863213636, num_requests=34,
    prefix_tokens=100, prompt_tokens=495, prompt_tokens_stdev=256, prompt_tokens_min=190,
    prompt_tokens_max=615, output_tokens=110, output_tokens_stdev=120, output_tokens_min=110,
    output_tokens_max=121, total_kv_blocks=330, block_size_in_tokens=16,
    long_prefill_token_threshold=314, max_num_running_reqs=34, max_num_scheduled_tokens=704,
    timeout=6, scheduler="reverse-priority", admission_latency=3134, routing_latency=249,
    kv_cpu_blocks=326, kv_transfer_bandwidth=1.1, kv_transfer_base_latency=100,
    alpha_coeffs=[14138.35658781035, 6.176620965748251, 443.9658318279307],
    beta_coeffs=[7234.2619652593285, 1e-300, 1e-300])

SETTINGS = dict(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NAMES = policy_names()  # every policy name the package accepts, per family


# roofline (the default) most often; the other analytical backends the project keeps too
ANALYTICAL = ["roofline"] * 3 + [b.name for b in LATENCY_BACKENDS
                                  if b.analytical and b.name != "roofline"]


@st.composite
def _lengths(draw, budget: int, prefix: str) -> tuple[dict, int]:
    """Gaussian length flags (WL-2.4: min >= 1, mean and stdev in [min, max]) with max <=
    budget; returns the options and the max."""
    budget = max(1, budget)
    hi = draw(st.integers(max(1, budget // 3), budget))  # long requests: KV pressure
    lo = draw(st.integers(1, hi))
    mean = draw(st.integers(lo, hi))
    stdev = draw(st.integers(lo, hi))
    return ({f"{prefix}_tokens": mean, f"{prefix}_tokens_stdev": stdev,
             f"{prefix}_tokens_min": lo, f"{prefix}_tokens_max": hi}, hi)


@st.composite
def configs(draw, *, horizon: str = "any", routing: str | None = None,
            admission: str | None = None, num_requests: int | None = None,
            num_instances: int | None = None) -> dict:
    """Options for ``blis_fast.run`` (``blis run`` flags with underscores)."""
    bs = draw(st.sampled_from([4, 8, 16, 32]))
    total = draw(st.integers(60, 600))
    budget = min(total * bs, MAX_TOKENS_PER_REQUEST)  # input + output tokens of one request
    prefix = draw(st.one_of(st.just(0), st.integers(1, max(1, budget // 4))))
    prompt, pmax = draw(_lengths(max(1, (budget - prefix) * 2 // 3), "prompt"))
    output, _ = draw(_lengths(max(1, budget - prefix - pmax), "output"))
    n = num_requests if num_requests is not None else draw(st.integers(1, 300))
    rate = draw(st.floats(0.5, 400.0, allow_nan=False, allow_infinity=False))
    opts: dict = dict(
        model=MODEL, log="error", seed=draw(st.integers(0, 2**31 - 1)),
        rate=rate, num_requests=n, prefix_tokens=prefix, **prompt, **output,
        num_instances=(num_instances if num_instances is not None
                       else draw(st.integers(1, 8))),
        total_kv_blocks=total, block_size_in_tokens=bs,
        long_prefill_token_threshold=draw(st.one_of(st.just(0), st.integers(16, 512))),
        max_num_running_reqs=draw(st.integers(1, 64)),
        max_num_scheduled_tokens=draw(st.integers(16, 4096)),
        timeout=draw(st.one_of(st.integers(-5, -1), st.integers(1, 300))),
        scheduler=draw(st.sampled_from(NAMES["scheduler"])),
        priority_policy=draw(st.sampled_from(NAMES["priority"])),
        **draw(policy_options("routing", routing)),
        # mostly always-admit (the default), so that most runs simulate every request
        **draw(policy_options("admission", admission, default_weight=8)),
        admission_latency=draw(st.one_of(st.just(0), st.integers(0, 50_000))),
        routing_latency=draw(st.one_of(st.just(0), st.integers(0, 50_000))),
    )
    tiered = draw(st.booleans())
    if tiered:
        opts.update(kv_cpu_blocks=draw(st.integers(1, 500)),
                    kv_transfer_bandwidth=draw(st.floats(0.5, 1000.0)),
                    kv_transfer_base_latency=draw(st.integers(0, 100)))
    if tiered and not TIERED_UNDER_PRESSURE:  # every request fits at once: no reload
        need = prefix + pmax + output["output_tokens_max"]
        total = max(total, n * -(-need // bs))
        opts["total_kv_blocks"] = total
    pressure = tiered and TIERED_UNDER_PRESSURE
    if draw(st.booleans()):  # blackbox: coefficients given => blackbox (ENG-10.4.1)
        coef = st.floats(0.0, 1.0, allow_nan=False)
        alpha = [draw(coef) * 20_000, draw(coef) * 10, draw(coef) * 500]
        beta = [draw(coef) * 10_000, draw(coef) * 50, draw(coef) * 50]
        if pressure:
            beta[0] = max(beta[0], MIN_TIERED_STEP_US)
        if not any(alpha) and not any(beta):
            beta[0] = 1.0
        opts.update(alpha_coeffs=alpha, beta_coeffs=beta)
        if draw(st.booleans()):  # blackbox keeps the flag value; it must fit the cache
            opts["max_model_len"] = draw(st.integers(1, total * bs))
    else:  # analytical backends cap the value at the cache size themselves (ENG-10.4.5)
        opts["latency_model"] = draw(st.sampled_from(ANALYTICAL))
        if draw(st.booleans()):
            opts["max_model_len"] = draw(st.integers(1, 2 * total * bs))
    finite = horizon == "finite" or (horizon == "any" and draw(st.booleans()))
    if pressure and not finite:
        # The CPU tier can livelock (see TIERED_LIVELOCK): bound the run by timeouts.
        opts["timeout"] = draw(st.integers(1, 10))
        opts["rate"] = rate = max(rate, n / 10)
    span_us = int(n / rate * 1e6) + 1
    if finite:
        limit = 2 * span_us if not pressure else min(2 * span_us, 20_000_000)
        opts["horizon"] = max(1, int((0.05 + 0.95 * draw(st.floats(0.0, 1.0))) * limit))
    if num_requests is None and not pressure and draw(st.integers(0, 3)) == 0:
        # closed loop (DELTA-29): virtual users send their next request only after the last one
        # finished; the engine makes those follow-ups while it runs
        del opts["rate"]
        opts["concurrency"] = draw(st.integers(1, 8))
        opts["think_time_ms"] = draw(st.integers(0, 200))
    return opts


def _infinite(opts: dict) -> bool:
    return opts.get("horizon", INT64_MAX) == INT64_MAX


def _quiet_run(**opts):
    with contextlib.redirect_stderr(io.StringIO()):
        return blis_fast.run(**opts)


# ------------------------------------------------------------------ (a) request conservation


@settings(max_examples=250, **SETTINGS)
@given(opts=configs())
def test_request_conservation(opts: dict) -> None:
    res = _quiet_run(**opts)
    sim = res.simulation
    table = sim.table  # closed-loop follow-ups included
    eng = res.prepared.engine
    n = table.n
    state, inst, reg = sim.state, sim.instance, sim.registered
    assert state.shape == inst.shape == reg.shape == (n,)

    routed = inst >= 0
    rej_adm = reg == Registration.REJECTED_ADMISSION
    rej_route = reg == Registration.REJECTED_ROUTING
    assert int(rej_adm.sum()) == sim.rejected_admission
    assert int(rej_route.sum()) == sim.rejected_routing
    assert not (routed & (rej_adm | rej_route)).any()
    # routed to an instance but its QueuedEvent has not run yet (arrival -> queue pipeline)
    inst_pipeline = routed & (state == RequestState.NEW)
    injected = routed & (state != RequestState.NEW)
    # not even routed yet (admission/routing latency pipeline) and not rejected
    cluster_pipeline = ~routed & ~rej_adm & ~rej_route
    assert not (cluster_pipeline & (state != RequestState.NEW)).any()
    total = injected.sum() + inst_pipeline.sum() + cluster_pipeline.sum() + rej_adm.sum() \
        + rej_route.sum()
    assert total == n
    if _infinite(opts):
        assert inst_pipeline.sum() == 0 and cluster_pipeline.sum() == 0

    max_len = eng.options.max_model_len
    keys = ("completed_requests", "still_queued", "still_running", "dropped_unservable",
            "timed_out_requests", "injected_requests", "length_capped_requests",
            "total_input_tokens", "total_output_tokens", "preemption_count")
    cluster = dict.fromkeys(keys, 0)
    assert len(res.per_instance) == eng.options.num_instances
    for i, per in enumerate(res.per_instance):
        mine = inst == i
        by_state = {s: int((mine & (state == s)).sum()) for s in
                    (RequestState.COMPLETED, RequestState.QUEUED, RequestState.RUNNING,
                     RequestState.DROPPED, RequestState.TIMED_OUT)}
        assert per["completed_requests"] == by_state[RequestState.COMPLETED]
        assert per["still_queued"] == by_state[RequestState.QUEUED]
        assert per["still_running"] == by_state[RequestState.RUNNING]
        assert per["dropped_unservable"] == by_state[RequestState.DROPPED]
        assert per["timed_out_requests"] == by_state[RequestState.TIMED_OUT]
        five = sum(by_state.values())
        assert per["injected_requests"] == five == int((mine & injected).sum())
        if _infinite(opts):
            assert per["still_queued"] == per["still_running"] == 0
        capped = mine & (sim.length_capped == 1)
        assert per["length_capped_requests"] == int(capped.sum())
        assert not (capped & (state != RequestState.COMPLETED)).any()
        enqueued = mine & np.isin(state, [RequestState.QUEUED, RequestState.RUNNING,
                                          RequestState.COMPLETED, RequestState.TIMED_OUT])
        assert per["total_input_tokens"] == int(table.input_len[enqueued].sum())
        # DELTA-6: N per normal completion, MaxModelLen - input per length-capped one
        normal = mine & (state == RequestState.COMPLETED) & ~capped
        expect_out = int(table.output_len[normal].sum())
        if capped.any():
            expect_out += int((max_len - table.input_len[capped]).sum())
        assert per["total_output_tokens"] == expect_out
        for k in keys:
            cluster[k] += per[k]
    for k in keys:
        assert res.summary[k] == cluster[k], k
    # per-request records: routed and not dropped (ENG-7.6)
    assert len(res.requests) == int((reg == Registration.ROUTED).sum()) == int(
        (routed & (state != RequestState.DROPPED)).sum())


# ------------------------------------------------------------------ (b) KV block conservation


class _KVCapture:
    """Wraps ``new_kv_state`` as ``run_engine`` calls it, keeping the state it returns."""

    def __init__(self) -> None:
        self.kv = None
        self._real = packing.new_kv_state

    def __call__(self, *args, **kwargs):
        self.kv = self._real(*args, **kwargs)
        return self.kv


@dataclass
class _KVView:
    """The KV cache state in one shape, whatever the kernel's record layout is today."""

    ref: np.ndarray  # [instances, blocks] reference counts
    on_free: np.ndarray  # [instances, blocks] bool, on the free list
    nxt: np.ndarray  # [instances, blocks] free-list links
    prv: np.ndarray
    head: np.ndarray  # [instances]
    tail: np.ndarray
    free: np.ndarray
    req_off: np.ndarray  # [requests] offset of the request's block list in ``pool``
    req_cnt: np.ndarray  # [requests] blocks held
    pool: np.ndarray

    def block_list(self, r: int) -> np.ndarray:
        return self.pool[self.req_off[r]: self.req_off[r] + self.req_cnt[r]]

    def held_counts(self, i: int, requests: np.ndarray) -> np.ndarray:
        """How many of ``requests``' block lists hold each block of instance ``i``."""
        lists = [self.block_list(r) for r in requests]
        total = self.ref.shape[1]
        if not lists:
            return np.zeros(total, dtype=np.int64)
        return np.bincount(np.concatenate(lists), minlength=total).astype(np.int64)


def _ring_links(kv) -> dict:
    """Free-list links, head and tail rebuilt from the ring of live entries (``free_ring``)."""
    n_inst, total = kv.blk.shape[0], kv.blk.shape[1]
    nxt = np.full((n_inst, total), -1, np.int64)
    prv = np.full((n_inst, total), -1, np.int64)
    head = np.full(n_inst, -1, np.int64)
    tail = np.full(n_inst, -1, np.int64)
    mask = kv.free_ring.shape[1] - 1
    for i in range(n_inst):
        order = []
        for pos in range(int(kv.meta[i, kvc.KVMeta.HEAD]), int(kv.meta[i, kvc.KVMeta.TAIL])):
            b = int(kv.free_ring[i, pos & mask])
            live = kv.blk[i, b, kvc.BlockField.POS] == pos & kvc.POS_MASK
            if kv.blk[i, b, kvc.BlockField.FREE] == 1 and live:
                order.append(b)
        for a, b in zip(order[:-1], order[1:], strict=True):
            nxt[i, a], prv[i, b] = b, a
        if order:
            head[i], tail[i] = order[0], order[-1]
    return dict(nxt=nxt, prv=prv, head=head, tail=tail)


def _kv_view(kv) -> _KVView:
    meta = kv.meta
    common = dict(head=meta[:, kvc.KVMeta.HEAD], tail=meta[:, kvc.KVMeta.TAIL], free=meta[:, kvc.KVMeta.FREE],
                  pool=kv.pool)
    if hasattr(kv, "free_ring"):  # block records (B_*), request records (R_*), a ring free list
        blk, req = kv.blk, kv.req
        common.update(_ring_links(kv))
        return _KVView(ref=blk[:, :, kvc.BlockField.REF].astype(np.int64),
                       on_free=blk[:, :, kvc.BlockField.FREE] == 1, req_off=req[:, kvc.BlockList.OFFSET],
                       req_cnt=req[:, kvc.BlockList.COUNT], **common)
    return _KVView(ref=kv.ref.astype(np.int64), on_free=kv.onfree == 1, nxt=kv.nxt,
                   prv=kv.prv, req_off=kv.req_off, req_cnt=kv.req_cnt, **common)


@settings(max_examples=250, **SETTINGS)
@given(opts=configs())
def test_kv_block_conservation(opts: dict) -> None:
    with contextlib.redirect_stderr(io.StringIO()):
        prepared = prepare(build_options(opts))
    cap = _KVCapture()
    with mock.patch.object(packing, "new_kv_state", cap):
        sim = run_engine(prepared.table, prepared.engine, sessions=prepared.sessions)
    assert cap.kv is not None
    kv = _kv_view(cap.kv)
    eng = prepared.engine
    total = eng.options.total_kv_blocks
    n = sim.table.n  # closed-loop follow-ups included
    holders_all = np.flatnonzero(kv.req_cnt[:n] > 0)
    for i in range(eng.options.num_instances):
        free = int(kv.free[i])
        assert 0 <= free <= total
        # the free counter equals the free list (walked head -> tail) and the on-free flags
        nxt, prv = kv.nxt[i].tolist(), kv.prv[i].tolist()
        seen = [False] * total
        b, prev, steps = int(kv.head[i]), -1, 0
        while b >= 0 and steps <= total:
            assert not seen[b] and prv[b] == prev, f"instance {i}: broken free list at {b}"
            seen[b] = True
            prev, b, steps = b, nxt[b], steps + 1
        assert steps == free
        assert prev == int(kv.tail[i]) or (free == 0 and prev == -1)
        assert (kv.on_free[i] == np.array(seen, dtype=bool)).all()
        # in use <=> referenced; reference counts == block lists that hold the block
        ref = kv.ref[i]
        assert (ref >= 0).all()
        assert ((ref > 0) == ~kv.on_free[i]).all()
        mine = holders_all[sim.instance[holders_all] == i]
        np.testing.assert_array_equal(kv.held_counts(i, mine), ref)
        # only requests still running hold blocks at the end (queued ones too with the CPU
        # tier: a failed admission keeps the blocks its reload committed, see TIERED_LIVELOCK)
        holder_states = [RequestState.RUNNING]
        if eng.options.kv_cpu_blocks > 0:
            holder_states.append(RequestState.QUEUED)
        assert np.isin(sim.state[mine], holder_states).all(), sim.state[mine]
        used = total - free
        assert used == int((ref > 0).sum())
        # peak (ENG-2.2.3) is the largest per-step usage and never exceeds the cache
        steps_i = sim.step_instance == i
        peak = int(sim.counters[i, InstanceCounter.PEAK_KV])
        assert 0 <= peak <= total
        assert peak == int(sim.step_kv_used[steps_i].max(initial=0))
        if _infinite(opts):
            assert used == 0, f"instance {i}: {used} blocks in use after the run"
    assert ((sim.step_kv_used >= 0) & (sim.step_kv_used <= total)).all()
    if _infinite(opts):
        assert len(holders_all) == 0


# ------------------------------------------------------------------ (c) causality


@settings(max_examples=250, **SETTINGS)
@given(opts=configs())
def test_causality(opts: dict) -> None:
    res = _quiet_run(**opts)
    sim, table, eng = res.simulation, res.simulation.table, res.prepared.engine
    otp, post = eng.latency.output_token_time, eng.latency.post_decode_overhead
    assert otp >= 0 and post >= 0

    # per request in the kernel's arrays (ticks)
    admitted = sim.sched_delay_us >= 0
    assert ((sim.sched_delay_us == -1) | admitted).all()
    alpha = np.asarray(eng.latency.alpha, dtype=np.float64)
    qdelay = np.array([queueing_time(eng.latency.code, alpha, int(x)) for x in table.input_len],
                      dtype=np.int64)
    assert (qdelay >= 0).all()
    earliest = eng.options.admission_latency + eng.options.routing_latency + qdelay
    assert (sim.sched_delay_us[admitted] >= earliest[admitted]).all()
    has_ttft = sim.ttft_us >= 0
    assert ((sim.ttft_us == -1) | has_ttft).all()
    assert (sim.ttft_us[has_ttft] >= earliest[has_ttft] + 1 + otp).all()

    done = sim.state == RequestState.COMPLETED
    assert (sim.e2e_us[~done] == -1).all()
    assert (admitted[done] & has_ttft[done]).all()
    ttft, e2e, sd = sim.ttft_us[done], sim.e2e_us[done], sim.sched_delay_us[done]
    out = table.output_len[done]
    assert (sd + 1 + otp <= ttft).all(), "first token before admission + one step"
    assert (ttft + np.where(out > 0, post, 0) <= e2e).all()
    # one ITL sample per decode step of the final attempt (DELTA-5), each >= 1 + alpha2
    capped = sim.length_capped[done] == 1
    n_itl = np.where(capped, eng.options.max_model_len - 1 - table.input_len[done], out - 1)
    np.testing.assert_array_equal(sim.itl_count[done], n_itl)
    assert (sim.itl_sum_us[done] >= sim.itl_count[done] * (1 + otp)).all()

    # the same through the per-request records (ms, NaN when absent)
    cols = res.requests
    fin = ~np.isnan(cols.e2e_us)
    assert (cols.scheduling_delay_us[fin] >= 0).all()
    assert (cols.ttft_us[fin] > 0).all()
    assert (cols.ttft_us[fin] > cols.scheduling_delay_us[fin]).all()
    assert (cols.ttft_us[fin] <= cols.e2e_us[fin]).all()
    assert (cols.itl_us[fin] >= 0).all()
    reached = ~np.isnan(cols.ttft_us)
    assert (cols.ttft_us[reached] > 0).all()


# ------------------------------------------------------------------ (d) clock monotonicity


@settings(max_examples=250, **SETTINGS)
@given(opts=configs())
def test_clock_monotonicity(opts: dict) -> None:
    res = _quiet_run(**opts)
    sim, eng = res.simulation, res.prepared.engine
    horizon = eng.options.horizon
    assert (sim.step_duration >= 1).all()
    assert (sim.step_time >= 0).all()
    assert (sim.step_time <= horizon).all()
    assert (sim.step_running <= eng.options.max_num_running_reqs).all()  # ENG-9 bounds
    assert (sim.step_queue >= 0).all()
    ended = sim.sim_ended_us
    for i in range(eng.options.num_instances):
        t = sim.step_time[sim.step_instance == i]
        assert (np.diff(t) > 0).all(), f"instance {i}: step times not strictly increasing"
        # idle steps taken as counts (kernels/engine/step.py: skip_idle_steps) are not logged
        assert int(sim.counters[i, InstanceCounter.STEPS]) == len(t) + int(
            sim.counters[i, InstanceCounter.IDLE_SKIPPED])
        assert 0 <= ended[i] <= horizon
        if len(t):
            assert ended[i] >= t[-1]
    assert math.isclose(res.summary["vllm_estimated_duration_s"], int(ended.max()) / 1e6,
                        rel_tol=1e-12)


# ------------------------------------------------------------------ (e) determinism


def _argv(opts: dict) -> list[str]:
    argv = ["run"]
    for key, value in opts.items():
        argv.append("--" + key.replace("_", "-"))
        if isinstance(value, (list, tuple)):
            argv.append(",".join(repr(float(v)) for v in value))
        else:
            argv.append(repr(value) if isinstance(value, float) else str(value))
    return argv


def _cli(argv: list[str]) -> str:
    from blis_fast.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:  # pragma: no cover - a failure is reported below
            raise AssertionError(f"blis exited with {exc.code}: {argv}") from exc
    return out.getvalue()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@settings(max_examples=50, **SETTINGS)
@given(opts=configs())
def test_determinism(opts: dict) -> None:
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(2):
            d = Path(tmp) / f"run{k}"
            d.mkdir()
            argv = _argv(opts) + ["--metrics-path", str(d / "results.json"),
                                  "--trace-output", str(d / "trace"),
                                  "--output-dir", str(d / "parquet")]
            stdout = _cli(argv)
            runs.append((stdout, _tree(d)))
        (out0, files0), (out1, files1) = runs
        assert out0 == out1
        assert sorted(files0) == ["parquet/requests.parquet", "parquet/summary.parquet",
                                  "results.json", "trace.csv", "trace.yaml"]
        assert files0 == files1
    assert _quiet_run(**opts).stdout == out0


# ------------------------------------------------------------------ (f) round-robin


@st.composite
def _round_robin(draw) -> tuple[dict, int, int]:
    n_inst = draw(st.integers(1, 8))
    k = draw(st.integers(1, 300 // n_inst))
    opts = draw(configs(horizon="infinite", routing="round-robin", admission="always-admit",
                        num_requests=n_inst * k, num_instances=n_inst))
    opts.pop("max_model_len", None)
    return opts, n_inst, k


@settings(max_examples=120, **SETTINGS)
@given(case=_round_robin())
def test_round_robin_spreads_evenly(case: tuple[dict, int, int]) -> None:
    opts, n_inst, k = case
    res = _quiet_run(**opts)
    sim = res.simulation
    assert res.prepared.table.n == n_inst * k
    assert res.summary["dropped_unservable"] == 0
    np.testing.assert_array_equal(np.bincount(sim.instance, minlength=n_inst), [k] * n_inst)
    # arrivals are distinct and in index order: request j goes to instance j mod N
    np.testing.assert_array_equal(sim.instance, np.arange(n_inst * k) % n_inst)
    handled = np.bincount(res.requests.handled_by, minlength=n_inst)
    np.testing.assert_array_equal(handled, [k] * n_inst)
    assert [p["injected_requests"] for p in res.per_instance] == [k] * n_inst


# ------------------------------------------------------------------ regressions

def _tiered_check(opts: dict) -> dict:
    """KV soundness of one run of ``opts`` at step 310 and at the end (for the subprocess)."""
    out = {}
    for label, horizon in (("at_step_310", 2_367_065), ("end", None)):
        o = dict(opts)
        if horizon:
            o["horizon"] = horizon
        p = prepare(build_options(o))
        cap = _KVCapture()
        with mock.patch.object(packing, "new_kv_state", cap):
            run_engine(p.table, p.engine)
        kv, t = _kv_view(cap.kv), p.table
        capacity = np.diff(np.append(kv.req_off[: t.n], kv.pool.shape[0]))  # slice sizes
        cnt = kv.req_cnt[: t.n].astype(np.int64)
        ref = kv.ref[0]
        counts = kv.held_counts(0, np.flatnonzero(cnt))
        out[label] = {"over_capacity": [int(r) for r in np.flatnonzero(cnt > capacity)],
                      "ref_mismatch": [int(b) for b in np.flatnonzero(counts != ref)],
                      "negative_ref": [int(b) for b in np.flatnonzero(ref < 0)],
                      "used_at_end": int(p.engine.options.total_kv_blocks - kv.free[0])}
    return out


_TIERED_CHECK = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); import test_invariants as T; "
    "print(json.dumps(T._tiered_check(json.loads(sys.argv[2]))))")


def test_tiered_reload_keeps_block_lists_sound() -> None:
    """TIERED_POOL_OVERFLOW completes with every block list inside its slice, reference counts
    equal to the lists and no block in use at the end (a refusal is not a pass). Runs in a
    subprocess: a corrupted cache can crash the interpreter."""
    root = str(Path(blis_fast.__file__).resolve().parents[1])  # the blis_fast under test
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _TIERED_CHECK, str(Path(__file__).parent),
                           json.dumps(TIERED_POOL_OVERFLOW)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for label, found in result.items():
        assert found["over_capacity"] == [], (label, found)
        assert found["ref_mismatch"] == [] and found["negative_ref"] == [], (label, found)
    assert result["end"]["used_at_end"] == 0, result


def test_clock_survives_huge_admission_latency() -> None:
    """t + admission latency used to wrap around int64 (negative step times); refusing the
    value up front or keeping the clock monotone are both fine."""
    try:
        res = _quiet_run(model=MODEL, log="error", num_requests=3,
                         admission_latency=INT64_MAX)
    except BlisConfigError:
        return  # refused up front: fine too
    sim = res.simulation
    assert (sim.step_time >= 0).all()
    assert (np.diff(sim.step_time) > 0).all()


def test_api_writes_nothing_unasked(tmp_path: Path) -> None:
    """The API writes nothing unless asked (guards the property tests above, which run in the
    repository's working directory)."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        _quiet_run(model=MODEL, log="error", num_requests=5, alpha_coeffs=[1, 1, 1],
                   beta_coeffs=[1000, 1, 1])
    finally:
        os.chdir(old)
    assert list(tmp_path.iterdir()) == []


def test_strategy_respects_the_livelock_bound() -> None:
    """Every drawn configuration lets each request fit the cache on its own (see module doc)."""

    @settings(max_examples=200, **SETTINGS)
    @given(opts=configs())
    def check(opts: dict) -> None:
        need = opts["prefix_tokens"] + opts["prompt_tokens_max"] + opts["output_tokens_max"]
        assert -(-need // opts["block_size_in_tokens"]) <= opts["total_kv_blocks"]
        assert need <= MAX_TOKENS_PER_REQUEST
        if opts.get("kv_cpu_blocks", 0) > 0 and TIERED_UNDER_PRESSURE:  # TIERED_LIVELOCK
            assert not _infinite(opts) or opts["timeout"] > 0

    check()


def test_strategies_draw_every_policy() -> None:
    """The configurations above run every policy and scorer the package exposes: a policy
    added to (or removed from) the package without an entry in ``tests/_policies.py``
    POLICY_OPTIONS fails here instead of going untested."""
    for family, table in POLICY_OPTIONS.items():
        package, tested = set(NAMES[family]), set(table)
        assert package <= tested, (
            f"{family} policies {sorted(package - tested)} have no invariant coverage: add how "
            f"a random configuration runs them to POLICY_OPTIONS[{family!r}] in "
            f"tests/_policies.py")
        assert tested <= package, (
            f"POLICY_OPTIONS[{family!r}] in tests/_policies.py names {sorted(tested - package)}, "
            f"which the package no longer accepts: remove them")
    search = settings(max_examples=5000, phases=[Phase.generate], database=None,
                      suppress_health_check=list(HealthCheck))
    for family, names in NAMES.items():
        for name in names:  # each is drawn (one in ~100 configurations for a scorer)
            try:
                find(configs(), lambda o, f=family, n=name: n in drawn_policies(o)[f],
                     settings=search)
            except NoSuchExample:
                raise AssertionError(f"the configurations never draw the {family} {name!r}; "
                                     "draw it in configs() (tests/test_invariants.py)") from None
