"""The tier chain's secondary tiers in the KV kernels (issue 32; spec kv-offload.md KVO-4.4,
KVO-4.5, KVO-5.4, KVO-6.7): the write-through cascade from the CPU tier, promotions back from a
secondary tier, and the completions applied at each step start.

A scenario with one NVMe-like tier (one read and one write server, 80 us, 7000/5000 B/us,
2 MiB blocks) checks the figures by hand; random sequences of admissions, mirrors, releases and
polls check the invariants: every pin is an unfinished write, every promoting block an
unfinished read, bytes add up per tier, and a tier only ever holds blocks the CPU tier held.
"""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.kernels.kv import kv_chain, kv_cpu
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.kv.hashtable import table_get
from blis_fast.kernels.kv.kv_cpu import CPU_HIT, CPU_HIT_PENDING, CPU_MISS
from blis_fast.kernels.kv.kv_layout import CpuMeta
from blis_fast.kernels.kv.kv_station import WRITE, JobField, StationMeta, TierState, new_station

BS = 16
BLOCK_BYTES = 2_097_152


# the kernels are compiled without the Numba runtime, so Python calls them through shims
@numba.njit
def _mirror(kv, i, batch, n, input_len):
    kvc.mirror_to_cpu(kv, i, batch, n, input_len)


@numba.njit
def _poll(kv, i, now):
    kv_chain.chain_poll(kv, i, now)


@numba.njit
def _holder(kv, i, h):
    return kv_chain.sec_holder(kv, i, h)


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
                          [0.0] * tiers, cpu * (tiers + 1), 0)
    return kvc.new_kv_state(1, gpu, BS, offsets,
                            np.array(digests, np.uint64) * np.uint64(7919),
                            np.array(lengths, np.int64), np.zeros(len(lengths), np.int64),
                            cpu_blocks=cpu, reload_first=True, prompt_only_mirror=True,
                            station=station, n_tiers=tiers, block_bytes=BLOCK_BYTES)


class _Runner:
    def __init__(self, kv, lengths: list[int]) -> None:
        self.kv = kv
        self.lens = np.array(lengths, np.int64)
        self.scratch = np.zeros(64, np.int64)
        self.cached = np.zeros(64, np.int64)

    def step(self, r: int) -> None:
        """Admit request ``r`` (allocation consults the chain), mirror it, release it."""
        kv, n_in = self.kv, self.lens[r]
        n = kvc.cached_blocks(kv, 0, r, n_in, self.cached)
        if kvc.allocate(kv, 0, r, n * BS, n_in, True, n_in, self.cached, n, self.scratch):
            _mirror(kv, 0, np.array([r], np.int64), 1, self.lens)
        kvc.release(kv, 0, r)

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


def _figures(kv, t: int = 0) -> tuple[int, ...]:
    ts = kv.station.tier_state[0, t]
    return (int(ts[TierState.WRITES]), int(ts[TierState.BYTES_WRITTEN]),
            int(ts[TierState.READS]), int(ts[TierState.BYTES_READ]))


# KVO-4.4, KVO-5.4, KVO-6.7
def test_a_block_written_through_comes_back_by_promotion():
    lengths = [4 * BS, 4 * BS, 8 * BS]
    kv = _cache(lengths, shared=4, gpu=8, cpu=4, tiers=1)
    run = _Runner(kv, lengths)
    _poll(kv, 0, 0)
    run.step(0)  # 4 new CPU blocks, each pinned by its write (2 servers busy at once)
    keys = [np.uint64(h) for h in run.cpu_keys()]
    assert list(kv.cpu_ref[0]) == [1] * 4 and kv.cpu_meta[0, CpuMeta.EVICTABLE] == 0
    assert [_holder(kv, 0, h) for h in keys] == [-1] * 4  # nothing landed yet
    _poll(kv, 0, 997)  # writes take 80 + 2097152 // 5000 = 499 us: two by 499, two by 998
    assert [_holder(kv, 0, h) for h in keys].count(0) == 2
    _poll(kv, 0, 1000)
    assert [_holder(kv, 0, h) for h in keys] == [0] * 4
    assert list(kv.cpu_ref[0]) == [0] * 4
    assert _figures(kv) == (4, 4 * BLOCK_BYTES, 0, 0)
    run.step(2)  # 8 blocks: the first 4 evict request 0's and are pinned, the rest skipped
    assert kv.cpu_meta[0, CpuMeta.MIRROR_SKIPPED] == 4
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_MISS] * 4
    _poll(kv, 0, 2000)
    run.step(1)  # request 0's prefix: off the GPU and the CPU, on the tier: promoted
    assert kv.cpu_meta[0, CpuMeta.PROMO_FIRED] == 1
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_HIT_PENDING] * 4
    assert _figures(kv)[2:] == (1, 4 * BLOCK_BYTES)
    _poll(kv, 0, 3277)  # one read of 4 blocks: 80 + 8388608 // 7000 = 1278 us from 2000
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_HIT_PENDING] * 4
    _poll(kv, 0, 3278)
    assert [_lookup(kv, 0, h) for h in keys] == [CPU_HIT] * 4
    assert kv.cpu_meta[0, CpuMeta.EVICTABLE] == 4


# KVO-4.6 through the chain: a promotion finding every CPU block pinned is refused
def test_a_promotion_is_refused_while_every_cpu_block_is_pinned():
    lengths = [4 * BS, 4 * BS, 8 * BS, 4 * BS]
    kv = _cache(lengths, shared=4, gpu=8, cpu=4, tiers=1)
    run = _Runner(kv, lengths)
    _poll(kv, 0, 0)
    run.step(0)
    _poll(kv, 0, 1000)
    run.step(2)  # request 0's prefix leaves the GPU and the CPU; the CPU is pinned again
    run.step(1)
    assert kv.cpu_meta[0, CpuMeta.PROMO_FAILED] == 1
    assert kv.cpu_meta[0, CpuMeta.PROMO_FIRED] == 0
    assert _figures(kv)[2] == 0


def _in_flight(kv) -> list[int]:
    """Job rows submitted and not yet applied (every row not on the free list)."""
    st = kv.station
    free, j = set(), int(st.meta[0, StationMeta.FREE_HEAD])
    while j >= 0:
        free.add(j)
        j = int(st.jobs[0, j, JobField.NEXT])
    return [j for j in range(st.jobs.shape[1]) if j not in free]


def _check(kv, seen_on_cpu: set[int], n_tiers: int) -> None:
    st = kv.station
    rows = _in_flight(kv)
    writes = [int(st.jobs[0, j, JobField.TAG]) for j in rows
              if st.jobs[0, j, JobField.DIR] == WRITE]
    promoting = set()
    for j in rows:
        if st.jobs[0, j, JobField.DIR] != WRITE:
            s = int(st.jobs[0, j, JobField.TAG])
            while s >= 0:
                promoting.add(s)
                s = int(kv.cpu_nxt[0, s])
    resident = set(_resident(kv))
    # a pinned block has one unfinished write per pin; a promoting one an unfinished read
    for s in resident:
        ref = int(kv.cpu_ref[0, s])
        assert ref == (-1 if s in promoting else writes.count(s)), (s, ref)
    assert int(kv.cpu_meta[0, CpuMeta.USED]) == len(resident) <= kv.cpu_hash.shape[1]
    assert int(kv.cpu_meta[0, CpuMeta.EVICTABLE]) == sum(
        1 for s in resident if kv.cpu_ref[0, s] == 0)
    # bytes add up per tier: every write is one block, every read whole blocks
    reads = 0
    for t in range(n_tiers):
        w, bw, r, br = _figures(kv, t)
        assert bw == w * BLOCK_BYTES and br % BLOCK_BYTES == 0 and br >= r * BLOCK_BYTES
        reads += r
    assert reads <= kv.cpu_meta[0, CpuMeta.PROMO_FIRED]
    # every block a tier holds was written from the CPU tier
    held = {int(kv.sec_ht[0, j, 0]) for j in range(kv.sec_ht.shape[1]) if kv.sec_ht[0, j, 0]}
    assert held <= seen_on_cpu


@settings(max_examples=60, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(BS, 8 * BS), min_size=3, max_size=6),
       shared=st.integers(0, 4), gpu=st.integers(10, 24), cpu=st.integers(1, 8),
       tiers=st.integers(1, 2), servers=st.integers(1, 3),
       ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 900)), min_size=1,
                    max_size=25))
def test_pins_promotions_and_bytes_stay_accounted(lengths, shared, gpu, cpu, tiers, servers,
                                                  ops):
    """KVO-4.2..4.6, KVO-6.7: after every admission and every poll."""
    kv = _cache(lengths, shared, gpu, cpu, tiers, servers)
    run = _Runner(kv, lengths)
    seen: set[int] = set()
    now = 0
    _poll(kv, 0, now)
    for r, dt in ops:
        run.step(r % len(lengths))
        seen |= set(run.cpu_keys())
        _check(kv, seen, tiers)
        now += dt
        _poll(kv, 0, now)
        _check(kv, seen, tiers)
    _poll(kv, 0, now + 10**9)  # everything lands: nothing pinned or promoting is left
    _check(kv, seen, tiers)
    assert all(int(x) >= 0 for x in kv.cpu_ref[0]) and _in_flight(kv) == []
