"""The tier chain's secondary tiers in the KV kernels (issue 32; spec kv-offload.md KVO-4.4,
KVO-4.5, KVO-5.4, KVO-6.7, KVO-7): the write-through cascade from the CPU tier, promotions back
from a secondary tier, the completions applied at each step start, and the deferral of a new
admission whose prefix must be fetched first.

A scenario with one NVMe-like tier (one read and one write server, 80 us, 7000/5000 B/us,
2 MiB blocks) checks the figures by hand; random sequences of admissions, mirrors, releases,
deferral polls and station polls check the invariants: every pin is an unfinished write, every
promoting block an unfinished read, bytes add up per tier, and a tier only ever holds blocks
the CPU tier held.
"""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.kernels.engine.state import new_request_arrays
from blis_fast.kernels.enums import RequestState
from blis_fast.kernels.hashing import chain_hash
from blis_fast.kernels.kv import kv_chain, kv_cpu
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.kv.hashtable import table_get
from blis_fast.kernels.kv.kv_chain import (
    DEFER_NONE,
    DEFER_PROMOTING,
    DEFER_RECOMPUTE,
    DEFER_RESOLVED,
    DEFER_RETRY,
    ChainMeta,
    Defer,
    new_chain_state,
    station_rows,
)
from blis_fast.kernels.kv.kv_cpu import CPU_HIT, CPU_HIT_PENDING, CPU_MISS
from blis_fast.kernels.kv.kv_layout import CpuMeta, KVMeta
from blis_fast.kernels.kv.kv_station import WRITE, JobField, StationMeta, TierState, new_station

BS = 16
BLOCK_BYTES = 2_097_152


# the kernels are compiled without the Numba runtime, so Python calls them through shims
@numba.njit
def _mirror(kv, i, batch, n, input_len, chain):
    kvc.mirror_to_cpu(kv, i, batch, n, input_len, chain)


@numba.njit
def _poll(kv, chain, i, now):
    kv_chain.chain_poll(chain, kv, i, now)


@numba.njit
def _poll_deferred(chain, kv, rs, i):
    kv_chain.poll_deferred(chain, kv, rs, i)


@numba.njit
def _holder(chain, i, h):
    return kv_chain.sec_holder(chain, i, h)


@numba.njit
def _lookup(kv, i, h):
    return kv_cpu.cpu_lookup(kv, i, h)


def _cache(lengths: list[int], shared: int, gpu: int, cpu: int, tiers: int, servers: int = 1):
    """One instance's chain cache: requests 0 and 1 share their first ``shared`` blocks, the
    others have blocks of their own; ``tiers`` identical NVMe-like tiers."""
    n_blocks = [-(-n // BS) for n in lengths]
    digests = []
    for r, n in enumerate(n_blocks):
        digests += [1000 + k if (k < shared and r < 2) else 10_000 * (r + 1) + k
                    for k in range(n)]
    offsets = np.concatenate([[0], np.cumsum(n_blocks)]).astype(np.int64)
    station = new_station(1, [servers] * tiers, [servers] * tiers, [80.0] * tiers,
                          [7000.0] * tiers, [5000.0] * tiers, [1] * tiers, [1.0] * tiers,
                          [0.0] * tiers, station_rows(cpu, tiers), 0)
    kv = kvc.new_kv_state(1, gpu, BS, offsets, np.array(digests, np.uint64) * np.uint64(7919),
                          np.array(lengths, np.int64), np.zeros(len(lengths), np.int64),
                          cpu_blocks=cpu, reload_first=True, prompt_only_mirror=True)
    ranks = np.arange(len(lengths), dtype=np.int64)[::-1].copy()  # polled last to first
    return kv, new_chain_state(1, len(digests), max(n_blocks), BLOCK_BYTES, station, tiers,
                               ranks)


class _Runner:
    def __init__(self, kv, chain, lengths: list[int]) -> None:
        self.kv = kv
        self.chain = chain
        self.lens = np.array(lengths, np.int64)
        self.scratch = np.zeros(64, np.int64)
        self.cached = np.zeros(64, np.int64)
        # every request waits on instance 0 between its admissions (each is released at once)
        self.rs = new_request_arrays(len(lengths), np.zeros(len(lengths), np.int64))
        self.rs.state[:] = RequestState.QUEUED
        self.rs.inst[:] = 0

    def step(self, r: int) -> bool:
        """Admit request ``r`` (allocation consults the chain, and may defer it), mirror it,
        release it. False when it was not admitted."""
        kv, n_in = self.kv, self.lens[r]
        n = kvc.cached_blocks(kv, 0, r, n_in, self.cached)
        ok = kvc.allocate(kv, 0, r, n * BS, n_in, True, n_in, self.cached, n, self.scratch,
                          self.chain)
        if ok:
            _mirror(kv, 0, np.array([r], np.int64), 1, self.lens, self.chain)
        kvc.release(kv, 0, r)
        return bool(ok)

    def poll_deferred(self) -> None:
        _poll_deferred(self.chain, self.kv, self.rs, 0)

    def phase(self, r: int) -> int:
        return int(self.chain.defer[r, Defer.PHASE])

    def cpu_keys(self) -> list[int]:
        """The keys resident on the CPU tier, by slot."""
        return [int(self.kv.cpu_hash[0, s]) for s in _resident(self.kv)]


@numba.njit
def _slot(kv, h):
    return table_get(kv.cpu_ht, 0, h)


def _resident(kv) -> list[int]:
    """The CPU slots holding a key (a freed slot keeps its stale key, not in the table)."""
    return [s for s in range(kv.cpu_hash.shape[1])
            if kv.cpu_hash[0, s] != 0 and int(_slot(kv, kv.cpu_hash[0, s])) == s]


def _figures(chain, t: int = 0) -> tuple[int, ...]:
    ts = chain.station.tier_state[0, t]
    return (int(ts[TierState.WRITES]), int(ts[TierState.BYTES_WRITTEN]),
            int(ts[TierState.READS]), int(ts[TierState.BYTES_READ]))


# KVO-4.4, KVO-5.4, KVO-6.7, KVO-7.4/7.5
def test_a_block_written_through_comes_back_by_a_deferred_promotion():
    lengths = [4 * BS, 4 * BS, 8 * BS]
    kv, chain = _cache(lengths, shared=4, gpu=8, cpu=4, tiers=1)
    run = _Runner(kv, chain, lengths)
    _poll(kv, chain, 0, 0)
    assert run.step(0)  # 4 new CPU blocks, each pinned by its write (2 servers busy at once)
    keys = [np.uint64(h) for h in run.cpu_keys()]
    assert list(kv.cpu_ref[0]) == [1] * 4 and kv.cpu_meta[0, CpuMeta.EVICTABLE] == 0
    assert [_holder(chain, 0, h) for h in keys] == [-1] * 4  # nothing landed yet
    _poll(kv, chain, 0, 997)  # writes: 80 + 2097152 // 5000 = 499 us: two by 499, two by 998
    assert [_holder(chain, 0, h) for h in keys].count(0) == 2
    _poll(kv, chain, 0, 1000)
    assert [_holder(chain, 0, h) for h in keys] == [0] * 4
    assert list(kv.cpu_ref[0]) == [0] * 4
    assert _figures(chain) == (4, 4 * BLOCK_BYTES, 0, 0)
    assert run.step(2)  # 8 blocks: the first 4 evict request 0's and are pinned, 4 skipped
    assert kv.cpu_meta[0, CpuMeta.MIRROR_SKIPPED] == 4
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_MISS] * 4
    _poll(kv, chain, 0, 2000)
    # request 1's prefix is only on the tier, never probed: deferred a step (the probe)
    assert not run.step(1) and run.phase(1) == DEFER_RETRY
    assert kv.cpu_meta[0, CpuMeta.PROMO_FIRED] == 0
    assert chain.meta[0, ChainMeta.DEFERRALS] == 1
    run.poll_deferred()  # the probe answered: the run is promoted, one read
    assert run.phase(1) == DEFER_PROMOTING and kv.cpu_meta[0, CpuMeta.PROMO_FIRED] == 1
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_HIT_PENDING] * 4
    assert _figures(chain)[2:] == (1, 4 * BLOCK_BYTES)
    assert not run.step(1)  # still awaiting its read
    _poll(kv, chain, 0, 3277)  # one read of 4 blocks: 80 + 8388608 // 7000 = 1278 us from 2000
    run.poll_deferred()
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_HIT_PENDING] * 4
    assert run.phase(1) == DEFER_PROMOTING
    _poll(kv, chain, 0, 3278)
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_HIT] * 4
    assert kv.cpu_meta[0, CpuMeta.EVICTABLE] == 4
    run.poll_deferred()
    assert run.phase(1) == DEFER_RESOLVED
    hits = int(kv.meta[0, KVMeta.HITS])
    assert run.step(1) and run.phase(1) == DEFER_NONE  # admitted, the 4 blocks reloaded
    assert int(kv.meta[0, KVMeta.HITS]) == hits + 4
    assert chain.meta[0, ChainMeta.DEFER_HEAD] == -1


# KVO-4.6 through the chain: a promotion finding every CPU block pinned is refused
def test_a_promotion_is_refused_while_every_cpu_block_is_pinned():
    lengths = [4 * BS, 4 * BS, 8 * BS, 4 * BS]
    kv, chain = _cache(lengths, shared=4, gpu=8, cpu=4, tiers=1)
    run = _Runner(kv, chain, lengths)
    _poll(kv, chain, 0, 0)
    run.step(0)
    _poll(kv, chain, 0, 1000)
    run.step(2)  # request 0's prefix leaves the GPU and the CPU; the CPU is pinned again
    assert not run.step(1) and run.phase(1) == DEFER_RETRY
    run.poll_deferred()
    assert kv.cpu_meta[0, CpuMeta.PROMO_FAILED] == 1
    assert kv.cpu_meta[0, CpuMeta.PROMO_FIRED] == 0
    assert _figures(chain)[2] == 0
    assert run.phase(1) == DEFER_RECOMPUTE
    assert run.step(1) and run.phase(1) == DEFER_NONE  # admitted as a miss


# KVO-7.6: a request that left the queue is forgotten at the next poll
def test_a_request_that_left_the_queue_is_forgotten():
    lengths = [4 * BS, 4 * BS, 8 * BS]
    kv, chain = _cache(lengths, shared=4, gpu=8, cpu=4, tiers=1)
    run = _Runner(kv, chain, lengths)
    _poll(kv, chain, 0, 0)
    run.step(0)
    _poll(kv, chain, 0, 1000)
    run.step(2)
    assert not run.step(1) and run.phase(1) == DEFER_RETRY
    run.rs.state[1] = RequestState.TIMED_OUT
    run.poll_deferred()
    assert run.phase(1) == DEFER_NONE and chain.meta[0, ChainMeta.DEFER_HEAD] == -1
    assert kv.cpu_meta[0, CpuMeta.PROMO_FIRED] == 0  # nothing fired for it


def _tracked(chain) -> list[int]:
    out, r = [], int(chain.meta[0, ChainMeta.DEFER_HEAD])
    while r >= 0:
        out.append(r)
        r = int(chain.defer[r, Defer.NEXT])
    return out


def _in_flight(chain) -> list[int]:
    """Job rows submitted and not yet applied (every row not on the free list)."""
    st = chain.station
    free, j = set(), int(st.meta[0, StationMeta.FREE_HEAD])
    while j >= 0:
        free.add(j)
        j = int(st.jobs[0, j, JobField.NEXT])
    return [j for j in range(st.jobs.shape[1]) if j not in free]


def _read_keys(kv, chain, j: int) -> set[int]:
    """The keys of the run promotion read ``j`` brings back."""
    r, first, n, key = (int(x) for x in chain.reads[0, j])
    keys, h = set(), np.uint64(key % 2**64)
    for q in range(n):
        if q:
            h = np.uint64(chain_hash(h, kv.chunk_dig[int(kv.chunk_off[r]) + first + q]))
        keys.add(int(h))
    return keys


def _check(kv, chain, seen_on_cpu: set[int], n_tiers: int) -> None:
    st = chain.station
    rows = _in_flight(chain)
    writes = [int(st.jobs[0, j, JobField.TAG]) for j in rows
              if st.jobs[0, j, JobField.DIR] == WRITE]
    promoting: set[int] = set()  # the keys unfinished reads bring back
    for j in rows:
        if st.jobs[0, j, JobField.DIR] != WRITE:
            promoting |= _read_keys(kv, chain, j)
    resident = set(_resident(kv))
    # a pinned block has one unfinished write per pin; a promoting one an unfinished read
    for s in resident:
        ref = int(kv.cpu_ref[0, s])
        if ref == -1:
            assert int(kv.cpu_hash[0, s]) in promoting, s
        else:
            assert ref == writes.count(s), (s, ref)
    assert int(kv.cpu_meta[0, CpuMeta.USED]) == len(resident) <= kv.cpu_hash.shape[1]
    assert int(kv.cpu_meta[0, CpuMeta.EVICTABLE]) == sum(
        1 for s in resident if kv.cpu_ref[0, s] == 0)
    # bytes add up per tier: every write is one block, every read whole blocks
    reads = 0
    for t in range(n_tiers):
        w, bw, r, br = _figures(chain, t)
        assert bw == w * BLOCK_BYTES and br % BLOCK_BYTES == 0 and br >= r * BLOCK_BYTES
        reads += r
    assert reads <= kv.cpu_meta[0, CpuMeta.PROMO_FIRED]
    # every block a tier holds was written from the CPU tier
    held = {int(chain.sec_ht[0, j, 0]) for j in range(chain.sec_ht.shape[1])
            if chain.sec_ht[0, j, 0]}
    assert held <= seen_on_cpu


@settings(max_examples=60, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(BS, 8 * BS), min_size=3, max_size=6),
       shared=st.integers(0, 4), gpu=st.integers(10, 24), cpu=st.integers(1, 8),
       tiers=st.integers(1, 2), servers=st.integers(1, 3),
       ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 900)), min_size=1,
                    max_size=25))
def test_pins_promotions_and_bytes_stay_accounted(lengths, shared, gpu, cpu, tiers, servers,
                                                  ops):
    """KVO-4.2..4.6, KVO-6.7, KVO-7.3/7.4: after every admission, deferral poll and station
    poll; the tracked requests stay in id order, each in a live phase."""
    kv, chain = _cache(lengths, shared, gpu, cpu, tiers, servers)
    run = _Runner(kv, chain, lengths)
    seen: set[int] = set()
    now = 0
    _poll(kv, chain, 0, now)
    for r, dt in ops:
        run.step(r % len(lengths))
        seen |= set(run.cpu_keys())
        _check(kv, chain, seen, tiers)
        now += dt
        _poll(kv, chain, 0, now)
        run.poll_deferred()
        _check(kv, chain, seen, tiers)
        tracked = _tracked(chain)
        ranks = [int(chain.id_rank[q]) for q in tracked]
        assert ranks == sorted(ranks)
        assert all(run.phase(q) in (DEFER_RETRY, DEFER_PROMOTING, DEFER_RESOLVED,
                                    DEFER_RECOMPUTE) for q in tracked)
        assert sum(run.phase(q) != DEFER_NONE for q in range(len(lengths))) == len(tracked)
    _poll(kv, chain, 0, now + 10**9)  # everything lands: nothing pinned or promoting is left
    _check(kv, chain, seen, tiers)
    assert all(int(x) >= 0 for x in kv.cpu_ref[0]) and _in_flight(chain) == []
