"""The KV cache's building blocks: block hashes and the prefix table's change log, the LRU free
list, and what a block's tokens are (ENG-5.3..5.5, DELTA-14).

A block's token contents are never stored, only where they come from: the reference writes the
tokens at positions ``[start, end)`` of the request's sequence (input ++ output) after the end of
its block list, and hashes a block when it fills. A block filled by one block-aligned run holds
that chunk, and its hash is ``chain_hash(prev block's hash, chunk digest)``. A CPU-tier reload
can leave the list out of step with the next tokens (ENG-5.10.4: commits a failed allocation
keeps, a queued request that keeps its committed blocks); the blocks written then hold
unaligned runs, or runs from two places, and get a digest of those runs instead.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.hashing import splitmix64
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv.hashtable import table_del, table_put
from blis_fast.kernels.kv.kv_layout import (
    LOG_DELETE,
    LOOK_HASH,
    LOOK_RECORD,
    POS_MASK,
    BlockField,
    BlockList,
    KVConfig,
    KVMeta,
)
from blis_fast.kernels.prefetch import prefetch

_RUN_SALT = np.uint64(0xD6E8FEB86659FD93)  # keeps run digests apart from chunk digests


# ---------------------------------------------------------------- block hashes and the change log


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def get_block_hash(kv, i, b):
    lo = np.uint64(np.uint32(kv.blk[i, b, BlockField.HASH_LO]))
    hi = np.uint64(np.uint32(kv.blk[i, b, BlockField.HASH_HI]))
    return (hi << np.uint64(32)) | lo


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def set_block_hash(kv, i, b, h):
    h = np.uint64(h)
    kv.blk[i, b, BlockField.HASH_LO] = np.int32(np.uint32(h & np.uint64(0xFFFFFFFF)))
    kv.blk[i, b, BlockField.HASH_HI] = np.int32(np.uint32(h >> np.uint64(32)))


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _log_change(kv, i, h, v):
    """Record a change of the prefix table for the router's delayed copy (DELTA-33)."""
    if kv.cfg[KVConfig.LOG_CHANGES] == 0 or kv.meta[i, KVMeta.LOG_OVERFLOW] == 1:
        return
    k = kv.meta[i, KVMeta.LOG_LEN]
    if k >= kv.ht_log.shape[1]:
        kv.meta[i, KVMeta.LOG_OVERFLOW] = 1
        return
    kv.ht_log[i, k, 0] = h
    kv.ht_log[i, k, 1] = v
    kv.meta[i, KVMeta.LOG_LEN] = k + 1


@njit(cache=True, _nrt=False, error_model="numpy")
def ht_put(kv, i, h, b):
    table_put(kv.ht, i, h, np.uint64(b))
    _log_change(kv, i, h, np.uint64(b))


@njit(cache=True, _nrt=False, error_model="numpy")
def ht_del(kv, i, h):
    table_del(kv.ht, i, h)
    _log_change(kv, i, h, LOG_DELETE)


@njit(cache=True, _nrt=False, error_model="numpy")
def sync_frozen_copy(kv, i, frozen):
    """Bring ``frozen`` (a copy of instance ``i``'s prefix table) up to date: replay the logged
    changes, or copy the whole table when the log overflowed; then clear the log."""
    if kv.meta[i, KVMeta.LOG_OVERFLOW] == 1:
        for j in range(kv.ht.shape[1]):
            frozen[i, j, 0] = kv.ht[i, j, 0]
            frozen[i, j, 1] = kv.ht[i, j, 1]
    else:
        for k in range(kv.meta[i, KVMeta.LOG_LEN]):
            h = kv.ht_log[i, k, 0]
            v = kv.ht_log[i, k, 1]
            if v == LOG_DELETE:
                table_del(frozen, i, h)
            else:
                table_put(frozen, i, h, np.uint64(v))
    kv.meta[i, KVMeta.LOG_LEN] = 0
    kv.meta[i, KVMeta.LOG_OVERFLOW] = 0


# ---------------------------------------------------------------- the GPU free list


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _free_live(kv, i, b, pos):
    """True when the ring entry at ``pos`` holding block ``b`` is the block's current entry."""
    return kv.blk[i, b, BlockField.FREE] == 1 and kv.blk[i, b, BlockField.POS] == (pos & POS_MASK)


@njit(cache=True, _nrt=False, error_model="numpy")
def _free_compact(kv, i):
    """Squeeze the stale entries out of instance ``i``'s ring, keeping the order."""
    ring = kv.free_ring
    mask = ring.shape[1] - 1
    w = kv.meta[i, KVMeta.HEAD]
    for p in range(kv.meta[i, KVMeta.HEAD], kv.meta[i, KVMeta.TAIL]):
        b = ring[i, p & mask]
        if _free_live(kv, i, b, p):
            ring[i, w & mask] = b
            kv.free_slot[i, w & mask] = kv.free_slot[i, p & mask]
            kv.blk[i, b, BlockField.POS] = np.int32(w & POS_MASK)
            w += 1
    kv.meta[i, KVMeta.TAIL] = w


@njit(cache=True, _nrt=False, error_model="numpy")
def free_append(kv, i, b):
    """Put block ``b`` at the tail (most recently freed end) of the free list."""
    meta = kv.meta
    mask = kv.free_ring.shape[1] - 1
    if meta[i, KVMeta.TAIL] - meta[i, KVMeta.HEAD] > mask:
        _free_compact(kv, i)  # live entries (free blocks) fill at most half of the ring
    t = meta[i, KVMeta.TAIL]
    kv.free_ring[i, t & mask] = b
    h = get_block_hash(kv, i, b)
    kv.free_slot[i, t & mask] = np.int32(h & np.uint64(kv.ht.shape[1] - 1)) if h != 0 else -1
    meta[i, KVMeta.TAIL] = t + 1
    meta[i, KVMeta.FREE] += 1
    kv.blk[i, b, BlockField.POS] = np.int32(t & POS_MASK)
    kv.blk[i, b, BlockField.FREE] = 1


@njit(cache=True, _nrt=False, error_model="numpy")
def free_remove(kv, i, b):
    """Take free block ``b`` off the list wherever it is (its ring entry goes stale)."""
    kv.meta[i, KVMeta.FREE] -= 1
    kv.blk[i, b, BlockField.FREE] = 0


@njit(cache=True, _nrt=False, error_model="numpy")
def pop_free(kv, i):
    """Take the LRU head of the free list and drop its hash mapping (ENG-5.4, DELTA-14)."""
    meta = kv.meta
    if meta[i, KVMeta.FREE] == 0:
        return np.int64(-1)
    ring = kv.free_ring
    mask = ring.shape[1] - 1
    pos = meta[i, KVMeta.HEAD]
    b = np.int64(ring[i, pos & mask])
    while not _free_live(kv, i, b, pos):
        pos += 1
        b = np.int64(ring[i, pos & mask])
    meta[i, KVMeta.HEAD] = pos + 1
    free_remove(kv, i, b)
    kv.blk[i, b, BlockField.TOKENS] = 0
    h = get_block_hash(kv, i, b)
    if h != 0:
        ht_del(kv, i, h)
        set_block_hash(kv, i, b, 0)
    # free blocks are cold: ask for the records and the hash-table slots (deleted when
    # popped) of the blocks a few pops ahead (a stale entry just makes a useless hint)
    tail = meta[i, KVMeta.TAIL]
    if pos + 1 + LOOK_HASH < tail:
        slot = kv.free_slot[i, (pos + 1 + LOOK_HASH) & mask]
        if slot >= 0:
            prefetch(kv.ht, (i, slot))
    if pos + 1 + LOOK_RECORD < tail:
        prefetch(kv.blk, (i, ring[i, (pos + 1 + LOOK_RECORD) & mask]))
    return b


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def has_room(kv, r):
    """True while request ``r``'s block list fits in its slice of ``pool``."""
    end = kv.req[r + 1, BlockList.OFFSET] if r + 1 < kv.req.shape[0] else kv.pool.shape[0]
    return kv.req[r, BlockList.OFFSET] + kv.req[r, BlockList.COUNT] < end


# ---------------------------------------------------------------- block contents


@njit(cache=True, _nrt=False, error_model="numpy")
def _chunk_digest(kv, r, c):
    """Content digest of chunk ``c`` of request ``r``; the sequence's last, partial chunk has
    none, so it gets a value of its own (no other request holds those tokens)."""
    k = kv.chunk_off[r] + c
    if k < kv.chunk_off[r + 1]:
        return kv.chunk_dig[k]
    return splitmix64((np.uint64(r) << np.uint64(24)) ^ np.uint64(c) ^ _RUN_SALT)


@njit(cache=True, _nrt=False, error_model="numpy")
def _run_digest(kv, r, pos, length):
    """Digest of the tokens at positions ``[pos, pos + length)`` of request ``r``'s sequence
    that do not form one aligned chunk: a function of the chunks they lie in and the offset."""
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    h = splitmix64(np.uint64(length) * _RUN_SALT ^ np.uint64(pos % bs))
    for c in range(pos // bs, (pos + length - 1) // bs + 1):
        h = splitmix64(h ^ _chunk_digest(kv, r, c))
    return h


@njit(cache=True, _nrt=False, error_model="numpy")
def block_digest(kv, r, pos):
    """Content digest of a full block written in one run from sequence position ``pos``."""
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    if pos % bs == 0:
        return kv.chunk_dig[kv.chunk_off[r] + pos // bs]
    return _run_digest(kv, r, pos, bs)


@njit(cache=True, _nrt=False, error_model="numpy")
def last_block_digest(kv, r):
    """Content digest of request ``r``'s last block, now full (BlockList.LAST == block size)."""
    run0 = kv.req[r, BlockList.RUN0]
    if run0 == 0:
        return block_digest(kv, r, kv.req[r, BlockList.SEGMENT])
    run = _run_digest(kv, r, kv.req[r, BlockList.SEGMENT], kv.cfg[KVConfig.BLOCK_SIZE] - run0)
    return splitmix64(np.uint64(kv.req[r, BlockList.MIX]) ^ run)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def next_pos(kv, r):
    """Sequence position that continues the run the last block of request ``r`` ends with."""
    return kv.req[r, BlockList.SEGMENT] + kv.req[r, BlockList.LAST] - kv.req[r, BlockList.RUN0]


@njit(cache=True, _nrt=False, error_model="numpy")
def start_run(kv, r, pos):
    """Tokens from ``pos`` go on in the partly filled last block, which ends elsewhere: close
    its current run (fold it into BlockList.MIX) and start a new one."""
    mix = np.uint64(0)
    if kv.req[r, BlockList.RUN0] > 0:
        mix = np.uint64(kv.req[r, BlockList.MIX])
    run = _run_digest(kv, r, kv.req[r, BlockList.SEGMENT], kv.req[r, BlockList.LAST] - kv.req[r, BlockList.RUN0])
    kv.req[r, BlockList.MIX] = np.int64(splitmix64(mix ^ run) >> np.uint64(1))
    kv.req[r, BlockList.RUN0] = kv.req[r, BlockList.LAST]
    kv.req[r, BlockList.SEGMENT] = pos


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def sync_last(kv, i, r):
    """Bring the last block's BlockField.TOKENS up to the request's authoritative BlockList.LAST count."""
    cnt = kv.req[r, BlockList.COUNT]
    if cnt > 0:
        kv.blk[i, kv.pool[kv.req[r, BlockList.OFFSET] + cnt - 1], BlockField.TOKENS] = kv.req[r, BlockList.LAST]


@njit(cache=True, _nrt=False, error_model="numpy")
def commit_cached(kv, i, r, blocks, lo, hi):
    """Append cached blocks ``blocks[lo:hi]`` (block ``k`` holds chunk ``k``) to the list."""
    off = kv.req[r, BlockList.OFFSET]
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    for k in range(lo, hi):
        b = blocks[k]
        kv.blk[i, b, BlockField.REF] += 1
        if kv.blk[i, b, BlockField.FREE] == 1:
            free_remove(kv, i, b)
        kv.meta[i, KVMeta.HITS] += 1
        if not has_room(kv, r):
            kv.meta[i, KVMeta.LIST_OVERFLOW] = 1
            return
        kv.pool[off + kv.req[r, BlockList.COUNT]] = b
        kv.req[r, BlockList.COUNT] += 1
        kv.req[r, BlockList.LAST] = kv.blk[i, b, BlockField.TOKENS]
        kv.req[r, BlockList.SEGMENT] = k * bs
        kv.req[r, BlockList.RUN0] = 0
