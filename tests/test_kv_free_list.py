"""The KV cache's free list (a ring with stale entries) against a plain Python LRU list
(``naive.LRUFreeList``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from naive import LRUFreeList

from blis_fast.kernels.kv import kv_blocks as kvb
from blis_fast.kernels.kv import kvcache as kvc

TOTAL = 6  # blocks per instance: a ring of 16 entries, so long runs compact it often


def _state(n_instances: int = 2):
    """An empty cache of TOTAL blocks per instance (no requests)."""
    empty = np.zeros(0, np.int64)
    return kvc.new_kv_state(n_instances, TOTAL, 16, np.zeros(1, np.int64),
                            np.zeros(0, np.uint64), empty, empty)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["pop", "append", "remove"]),
                              st.integers(0, 1), st.integers(0, TOTAL - 1)), max_size=300))
def test_free_list_keeps_lru_order(ops: list[tuple[str, int, int]]) -> None:
    kv = _state()
    model = [LRUFreeList(TOTAL), LRUFreeList(TOTAL)]  # free blocks, LRU head first
    for op, i, b in ops:
        free = model[i]
        if op == "pop":
            got = kvb.pop_free(kv, i)
            assert got == free.pop()
        elif op == "append" and b not in free:
            kvb.free_append(kv, i, b)
            free.append(b)
        elif op == "remove" and b in free:
            kvb.free_remove(kv, i, b)
            free.remove(b)
        assert kv.meta[i, kvc.KVMeta.FREE] == len(free)
        assert kv.meta[i, kvc.KVMeta.TAIL] - kv.meta[i, kvc.KVMeta.HEAD] <= kv.free_ring.shape[1]
        assert [int(x) for x in np.flatnonzero(kv.blk[i, :, kvc.BlockField.FREE] == 1)] == sorted(
            free.order)
    for i in range(2):  # drain: the rest comes out in LRU order
        assert [kvb.pop_free(kv, i) for _ in range(len(model[i]))] == model[i].order
        assert kvb.pop_free(kv, i) == -1


def test_free_list_compacts_stale_entries() -> None:
    kv = _state(1)
    for _ in range(50):  # each round leaves a stale entry: the ring must compact to go on
        kvb.free_remove(kv, 0, 2)
        kvb.free_append(kv, 0, 2)
    assert kv.meta[0, kvc.KVMeta.TAIL] - kv.meta[0, kvc.KVMeta.HEAD] <= kv.free_ring.shape[1]
    assert [kvb.pop_free(kv, 0) for _ in range(TOTAL)] == [0, 1, 3, 4, 5, 2]
