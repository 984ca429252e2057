"""The KV cache's CPU tier (ENG-5.9, ENG-5.10): an LRU store of block hashes per instance,
filled by mirroring the running batch's full blocks after each step and read back by reloading
a request's missing prefix blocks into free GPU blocks, at a transfer cost the next step pays.

For the tier chain (``--kv-offload-config``) each slot also has a reference state
(``KVState.cpu_ref``, KVO-4.2): ready blocks (0) are on the LRU list and evictable, blocks
pinned by in-flight secondary writes (> 0) and blocks whose promotion is still being read
(-1) are off it, so eviction never picks them. April's tier never pins or promotes: every
block stays ready and it behaves as before.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv.hashtable import table_del, table_get, table_put
from blis_fast.kernels.kv.kv_layout import CpuMeta, KVConfig

CPU_MISS, CPU_HIT, CPU_HIT_PENDING = 0, 1, 2
"""Answers of :func:`cpu_lookup` (KVO-4.2)."""


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _cpu_unlink(kv, i, s):
    cm = kv.cpu_meta
    p = kv.cpu_prv[i, s]
    n = kv.cpu_nxt[i, s]
    if p >= 0:
        kv.cpu_nxt[i, p] = n
    else:
        cm[i, CpuMeta.HEAD] = n
    if n >= 0:
        kv.cpu_prv[i, n] = p
    else:
        cm[i, CpuMeta.TAIL] = p
    kv.cpu_prv[i, s] = -1
    kv.cpu_nxt[i, s] = -1


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _cpu_append(kv, i, s):
    cm = kv.cpu_meta
    tail = cm[i, CpuMeta.TAIL]
    kv.cpu_nxt[i, s] = -1
    kv.cpu_prv[i, s] = tail
    if tail >= 0:
        kv.cpu_nxt[i, tail] = s
    else:
        cm[i, CpuMeta.HEAD] = s
    cm[i, CpuMeta.TAIL] = s


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _cpu_evict_head(kv, i):
    """Drop the LRU head (the oldest ready block); False when the list is empty (every
    resident block pinned or awaiting its promotion, KVO-4.2)."""
    cm = kv.cpu_meta
    victim = cm[i, CpuMeta.HEAD]
    if victim < 0:
        return False
    _cpu_unlink(kv, i, victim)
    _cpu_release(kv, i, victim)
    cm[i, CpuMeta.EVICTABLE] -= 1
    cm[i, CpuMeta.EVICTIONS] += 1
    return True


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _cpu_release(kv, i, s):
    """Slot ``s`` (off the LRU list) leaves the tier: its key out of the table and cleared (a
    free slot holds key 0, which :func:`cpu_offer`'s hints rely on), the slot back on the free
    stack."""
    cm = kv.cpu_meta
    table_del(kv.cpu_ht, i, kv.cpu_hash[i, s])
    kv.cpu_hash[i, s] = 0
    kv.cpu_ref[i, s] = 0
    cm[i, CpuMeta.USED] -= 1
    kv.cpu_free[i, cm[i, CpuMeta.FREE_TOP]] = s
    cm[i, CpuMeta.FREE_TOP] += 1


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _cpu_take_slot(kv, i, h, ref):
    """Put ``h`` in a free slot with reference state ``ref`` (0: at the LRU tail; -1: off the
    list, a promotion in flight); the caller made room. Returns the slot."""
    cm = kv.cpu_meta
    cm[i, CpuMeta.FREE_TOP] -= 1
    s = kv.cpu_free[i, cm[i, CpuMeta.FREE_TOP]]
    kv.cpu_hash[i, s] = h
    kv.cpu_ref[i, s] = ref
    table_put(kv.cpu_ht, i, h, np.uint64(s))
    if ref == 0:
        _cpu_append(kv, i, s)
        cm[i, CpuMeta.EVICTABLE] += 1
    cm[i, CpuMeta.USED] += 1
    return s


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _cpu_touch(kv, i, s):
    """Move a ready slot to the LRU tail; a pinned or promoting slot is off the list and
    stays where it is (KVO-4.2)."""
    if kv.cpu_ref[i, s] == 0:
        _cpu_unlink(kv, i, s)
        _cpu_append(kv, i, s)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _cpu_store(kv, i, h):
    """Store a new key ready (KVO-4.3): when the tier is full evict the LRU head first; -1 when
    nothing is evictable (the mirror is skipped), else the slot."""
    if kv.cpu_meta[i, CpuMeta.USED] >= kv.cfg[KVConfig.CPU_CAPACITY]:
        if not _cpu_evict_head(kv, i):
            return -1
    return _cpu_take_slot(kv, i, h, 0)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def cpu_offer(kv, i, h, hint):
    """Mirror one GPU block of key ``h`` (KVO-4.3): a resident key is touched (0); a new one is
    stored (1, counted in ``MIRRORS``; the chain then cascades it, KVO-4.4) unless the tier is
    full with nothing evictable (-1, counted in ``MIRROR_SKIPPED``). Returns (that answer, the
    key's slot or -1). ``hint``: the slot the block was last seen in (-1: none), taken when
    it still holds ``h`` (a freed slot holds key 0), which spares the key table's lookup, the
    costly part of mirroring every running block at every step."""
    if hint >= 0 and kv.cpu_hash[i, hint] == h:
        s = hint
    else:
        s = table_get(kv.cpu_ht, i, h)
    if s >= 0:
        _cpu_touch(kv, i, s)
        return 0, s
    s = _cpu_store(kv, i, h)
    if s >= 0:
        kv.cpu_meta[i, CpuMeta.MIRRORS] += 1
        return 1, s
    kv.cpu_meta[i, CpuMeta.MIRROR_SKIPPED] += 1
    return -1, s


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def cpu_lookup(kv, i, h):
    """The CPU tier's answer for key ``h`` (KVO-4.2): CPU_MISS, CPU_HIT (ready or pinned) or
    CPU_HIT_PENDING (its promotion still in flight)."""
    s = table_get(kv.cpu_ht, i, h)
    if s < 0:
        return CPU_MISS
    if kv.cpu_ref[i, s] < 0:
        return CPU_HIT_PENDING
    return CPU_HIT


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def cpu_pin(kv, i, h):
    """One more in-flight write reads the block of key ``h`` (the write-through cascade,
    KVO-4.4): it leaves the LRU list on its first pin, so it cannot be evicted. A missing or
    promoting key is left alone."""
    s = table_get(kv.cpu_ht, i, h)
    if s < 0 or kv.cpu_ref[i, s] < 0:
        return
    if kv.cpu_ref[i, s] == 0:
        _cpu_unlink(kv, i, s)
        kv.cpu_meta[i, CpuMeta.EVICTABLE] -= 1
    kv.cpu_ref[i, s] += 1


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def cpu_unpin(kv, i, h):
    """A write of key ``h``'s block finished: on the last one the block returns to the LRU
    tail, evictable again. A missing or unpinned key is left alone."""
    s = table_get(kv.cpu_ht, i, h)
    if s < 0 or kv.cpu_ref[i, s] <= 0:
        return
    kv.cpu_ref[i, s] -= 1
    if kv.cpu_ref[i, s] == 0:
        _cpu_append(kv, i, s)
        kv.cpu_meta[i, CpuMeta.EVICTABLE] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def cpu_prepare_store(kv, i, keys, n, fresh):
    """Reserve slots for a promotion of ``keys[:n]`` from a secondary tier (KVO-4.6): the keys
    not resident (copied to the caller's scratch ``fresh``, room for ``n``) enter promoting
    (reference state -1, unreadable, unevictable) if they fit in the free slots plus the
    evictable ones, evicting the LRU heads they need; else nothing changes and the refusal
    is counted (``PROMO_FAILED``). Returns how many keys entered (0 = refused or none fresh);
    the fresh keys are ``fresh[:k]``."""
    cm = kv.cpu_meta
    k = 0
    for q in range(n):
        if table_get(kv.cpu_ht, i, keys[q]) < 0:
            fresh[k] = keys[q]
            k += 1
    if k == 0:
        return 0
    free = kv.cfg[KVConfig.CPU_CAPACITY] - cm[i, CpuMeta.USED]
    if k > free + cm[i, CpuMeta.EVICTABLE]:
        cm[i, CpuMeta.PROMO_FAILED] += 1
        return 0
    for _ in range(k - free):
        _cpu_evict_head(kv, i)
    for q in range(k):
        _cpu_take_slot(kv, i, fresh[q], -1)
    cm[i, CpuMeta.PROMO_FIRED] += 1
    cm[i, CpuMeta.PROMO_BLOCKS] += k
    return k


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def cpu_complete_store(kv, i, h, ok):
    """A promotion's read of key ``h`` completed: the block becomes ready at the LRU tail
    (``ok``) or leaves the tier (KVO-4.6). Only a promoting key changes: True when it did."""
    s = table_get(kv.cpu_ht, i, h)
    if s < 0 or kv.cpu_ref[i, s] != -1:
        return False
    if ok:
        kv.cpu_ref[i, s] = 0
        _cpu_append(kv, i, s)
        kv.cpu_meta[i, CpuMeta.EVICTABLE] += 1
    else:
        _cpu_release(kv, i, s)
    return True
