"""Closed-loop sessions (WL-6.5 with DELTA-46/47/48, CLU-1.15): follow-ups are generated when
their parent finishes, inside the simulation, and the conversation context grows as specified.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blis_fast
from blis_fast.engine.sessions import (
    BUDGET_EXHAUSTED,
    CANCELLED,
    COMPLETED,
    HORIZON_INTERRUPTED,
    SessionDriver,
    session_deadline,
)
from blis_fast.kernels.engine.state import InstanceCounter
from blis_fast.kernels.enums import RequestState
from blis_fast.workload.generated import SessionBlueprint
from blis_fast.workload.samplers import constant_sampler

MODEL = "meta-llama/llama-3.1-8b-instruct"


def _blueprint(max_rounds=4, growth="", prefix=0, think=1000, horizon=10**12, timeout=None,
               unlimited=False, r0_in=None, r0_out=None, in_len=10, out_len=5):
    return SessionBlueprint(
        session_id="sess_7", client_id="c", client_idx=0, seed=99, max_rounds=max_rounds,
        unlimited_rounds=unlimited, context_growth=growth, think_time_us=think,
        timeout=timeout, horizon=horizon, input_sampler=constant_sampler(in_len),
        output_sampler=constant_sampler(out_len), prefix=np.arange(prefix, dtype=np.int64),
        tenant_id="", slo_class="", model="", round0_row=0,
        round0_input=None if r0_in is None else np.asarray(r0_in, np.int32),
        round0_output=None if r0_out is None else np.asarray(r0_out, np.int32))


# ------------------------------------------------------------------ the session manager


def test_rounds_end_at_max_rounds_with_ids_and_arrival():
    drv = SessionDriver([_blueprint(max_rounds=3, think=700)], -1, 16)
    fu1 = drv.on_outcome(0, 5_000, True, 10 + 5 - 1, 10)
    assert fu1.request_id == "session_sess_7_round_1_1"
    assert fu1.arrival_us == 5_700 and fu1.round_index == 1
    assert fu1.deadline_us == 5_700 + 300_000_000  # computeDeadline's session default
    fu2 = drv.on_outcome(0, 9_000, True, 14, 10)
    assert fu2.request_id == "session_sess_7_round_2_2"
    assert drv.on_outcome(0, 12_000, True, 14, 10) is None  # round 2 = max_rounds - 1
    assert drv.state[0] == COMPLETED


def test_timeout_or_drop_cancels_the_session():
    drv = SessionDriver([_blueprint(), _blueprint()], -1, 16)
    assert drv.on_outcome(0, 100, False, 0, 10) is None
    assert drv.state[0] == CANCELLED
    # a cancelled session never continues, even if a completion is reported later
    assert drv.on_outcome(0, 200, True, 14, 10) is None
    assert drv.on_outcome(1, 200, True, 14, 10) is not None


def test_budget_caps_follow_ups_over_the_whole_run():
    bps = [_blueprint(unlimited=True, max_rounds=0) for _ in range(3)]
    drv = SessionDriver(bps, 4, 16)
    made = [drv.on_outcome(b % 3, 1000 * b, True, 14, 10) for b in range(6)]
    assert [m is not None for m in made] == [True] * 4 + [False] * 2
    assert drv.state[4 % 3] == BUDGET_EXHAUSTED
    assert [m.request_id for m in made[:4]] == [
        "session_sess_7_round_1_1", "session_sess_7_round_1_2", "session_sess_7_round_1_3",
        "session_sess_7_round_2_4"]


def test_horizon_guard_allows_equality():
    drv = SessionDriver([_blueprint(think=100, horizon=1_100), _blueprint(think=100,
                                                                          horizon=1_099)], -1, 16)
    assert drv.on_outcome(0, 1_000, True, 14, 10).arrival_us == 1_100
    assert drv.on_outcome(1, 1_000, True, 14, 10) is None
    assert drv.state[1] == HORIZON_INTERRUPTED


def test_deadlines_follow_the_blueprint_timeout():
    assert session_deadline(50, None) == 300_000_050
    assert session_deadline(50, 0) == 0
    assert session_deadline(50, 1_000) == 1_050


@pytest.mark.parametrize("prefix", [0, 32])
def test_accumulated_context_matches_delta_46(prefix):
    """|I_r| = (r+1)|P| + sum_{j<r}(|n_j| + |o_j| - 1) + |n_r| with a prefix, linear without."""
    a, o = 10, 5
    r0_in = np.arange(1000, 1000 + prefix + a)  # round 0 = group prefix ++ n_0
    r0_out = np.arange(5000, 5000 + o)
    drv = SessionDriver([_blueprint(max_rounds=6, growth="accumulate", prefix=prefix,
                                    r0_in=r0_in, r0_out=r0_out, in_len=a, out_len=o)], -1, 16)
    input_len = prefix + a
    for r in range(1, 6):
        fu = drv.on_outcome(0, 1000 * r, True, input_len + o - 1, input_len)
        expected = (r + 1) * prefix + r * (a + o - 1) + a
        assert fu.input_len == expected, r
        input_len = fu.input_len
    # the context holds round 0's input and generated output, in order, then the next rounds
    ctx = drv._context[0]
    assert np.array_equal(ctx[: prefix + a], r0_in)
    assert np.array_equal(ctx[prefix + a: prefix + a + o - 1], r0_out[: o - 1])


def test_length_capped_parent_contributes_only_generated_tokens():
    r0_in, r0_out = np.arange(10), np.arange(100, 150)
    drv = SessionDriver([_blueprint(growth="accumulate", r0_in=r0_in, r0_out=r0_out)], -1, 16)
    fu = drv.on_outcome(0, 1000, True, 10 + 7, 10)  # capped after 7 generated tokens
    assert fu.input_len == 10 + 7 + 10


def test_follow_up_digests_share_the_parents_full_blocks():
    """With accumulation the next input starts with the parent's tokens: equal block digests."""
    from blis_fast.engine.sessions import _digests

    r0_in = np.arange(40)
    r0_out = np.arange(500, 530)
    drv = SessionDriver([_blueprint(growth="accumulate", r0_in=r0_in, r0_out=r0_out,
                                    in_len=20, out_len=8)], -1, 16)
    fu = drv.on_outcome(0, 1000, True, 40 + 30 - 1, 40)
    parent = _digests(np.concatenate((r0_in, r0_out)), 16)
    shared = (40 + 29) // 16
    assert np.array_equal(fu.digests[:shared], parent[:shared])


# ------------------------------------------------------------------ through the engine


def _spec(tmp_path, *, rounds=4, think_us=200_000, growth="accumulate", in_len=64,
          out_len=32, rate=20.0, n=40, prefix_group=None, prefix_length=None, timeout=None,
          seed=7):
    client = {
        "id": "chat", "rate_fraction": 1.0, "arrival": {"process": "poisson"},
        "input_distribution": {"type": "constant", "params": {"value": in_len}},
        "output_distribution": {"type": "constant", "params": {"value": out_len}},
        "reasoning": {"multi_turn": {"max_rounds": rounds, "think_time_us": think_us,
                                     "context_growth": growth}},
    }
    if prefix_group:
        client["prefix_group"] = prefix_group
    if prefix_length is not None:
        client["prefix_length"] = prefix_length
    if timeout is not None:
        client["timeout"] = timeout
    spec = {"version": "2", "seed": seed, "aggregate_rate": rate, "num_requests": n,
            "clients": [client]}
    path = tmp_path / f"spec-{seed}-{rounds}-{growth}-{prefix_length}-{timeout}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _requests(result):
    """Per-row table, state, e2e (µs, -1 unfinished) and ids of every simulated request."""
    sim = result.simulation
    return sim.table, sim.state, sim.e2e_us, sim.table.id_strings()


def _sessions(table):
    by_session: dict[int, list[int]] = {}
    for row in range(table.n):
        s = int(table.session_idx[row])
        if s >= 0:
            by_session.setdefault(s, []).append(row)
    return by_session


def test_follow_ups_arrive_exactly_think_time_after_parent_completion(tmp_path):
    think = 150_000
    res = blis_fast.run(model=MODEL, workload_spec=_spec(tmp_path, think_us=think),
                        num_instances=2)
    table, state, e2e, ids = _requests(res)
    assert table.n > 40  # follow-ups were added to the 40 round-0 requests
    checked = 0
    for rows in _sessions(table).values():
        rows.sort(key=lambda r: int(table.round_index[r]))
        assert [int(table.round_index[r]) for r in rows] == list(range(len(rows)))
        for parent, child in zip(rows, rows[1:], strict=False):
            assert state[parent] == RequestState.COMPLETED
            done_at = int(table.arrival_us[parent]) + int(e2e[parent])
            # never before the parent completes; exactly its completion + think time (roofline
            # has no post-decode overhead, so arrival + E2E is the completing step's end)
            assert int(table.arrival_us[child]) == done_at + think
            assert ids[child].startswith(f"session_{table.sessions[table.session_idx[child]]}"
                                         f"_round_{table.round_index[child]}_")
            checked += 1
    assert checked >= 40


def test_context_growth_through_the_engine(tmp_path):
    """Input lengths of every round follow DELTA-46 (here P = the group prefix, 48 tokens)."""
    a, o, p = 64, 32, 48
    res = blis_fast.run(model=MODEL, workload_spec=_spec(
        tmp_path, in_len=a, out_len=o, prefix_group="sys", prefix_length=p, n=30))
    table = res.simulation.table
    for rows in _sessions(table).values():
        for row in rows:
            r = int(table.round_index[row])
            assert int(table.input_len[row]) == (r + 1) * p + r * (a + o - 1) + a
    # without accumulation every round is prefix + new tokens
    res = blis_fast.run(model=MODEL, workload_spec=_spec(
        tmp_path, growth="", in_len=a, out_len=o, prefix_group="sys", prefix_length=p, n=30))
    table = res.simulation.table
    assert table.n > 30
    assert set(table.input_len.tolist()) == {p + a}


def test_accumulated_context_hits_the_prefix_cache(tmp_path):
    """Each round re-sends the previous one: the cache serves it (hit rate well above zero)."""
    acc = blis_fast.run(model=MODEL, workload_spec=_spec(tmp_path, n=30, in_len=256))
    flat = blis_fast.run(model=MODEL, workload_spec=_spec(tmp_path, n=30, in_len=256,
                                                          growth=""))
    hit_acc = acc.simulation.cache_hit_rate[0]
    hit_flat = flat.simulation.cache_hit_rate[0]
    assert hit_acc > 0.4 > hit_flat


def test_timed_out_round_ends_its_session(tmp_path):
    """A 1 ms timeout expires every request: no session continues past round 0."""
    res = blis_fast.run(model=MODEL, workload_spec=_spec(tmp_path, timeout=1000, n=20))
    table, state, _e2e, _ids = _requests(res)
    assert table.n > 0 and not table.extra_ids
    assert np.all(table.round_index == 0)
    assert np.all(state == RequestState.TIMED_OUT)


def test_concurrency_budget_counts_follow_ups(tmp_path):
    res = blis_fast.run(model=MODEL, concurrency=5, think_time_ms=10, num_requests=60)
    table = res.simulation.table
    assert table.n == 60  # 5 seeds + a budget of 55 follow-ups
    assert res.summary["injected_requests"] == 60
    assert len(table.extra_ids) == 55
    # at most one request of a virtual user is in flight at any time
    for rows in _sessions(table).values():
        rows.sort(key=lambda r: int(table.round_index[r]))
        ends = [int(table.arrival_us[r]) + int(res.simulation.e2e_us[r]) for r in rows]
        starts = [int(table.arrival_us[r]) for r in rows]
        assert all(s >= e for s, e in zip(starts[1:], ends, strict=False))


def test_sessions_are_deterministic(tmp_path):
    spec = _spec(tmp_path, n=25, rate=50.0)
    one = blis_fast.run(model=MODEL, workload_spec=spec, num_instances=3,
                        routing_policy="weighted", routing_scorers="prefix-affinity:1")
    two = blis_fast.run(model=MODEL, workload_spec=spec, num_instances=3,
                        routing_policy="weighted", routing_scorers="prefix-affinity:1")
    assert one.stdout == two.stdout
    assert one.requests_frame().equals(two.requests_frame())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.integers(1, 5), think=st.integers(0, 300_000),
       growth=st.sampled_from(["", "accumulate"]), blocks=st.integers(60, 400),
       timeout=st.sampled_from([None, 400_000, 2_000_000]), n_inst=st.integers(1, 3),
       seed=st.integers(1, 10_000))
def test_session_invariants(tmp_path, rounds, think, growth, blocks, timeout, n_inst, seed):
    """Random closed-loop runs under KV pressure and timeouts: conservation, causality, rounds."""
    spec = _spec(tmp_path, rounds=rounds, think_us=think, growth=growth, in_len=40,
                 out_len=24, rate=40.0, n=25, timeout=timeout, seed=seed)
    res = blis_fast.run(model=MODEL, workload_spec=spec, total_kv_blocks=blocks,
                        num_instances=n_inst, max_num_running_reqs=8)
    sim = res.simulation
    table = sim.table
    # conservation: every request ends in exactly one bucket
    cnt = sim.counters
    done = (cnt[:, InstanceCounter.COMPLETED].sum() + cnt[:, InstanceCounter.DROPPED].sum()
            + cnt[:, InstanceCounter.TIMED_OUT].sum() + sim.still_queued.sum() + sim.still_running.sum())
    assert done == table.n
    for rows in _sessions(table).values():
        rows.sort(key=lambda r: int(table.round_index[r]))
        assert [int(table.round_index[r]) for r in rows] == list(range(len(rows)))
        assert len(rows) <= rounds
        for parent, child in zip(rows, rows[1:], strict=False):
            # only a completed parent has a follow-up, and never before it completed
            assert sim.state[parent] == RequestState.COMPLETED
            assert (int(table.arrival_us[child])
                    >= int(table.arrival_us[parent]) + int(sim.e2e_us[parent]) + think)
