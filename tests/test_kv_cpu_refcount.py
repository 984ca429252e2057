"""The tier chain's CPU tier reference states (issue 32; spec kv-offload.md KVO-4.2, 4.3, 4.6).

A slot is ready (0, on the LRU list, evictable), pinned by n in-flight secondary writes (n > 0,
off the list) or awaiting its promotion's read (-1, off the list, looked up as pending). The
kernels are driven by random operation sequences and compared, after every operation, with a
small Python model of those rules: lookups, the LRU order, the counters, and that a pinned or
promoting block is never evicted.
"""

from __future__ import annotations

from collections import OrderedDict

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blis_fast.kernels.kv import kv_cpu
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.kv.kv_cpu import CPU_HIT, CPU_HIT_PENDING, CPU_MISS
from blis_fast.kernels.kv.kv_layout import CpuMeta

KEYS = 10


# the kernels are compiled without the Numba runtime, so Python calls them through shims
@numba.njit
def cpu_offer(kv, i, h):
    return kv_cpu.cpu_offer(kv, i, h, -1)[0]


@numba.njit
def cpu_offer_hinted(kv, i, h, hint):
    return kv_cpu.cpu_offer(kv, i, h, hint)


@numba.njit
def cpu_lookup(kv, i, h):
    return kv_cpu.cpu_lookup(kv, i, h)


@numba.njit
def cpu_pin(kv, i, h):
    kv_cpu.cpu_pin(kv, i, h)


@numba.njit
def cpu_unpin(kv, i, h):
    kv_cpu.cpu_unpin(kv, i, h)


@numba.njit
def cpu_prepare_store(kv, i, keys, n, fresh):
    return kv_cpu.cpu_prepare_store(kv, i, keys, n, fresh)


@numba.njit
def cpu_complete_store(kv, i, h, ok):
    kv_cpu.cpu_complete_store(kv, i, h, ok)


def _key(k: int) -> np.uint64:
    return np.uint64((k + 1) * 7919)


class _Model:
    """The rules of KVO-4.2..4.6 in plain Python: key -> reference state, the ready keys in
    LRU order, the counters."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.ref: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.evictions = self.mirrors = self.skipped = self.fired = self.failed = 0

    def _evict(self) -> bool:
        if not self.lru:
            return False
        victim, _ = self.lru.popitem(last=False)
        del self.ref[victim]
        self.evictions += 1
        return True

    def offer(self, k: int) -> int:
        if k in self.ref:
            if self.ref[k] == 0:
                self.lru.move_to_end(k)
            return 0
        if len(self.ref) >= self.cap and not self._evict():
            self.skipped += 1
            return -1
        self.ref[k] = 0
        self.lru[k] = None
        self.mirrors += 1
        return 1

    def pin(self, k: int) -> None:
        if self.ref.get(k, -1) < 0:
            return
        if self.ref[k] == 0:
            del self.lru[k]
        self.ref[k] += 1

    def unpin(self, k: int) -> None:
        if self.ref.get(k, 0) <= 0:
            return
        self.ref[k] -= 1
        if self.ref[k] == 0:
            self.lru[k] = None

    def prepare(self, keys: list[int]) -> int:
        fresh = [k for k in keys if k not in self.ref]
        if not fresh:
            return 0
        free = self.cap - len(self.ref)
        if len(fresh) > free + len(self.lru):
            self.failed += 1
            return 0
        for _ in range(len(fresh) - free):
            self._evict()
        for k in fresh:
            self.ref[k] = -1
        self.fired += 1
        return len(fresh)

    def complete(self, k: int, ok: bool) -> None:
        if self.ref.get(k) != -1:
            return
        if ok:
            self.ref[k] = 0
            self.lru[k] = None
        else:
            del self.ref[k]

    def lookup(self, k: int) -> int:
        if k not in self.ref:
            return CPU_MISS
        return CPU_HIT_PENDING if self.ref[k] < 0 else CPU_HIT


def _lru_keys(kv) -> list[int]:
    out, s = [], int(kv.cpu_meta[0, CpuMeta.HEAD])
    while s >= 0:
        out.append(int(kv.cpu_hash[0, s]) // 7919 - 1)
        s = int(kv.cpu_nxt[0, s])
    return out


def _tier(cap: int):
    return kvc.new_kv_state(1, 4, 16, np.zeros(1, np.int64), np.zeros(0, np.uint64),
                            np.zeros(0, np.int64), np.zeros(0, np.int64), cpu_blocks=cap,
                            reload_first=True, prompt_only_mirror=True)


_OPS = st.one_of(
    st.tuples(st.just("offer"), st.integers(0, KEYS - 1)),
    st.tuples(st.just("offer_hinted"), st.tuples(st.integers(0, KEYS - 1), st.integers(-1, 5))),
    st.tuples(st.just("pin"), st.integers(0, KEYS - 1)),
    st.tuples(st.just("unpin"), st.integers(0, KEYS - 1)),
    st.tuples(st.just("prepare"), st.lists(st.integers(0, KEYS - 1), min_size=1, max_size=4,
                                           unique=True)),
    st.tuples(st.just("complete"), st.tuples(st.integers(0, KEYS - 1), st.booleans())),
)


# KVO-4.2, KVO-4.3, KVO-4.6
@settings(max_examples=150, deadline=None, derandomize=True)
@given(cap=st.integers(1, 6), ops=st.lists(_OPS, max_size=40))
def test_reference_states_follow_the_rules(cap: int, ops: list) -> None:
    kv = _tier(cap)
    model = _Model(cap)
    fresh = np.zeros(KEYS, np.uint64)
    for op, arg in ops:
        pinned = {k for k, r in model.ref.items() if r != 0}
        if op == "offer":
            assert cpu_offer(kv, 0, _key(arg)) == model.offer(arg)
        elif op == "offer_hinted":  # any slot as the hint, right or wrong: the same answer
            key, hint = arg
            answer, slot = cpu_offer_hinted(kv, 0, _key(key), min(hint, cap - 1))
            assert answer == model.offer(key)
            assert (slot >= 0) == (answer >= 0)
            assert slot < 0 or kv.cpu_hash[0, slot] == _key(key)
        elif op == "pin":
            cpu_pin(kv, 0, _key(arg))
            model.pin(arg)
        elif op == "unpin":
            cpu_unpin(kv, 0, _key(arg))
            model.unpin(arg)
        elif op == "prepare":
            keys = np.array([_key(k) for k in arg], np.uint64)
            granted = cpu_prepare_store(kv, 0, keys, len(arg), fresh)
            assert granted == model.prepare(arg)
        else:
            cpu_complete_store(kv, 0, _key(arg[0]), arg[1])
            model.complete(*arg)
        # a pinned or promoting block is never evicted (only a failed read drops one)
        dropped = arg[0] if op == "complete" and not arg[1] else -1
        # a free slot holds no key (a hint to it never matches)
        free = kv.cpu_free[0, :int(kv.cpu_meta[0, CpuMeta.FREE_TOP])]
        assert (kv.cpu_hash[0, free] == 0).all()
        assert all(cpu_lookup(kv, 0, _key(k)) != CPU_MISS for k in pinned if k != dropped)
        assert [cpu_lookup(kv, 0, _key(k)) for k in range(KEYS)] == \
            [model.lookup(k) for k in range(KEYS)]
        assert _lru_keys(kv) == list(model.lru)
        cm = kv.cpu_meta[0]
        assert (cm[CpuMeta.USED], cm[CpuMeta.EVICTABLE], cm[CpuMeta.EVICTIONS],
                cm[CpuMeta.MIRRORS], cm[CpuMeta.MIRROR_SKIPPED], cm[CpuMeta.PROMO_FIRED],
                cm[CpuMeta.PROMO_FAILED]) == (len(model.ref), len(model.lru), model.evictions,
                                              model.mirrors, model.skipped, model.fired,
                                              model.failed)
        assert len(model.ref) <= cap


# KVO-4.3: full, every block pinned: the mirror is skipped and nothing is evicted
def test_mirror_skipped_when_nothing_is_evictable() -> None:
    kv = _tier(2)
    for k in (0, 1):
        assert cpu_offer(kv, 0, _key(k)) == 1
        cpu_pin(kv, 0, _key(k))
    assert cpu_offer(kv, 0, _key(2)) == -1
    assert kv.cpu_meta[0, CpuMeta.MIRROR_SKIPPED] == 1
    assert kv.cpu_meta[0, CpuMeta.EVICTIONS] == 0
    cpu_unpin(kv, 0, _key(0))
    assert cpu_offer(kv, 0, _key(2)) == 1  # key 0 evictable again: it goes
    assert [cpu_lookup(kv, 0, _key(k)) for k in range(3)] == [CPU_MISS, CPU_HIT, CPU_HIT]


# KVO-4.6: the gate counts evictable blocks, not free ones
def test_promotion_gate_counts_evictable_blocks() -> None:
    kv = _tier(3)
    fresh = np.zeros(4, np.uint64)
    for k in (0, 1, 2):
        cpu_offer(kv, 0, _key(k))
    cpu_pin(kv, 0, _key(0))
    run = np.array([_key(5), _key(6), _key(7)], np.uint64)
    assert cpu_prepare_store(kv, 0, run, 3, fresh) == 0  # 0 free + 2 evictable < 3
    assert kv.cpu_meta[0, CpuMeta.PROMO_FAILED] == 1
    assert cpu_prepare_store(kv, 0, run, 2, fresh) == 2  # evicts keys 1 and 2
    assert [cpu_lookup(kv, 0, _key(k)) for k in (0, 1, 2, 5, 6)] == \
        [CPU_HIT, CPU_MISS, CPU_MISS, CPU_HIT_PENDING, CPU_HIT_PENDING]
    cpu_complete_store(kv, 0, _key(5), True)
    cpu_complete_store(kv, 0, _key(6), False)
    assert [cpu_lookup(kv, 0, _key(k)) for k in (5, 6)] == [CPU_HIT, CPU_MISS]
    assert kv.cpu_meta[0, CpuMeta.USED] == 2
