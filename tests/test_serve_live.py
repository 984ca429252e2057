"""``blis_fast/serve/live.py``: the live simulation behind ``blis serve`` is the run's simulation.

The fidelity contract (issue 33): requests submitted at times ``t_i`` with lengths
``(in_i, out_i)`` get the first-token, per-token and end times of ``blis run`` on a workload
with the same arrivals, and of ``blis replay`` of the trace ``write_trace`` writes, however
the clock is cut into ``advance`` calls. Also: tokens are never told late (each is made after
the previous ``advance`` and at or before this one), every request ends exactly once, a cancel
frees the request's KV blocks, ``next_event_us`` is honest, P/D and the autoscaler are refused.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blis_fast.errors import BlisConfigError
from blis_fast.options import build_options
from blis_fast.runner import execute_replay, execute_run
from blis_fast.serve.live import LiveSimulation

MODEL = "meta-llama/llama-3.1-8b-instruct"
BASE = {"model": MODEL, "num_instances": 2}
BIG_HORIZON = 10**15


def _run(extra: dict):
    """A ``blis run`` (in process) and its requests: arrivals, lengths, results."""
    res = execute_run(build_options({**BASE, **extra}))
    return res.prepared.table, res.simulation


def _drive(sim: LiveSimulation, arrivals, inputs, outputs, steps, cancels=None):
    """Submit every request at its arrival, advancing the clock by ``steps`` (cycled) in
    between and to the end; returns per handle (tokens, end, status, emitted-finished count)
    and checks that no token is told late."""
    tokens: dict[int, list[int]] = {}
    ends: dict[int, tuple[int, str]] = {}
    finished_count: dict[int, int] = {}
    state = {"t": 0, "prev": 0, "k": 0}

    def take(until: int) -> None:
        for e in sim.advance(until):
            assert all(state["prev"] < x <= until for x in e.tokens), (e, state["prev"], until)
            tokens.setdefault(e.handle, []).extend(e.tokens)
            if e.finished:
                assert e.end_us is not None and state["prev"] <= e.end_us <= until
                finished_count[e.handle] = finished_count.get(e.handle, 0) + 1
                ends[e.handle] = (e.end_us, e.status)
        state["prev"] = until

    def step() -> int:
        s = steps[state["k"] % len(steps)]
        state["k"] += 1
        return s

    cancels = cancels or {}
    handles = []
    for a, n_in, n_out in zip(arrivals, inputs, outputs, strict=True):
        while state["t"] + steps[state["k"] % len(steps)] < a:
            state["t"] += step()
            take(state["t"])
        handles.append(sim.submit(int(a), int(n_in), int(n_out)))
        state["t"] = max(state["t"], int(a))
        for h, when in list(cancels.items()):
            if when <= state["t"]:
                sim.cancel(h, state["t"])
                del cancels[h]
    while True:
        nxt = sim.next_event_us()
        if nxt is None:
            break
        state["t"] = max(state["t"] + step(), nxt)
        take(state["t"])
    return handles, tokens, ends, finished_count


def _check_against(table, res, handles, tokens, ends) -> None:
    """Every request's first token, token count, ITL sum and end equal the run's."""
    assert len(handles) == table.n
    for k, h in enumerate(handles):
        arrival = int(table.arrival_us[k])
        times = tokens.get(h, [])
        end, status = ends[h]
        if res.e2e_us[k] >= 0:
            assert status == "completed"
            assert times[0] - arrival == res.ttft_us[k], k
            assert end - arrival == res.e2e_us[k], k
            assert times[-1] - times[0] == res.itl_sum_us[k], k
            expected = res.itl_count[k] + 1 if res.length_capped[k] else table.output_len[k]
            assert len(times) == expected, k
            assert times == sorted(times)
        else:
            assert status != "completed", k


@pytest.fixture(scope="module")
def workload():
    """A busy two-instance run: queueing, batching, chunked prefill."""
    return _run({"num_requests": 80, "rate": 30, **BUSY})


BUSY = {"seed": 7, "long_prefill_token_threshold": 256}


def _live(extra: dict | None = None, **kw) -> LiveSimulation:
    """A live simulation with the run's options (BASE, then ``extra``: BUSY by default)."""
    return LiveSimulation(build_options({**BASE, **(BUSY if extra is None else extra)}), **kw)


def test_matches_blis_run(workload):
    table, res = workload
    sim = _live()
    handles, tokens, ends, count = _drive(sim, table.arrival_us, table.input_len,
                                          table.output_len, [7_919])
    _check_against(table, res, handles, tokens, ends)
    assert all(count[h] == 1 for h in handles)  # every request ends exactly once


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.integers(1, 60_000), min_size=1, max_size=6).filter(
    lambda s: sum(s) >= 2_000 * len(s)))  # some steps of 1 µs, a few thousand calls in all
def test_advance_granularity_changes_nothing(workload, steps):
    table, res = workload
    sim = _live()
    handles, tokens, ends, count = _drive(sim, table.arrival_us, table.input_len,
                                          table.output_len, steps)
    _check_against(table, res, handles, tokens, ends)
    assert sorted(count.values()) == [1] * table.n


def test_replay_of_written_trace_reproduces_tokens(workload, tmp_path):
    table, _ = workload
    sim = _live()
    handles, tokens, ends, _ = _drive(sim, table.arrival_us, table.input_len,
                                      table.output_len, [3_001, 17_000])
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    sim.write_trace(str(header), str(data))
    replayed = execute_replay(build_options({
        **BASE, **BUSY, "trace_header": str(header),
        "trace_data": str(data), "horizon": BIG_HORIZON}))
    _check_against(replayed.prepared.table, replayed.simulation, handles, tokens, ends)


def test_preempted_requests_end_as_in_the_run():
    """Under KV pressure requests are preempted and start again (BLIS semantics): tokens told
    before a preemption are not told again, and the stream ends at the run's E2E."""
    extra = {"num_requests": 40, "rate": 40, "seed": 3, "total_kv_blocks": 300}
    table, res = _run(extra)
    assert res.preemptions.sum() > 0
    sim = _live({"seed": 3, "total_kv_blocks": 300})
    handles, tokens, ends, _ = _drive(sim, table.arrival_us, table.input_len, table.output_len,
                                      [5_000])
    for k, h in enumerate(handles):
        end, status = ends[h]
        assert status == "completed"
        assert end - table.arrival_us[k] == res.e2e_us[k]
        assert len(tokens[h]) == table.output_len[k]
        if res.preemptions[k] == 0:
            assert tokens[h][0] - table.arrival_us[k] == res.ttft_us[k]


def test_growth_changes_nothing(workload):
    table, res = workload
    sim = _live(rows=16)  # rows grow at 16, 32, 64
    handles, tokens, ends, _ = _drive(sim, table.arrival_us, table.input_len,
                                      table.output_len, [11_000])
    _check_against(table, res, handles, tokens, ends)


def _stream(sim: LiveSimulation) -> list:
    """300 requests, a few in flight at a time; everything told, in order."""
    told = []
    t = 0
    for k in range(300):
        sim.submit(t, 200 + k % 50, 30 + k % 11)
        t += 37_000
        told += sim.advance(t)
    while (nxt := sim.next_event_us()) is not None:
        t = max(t, nxt + 1)
        told += sim.advance(t)
    return told


def test_step_log_stays_bounded_and_compaction_changes_nothing():
    """The step log is compacted (what no request in flight refers to is dropped) instead of
    growing with the server's age; every token time stays as without compaction."""
    sim = _live({"num_instances": 1}, rows=16)  # a step log of 1024 entries at the start
    told = _stream(sim)
    assert sim._eng.room.rows >= 300 and sim._eng.compactions > 0
    assert sim._eng.lg.time.shape[0] <= 2048  # 300 x ~35 steps were taken
    assert told == _stream(_live({"num_instances": 1}))  # 16384 entries: never compacted


def _shared_prefix_tokens(sim: LiveSimulation, forced_replay: bool, monkeypatch):
    """60 requests in three prefix groups (512 shared prompt tokens each) through a live
    simulation; per handle its token times and end."""
    from blis_fast.serve import live

    if forced_replay:  # the fallback: a rebuild that replays the log
        def refuse(old, new):
            raise live._LayoutChanged
        monkeypatch.setattr(live, "_copied_into", refuse)
    rng = np.random.default_rng(5)
    prefixes = rng.integers(0, 128_000, (3, 512))
    result: dict[int, tuple] = {}
    t = 0
    for k in range(60):
        ids = np.concatenate([prefixes[k % 3], rng.integers(0, 128_000, 40 + k)])
        sim.submit(t, ids.shape[0], 20 + k % 7, token_ids=ids)
        t += 9_000
        for e in sim.advance(t):
            times, _ = result.get(e.handle, ((), None))
            result[e.handle] = (times + e.tokens, e.end_us)
    while (nxt := sim.next_event_us()) is not None:
        t = max(t, nxt + 1)
        for e in sim.advance(t):
            times, _ = result.get(e.handle, ((), None))
            result[e.handle] = (times + e.tokens, e.end_us)
    assert sim.gauges().prefix_hits.sum() > 0
    return result


@pytest.mark.parametrize("forced_replay", [False, True])
def test_growth_with_prefix_hits_changes_nothing(monkeypatch, forced_replay):
    """Rows grown (by copying the state into bigger arrays, or by replaying the log) in the
    middle of a run with prefix-cache hits: every token time as with room from the start."""
    small = _live(rows=16)
    grown = _shared_prefix_tokens(small, forced_replay, monkeypatch)
    assert small._eng.room.rows >= 64
    assert grown == _shared_prefix_tokens(_live(), False, monkeypatch)


def test_next_event_is_honest(workload):
    table, _ = workload
    sim = _live()
    for k in range(10):
        sim.submit(int(table.arrival_us[k]), int(table.input_len[k]), int(table.output_len[k]))
    t = int(table.arrival_us[9])
    seen = sum(e.finished for e in sim.advance(t))  # news due before the clock: told now
    while (nxt := sim.next_event_us()) is not None:
        assert nxt >= t
        if nxt > t:
            assert sim.advance(nxt - 1) == []  # nothing happens before it
        out = sim.advance(nxt + 1)
        seen += sum(e.finished for e in out)
        t = nxt + 1
    assert seen == 10


def test_cancel_frees_kv_and_ends_once():
    sim = _live({"num_instances": 1})
    keep = sim.submit(0, 2000, 400)
    gone = sim.submit(0, 3000, 400)
    out = sim.advance(200_000)
    assert {e.handle for e in out} == {keep, gone}
    g = sim.gauges()
    assert g.running[0] == 2 and g.kv_usage[0] > 0
    used_both = g.kv_usage[0]
    sim.cancel(gone, 200_000)
    g = sim.gauges()
    assert g.running[0] == 1 and 0 < g.kv_usage[0] < used_both
    assert sim.status(gone) == "aborted"
    ended = []
    while (nxt := sim.next_event_us()) is not None:
        ended += [e for e in sim.advance(nxt + 1) if e.finished]
    assert [e.handle for e in ended] == [keep]  # nothing more about the cancelled one
    g = sim.gauges()
    assert g.running[0] == 0 and g.waiting[0] == 0 and g.kv_usage[0] == 0.0
    sim.cancel(keep, sim.now_us)  # cancelling a finished request changes nothing
    assert sim.status(keep) == "completed"


def test_cancel_while_queued_and_before_arrival():
    sim = _live({"num_instances": 1, "max_num_running_reqs": 1})
    first = sim.submit(0, 500, 200)
    queued = sim.submit(10, 500, 200)
    sim.advance(50_000)
    assert sim.gauges().waiting[0] == 1
    sim.cancel(queued, 50_000)
    assert sim.gauges().waiting[0] == 0
    later = sim.submit(60_000, 100, 5)
    sim.cancel(later, 60_000)  # its arrival event is still pending: taken off the heap
    ended = []
    while (nxt := sim.next_event_us()) is not None:  # (can be before the clock: news due)
        ended += [e.handle for e in sim.advance(max(nxt + 1, sim.now_us)) if e.finished]
    assert ended == [first]


def test_external_routing_uses_the_named_instance():
    sim = _live({"num_instances": 3}, external_routing=True)
    h = sim.submit(0, 100, 3, instance=2)
    out = sim.advance(1_000_000)
    assert [e.instance for e in out if e.handle == h][0] == 2
    with pytest.raises(ValueError, match="instance"):
        sim.submit(1_000_000, 100, 3)


def test_time_never_goes_back():
    sim = _live()
    sim.advance(1000)
    with pytest.raises(ValueError, match="before the simulation's clock"):
        sim.submit(999, 10, 1)
    with pytest.raises(ValueError, match="before the simulation's clock"):
        sim.advance(500)
    sim.submit(1000, 10, 1)  # at the clock: joins the next step


def test_pd_is_refused_in_one_line():
    with pytest.raises(BlisConfigError, match="P/D") as err:
        LiveSimulation(build_options({**BASE, "num_instances": 4, "prefill_instances": 2,
                                      "decode_instances": 2}))
    assert "\n" not in str(err.value)


def test_autoscaler_is_refused_in_one_line():
    with pytest.raises(BlisConfigError, match="autoscaler") as err:
        LiveSimulation(build_options({**BASE, "model_autoscaler_interval_us": 1_000_000}))
    assert "\n" not in str(err.value)


def test_unservable_request_is_dropped():
    sim = _live({"max_model_len": 1000})
    h = sim.submit(0, 990, 50)
    out = []
    while (nxt := sim.next_event_us()) is not None:
        out += sim.advance(nxt + 1)
    assert [(e.handle, e.status, e.finished) for e in out] == [(h, "dropped", True)]
    assert out[0].tokens == ()
    assert np.isfinite(out[0].end_us)
