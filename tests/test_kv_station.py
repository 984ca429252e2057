"""The KV offload chain's transfer station (issue 32; spec kv-offload.md KVO-6), kernel by
kernel: service times (the spec's worked examples), servers and queues, the ramp, completion
order, jitter streams, and on random job mixes the accounting invariants."""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.kernels.go.gorand import new_source, norm_float64, subsystem_seed
from blis_fast.kernels.kv import kv_station as ks
from blis_fast.kernels.kv.kv_station import READ, WRITE, JobField, TierState

BLOCK = 2_097_152  # llama-3.1-8b KV bytes per 16-token block, TP 1 (KVO-3.2)


# the station's kernels have no Python wrapper: small jitted shims call them
@numba.njit
def _submit(s, i, t, d, nbytes, tick, jitter, tag):
    return ks.submit(s, i, t, d, nbytes, tick, jitter, tag)


@numba.njit
def _poll(s, i, now):
    return ks.poll(s, i, now)


@numba.njit
def _release(s, i):
    n = s.meta[i, ks.StationMeta.DONE_LEN]
    for k in range(n):
        ks.free_job(s, i, s.done[i, k])
    ks.clear_done(s, i)


@numba.njit
def _svc(s, t, d, nbytes, q):
    return ks.service_ticks(s, t, d, nbytes, q)


@numba.njit
def _jitter(s, i, t):
    return ks.draw_jitter(s, i, t)


def _station(n_read=16, n_write=16, base=80.0, rbw=7.0e3, wbw=5.0e3, qsat=0, f1=1.0, sigma=0.0,
             instances=1, rows=64, seed=0):
    return ks.new_station(instances, [n_read], [n_write], [base], [rbw], [wbw], [qsat], [f1],
                          [sigma], rows, subsystem_seed(seed, "kv-offload"))


def _done(s, i=0) -> list[tuple[int, int]]:
    """(id, complete_at) of the jobs handed over by the last poll, in order."""
    n = int(s.meta[i, ks.StationMeta.DONE_LEN])
    return [(int(s.jobs[i, j, JobField.ID]), int(s.jobs[i, j, JobField.COMPLETE_AT]))
            for j in s.done[i, :n]]


def test_the_spec_examples():
    """KVO-6.3: one llama-8B block written to nvme_gen4 takes 80 + floor(2 097 152 / 5000) =
    499 µs; a 64-block read from s3 30 000 + floor(134 217 728 / 1000) = 164 217 µs."""
    assert _svc(_station(), 0, WRITE, BLOCK, 1) == 499
    s3 = _station(base=30_000.0, rbw=1.0e3, wbw=1.0e3)
    assert _svc(s3, 0, READ, 64 * BLOCK, 1) == 164_217
    s = _station()
    _submit(s, 0, 0, WRITE, BLOCK, 1000, 0.0, 7)
    assert _poll(s, 0, 1498) == 0
    assert _poll(s, 0, 1499) == 1 and _done(s) == [(1, 1499)]


def test_the_ramp_slows_a_lone_transfer():
    """KVO-6.4: with Qsat 4 and f1 0.25 a job started alone gets a quarter of the bandwidth,
    the second concurrent one half, from the fourth on all of it."""
    s = _station(rbw=1000.0, wbw=1000.0, base=0.0, qsat=4, f1=0.25)
    assert [_svc(s, 0, READ, 1_000_000, q) for q in (1, 2, 3, 4, 9)] == [4000, 2000, 1333,
                                                                          1000, 1000]
    # depth counts the same direction's jobs in service when a job starts
    _submit(s, 0, 0, READ, 1_000_000, 0, 0.0, 0)
    _submit(s, 0, 0, READ, 1_000_000, 0, 0.0, 0)
    _submit(s, 0, 0, WRITE, 1_000_000, 0, 0.0, 0)
    assert _poll(s, 0, 10_000) == 3
    assert sorted(c for _, c in _done(s)) == [2000, 4000, 4000]


def test_servers_take_their_direction_first_then_the_other_queue():
    """KVO-6.1: one read and one write server; three reads at tick 0 take both servers (no
    write waits), the third waits for the first to finish; a write submitted behind them is
    taken by the write server first once it frees. Ties complete by submit tick, tier,
    direction, id (KVO-6.7)."""
    s = _station(n_read=1, n_write=1, base=100.0, rbw=1.0, wbw=1.0)
    for _ in range(3):
        _submit(s, 0, 0, READ, 0, 0, 0.0, 0)
    _submit(s, 0, 0, WRITE, 0, 10, 0.0, 0)
    assert _poll(s, 0, 100) == 2 and _done(s) == [(1, 100), (2, 100)]
    _release(s, 0)
    # at 100 the read server took read 3 (its queue first), the write server write 4
    assert _poll(s, 0, 200) == 2 and _done(s) == [(3, 200), (4, 200)]
    ts = s.tier_state[0, 0]
    assert ts[TierState.READS] == 3 and ts[TierState.WRITES] == 1
    assert ts[TierState.QUEUE_WAIT] == 100 + 90


def test_a_submit_starts_at_the_station_clock_and_completions_wait_for_a_poll():
    """A job submitted before the station's clock starts at the clock; a job completed by a
    submit's advance is handed over only by the next poll (KVO-6.7, KVO-D9)."""
    s = _station(base=10.0, rbw=1.0, wbw=1.0)
    _submit(s, 0, 0, READ, 0, 0, 0.0, 0)
    assert _poll(s, 0, 50) == 1
    _release(s, 0)
    _submit(s, 0, 0, READ, 0, 20, 0.0, 0)  # earlier than the clock (50): starts at 50
    _submit(s, 0, 0, READ, 0, 70, 0.0, 0)  # advances to 70: the first completed at 60
    assert _poll(s, 0, 70) == 1 and _done(s) == [(2, 60)]


def test_jitter_scales_service_and_every_instance_draws_the_same_stream():
    """KVO-6.5/6.6: σ 0 draws nothing; σ > 0 draws ``max(0.05, 1 + N(0,1)σ)`` from Go's
    math/rand seeded ``seed XOR fnv1a64("kv-offload")``, the same on every instance
    (KVO-D5); service time is the rounded product."""
    quiet = _station(instances=2)
    before = quiet.rng.copy()
    assert _jitter(quiet, 0, 0) == 0.0 and np.array_equal(quiet.rng, before)
    s = _station(instances=3, sigma=0.3, seed=42)
    src = new_source(subsystem_seed(42, "kv-offload"))
    expected = [max(0.05, 1 + norm_float64(src) * 0.3) for _ in range(20)]
    for i in range(3):
        assert [_jitter(s, i, 0) for _ in range(20)] == expected
    wide = _station(sigma=50.0, seed=1)
    assert min(_jitter(wide, 0, 0) for _ in range(200)) == 0.05
    s = _station(base=80.0)
    _submit(s, 0, 0, WRITE, BLOCK, 0, 1.5, 0)
    # 499 x 1.5 = 748.5: Go's math.Round takes halves away from zero
    assert _poll(s, 0, 10_000) == 1 and _done(s) == [(1, 749)]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(jobs=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 4 * BLOCK),
                               st.integers(0, 2000)), min_size=1, max_size=40),
       servers=st.tuples(st.integers(0, 3), st.integers(0, 3)),
       ramp=st.tuples(st.integers(0, 5), st.floats(0.05, 1.0)),
       polls=st.lists(st.integers(0, 4000), max_size=6))
def test_every_job_completes_once_in_order_and_the_figures_add_up(jobs, servers, ramp, polls):
    """Random jobs on two tiers, submitted in tick order with polls between: each completes
    exactly once, never before its submit tick plus its base latency, handed over in
    non-decreasing completion ticks; no tier ever has more jobs in service than servers;
    the tier figures add up to the bytes and jobs submitted."""
    n_read, n_write = servers
    if n_read + n_write == 0:
        n_read = 1
    s = ks.new_station(1, [n_read, 2], [n_write, 1], [80.0, 30.0], [7.0e3, 1.0e3],
                       [5.0e3, 1.0e3], [ramp[0], 0], [ramp[1], 1.0], [0.0, 0.0], 64, 0)
    events = sorted([(tick, "job", k) for k, (_, _, _, tick) in enumerate(jobs)]
                    + [(tick, "poll", k) for k, tick in enumerate(polls)])
    seen: list[tuple[int, int]] = []
    submitted = {}
    for tick, kind, k in events:
        if kind == "job":
            tier, d, nbytes, _ = jobs[k]
            j = _submit(s, 0, tier, d, nbytes, tick, 0.0, k)
            assert j >= 0
            submitted[int(s.jobs[0, j, JobField.ID])] = (tier, d, nbytes, tick)
        else:
            _poll(s, 0, tick)
            seen += _done(s)
            _release(s, 0)
        for t, (nr, nw) in enumerate(((n_read, n_write), (2, 1))):
            busy = s.tier_state[0, t, TierState.ACTIVE_READ] + s.tier_state[0, t,
                                                                            TierState.ACTIVE_WRITE]
            assert busy <= nr + nw
    _poll(s, 0, 1 << 50)
    seen += _done(s)
    assert sorted(i for i, _ in seen) == sorted(submitted)
    ticks = [c for _, c in seen]
    assert ticks == sorted(ticks)
    for job_id, done_at in seen:
        tier, _, _, tick = submitted[job_id]
        assert done_at >= tick + (80 if tier == 0 else 30)
    for t in (0, 1):
        mine = [v for v in submitted.values() if v[0] == t]
        ts = s.tier_state[0, t]
        assert ts[TierState.READS] == sum(1 for v in mine if v[1] == READ)
        assert ts[TierState.WRITES] == sum(1 for v in mine if v[1] == WRITE)
        assert ts[TierState.BYTES_READ] == sum(v[2] for v in mine if v[1] == READ)
        assert ts[TierState.BYTES_WRITTEN] == sum(v[2] for v in mine if v[1] == WRITE)
