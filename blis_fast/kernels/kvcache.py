"""Block KV cache with prefix caching, LRU free list and optional CPU tier (ENG-5, DELTA-13/14).

All instances' caches live in 2-D arrays indexed ``[instance, block]``. A block's token
contents are never stored, only where they come from: the reference writes the tokens at
positions ``[start, end)`` of the request's sequence (input ++ output) after the end of its
block list, and hashes a block when it fills. A block filled by one block-aligned run holds
that chunk, and its hash is ``chain_hash(prev block's hash, chunk digest)``. A CPU-tier reload
can leave the list out of step with the next tokens (ENG-5.10.4: commits a failed allocation
keeps, a queued request that keeps its committed blocks); the blocks written then hold
unaligned runs, or runs from two places, and get a digest of those runs instead.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from blis_fast.kernels.hashing import chain_hash, splitmix64
from blis_fast.kernels.prefetch import prefetch

KVState = namedtuple(
    "KVState",
    [
        # per block, int32 [n_instances, n_blocks, 8]: one 32-byte record per block (a block is
        # touched as a whole, so its fields share a cache line): B_REF reference count,
        # B_TOK tokens held, B_POS position of its free-list entry (see ``free_ring``), B_FREE
        # 1 when on the free list (the reference's !InUse), B_HLO/B_HHI the 64-bit block hash
        # (0 = none); field 3 is unused
        "blk",
        # per instance, [n_instances, 8] int64: free-list head and tail positions, free count,
        # hits, misses, change-log length and overflow flag, list-overflow flag
        "meta",
        # changes to each instance's prefix hash table since the router last froze a copy of it
        # ([n_instances, log_size, 2]: key, block or LOG_DELETE); only with a cache-signal delay
        "ht_log",
        # prefix hash table per instance (open addressing, linear probing; key 0 = empty)
        "ht",  # uint64 [n_instances, table_size, 2]: key, value side by side (one cache line)
        # per request, int64 [n_requests, 8]: R_OFF offset of its block list in ``pool``,
        # R_CNT blocks held (0 = no RequestMap entry), R_LAST tokens in its last block, and
        # where the last block's tokens come from: R_RUN0 tokens written before its current
        # run (0 when one run fills it), R_SEG sequence position of that run's first token,
        # R_MIX digest of the earlier runs. R_LAST is authoritative: the decode fast path
        # bumps only it, and the last block's B_TOK is brought up to date before any other use.
        "req",
        "pool",  # int64 block ids
        # request digests (from the RequestTable)
        "chunk_off",
        "chunk_dig",
        # CPU tier (tiered mode only; 1-slot arrays otherwise)
        "cpu_ht",  # uint64 [n_instances, cpu_table_size, 2] hash -> slot table
        "cpu_hash",  # uint64 [n_instances, cpu_blocks]
        "cpu_prv",  # int32 LRU links
        "cpu_nxt",
        "cpu_free",  # int32 free-slot stack
        # per instance [n_instances, 12] int64: lru head, lru tail, used, free top, evictions,
        # mirrors, cpu hits, cpu misses, pending transfer latency
        "cpu_meta",
        # int64 config: block size, total blocks, tiered flag, cpu capacity,
        # ticks per reloaded block (base latency + transfer)
        "cfg",
        # the free list in LRU order, per instance a ring (int32 [n_instances, 2^k]) of block
        # ids between positions M_HEAD and M_TAIL; an entry is live iff its block is free and
        # its B_POS is that position (a block taken off the list mid-way just leaves a stale
        # entry). Popping walks an array, so the next blocks' records can be prefetched.
        "free_ring",
        # beside each ring entry, the home slot in ``ht`` of the block's hash when it was
        # freed (-1 = no hash): the slot a pop will probe, prefetched a few pops ahead
        "free_slot",
    ],
)

M_HEAD, M_TAIL, M_FREE, M_HITS, M_MISSES, M_LOG_LEN, M_LOG_OVERFLOW, M_LIST_OVERFLOW = range(8)
C_HEAD, C_TAIL, C_USED, C_FREETOP, C_EVICT, C_MIRROR, C_HIT, C_MISS, C_PENDING = range(9)
B_REF, B_TOK, B_POS, B_FREE, B_HLO, B_HHI = 0, 1, 2, 4, 5, 6
POS_MASK = (1 << 31) - 1  # B_POS holds a position modulo 2^31 (a ring spans far fewer)
LOOK_RECORD, LOOK_HASH = 16, 8  # blocks ahead whose record / hash slot a loop prefetches
R_OFF, R_CNT, R_SEG, R_LAST, R_RUN0, R_MIX = range(6)
REQ_FIELDS = 8
CFG_BS, CFG_BLOCKS, CFG_TIERED, CFG_CPU_CAP, CFG_RELOAD_TICKS, CFG_HASH_DECODE, CFG_LOG = range(7)
LOG_DELETE = np.uint64(0xFFFFFFFFFFFFFFFF)  # value recorded for a deleted key
_RUN_SALT = np.uint64(0xD6E8FEB86659FD93)  # keeps run digests apart from chunk digests


def pool_slots(input_len, output_len, block_size: int, tiered: bool):
    """Block-list slots each request gets in ``KVState.pool`` (its blocks, plus slack)."""
    per_req = (input_len + output_len + block_size - 1) // block_size + 1
    if tiered:
        # CPU reloads commit cached blocks without the usual coverage bound (the reference
        # appends them to the request's list as they come): leave room, and guard the rest
        per_req = 2 * per_req + 8
    return per_req


def new_kv_state(
    n_instances: int,
    total_blocks: int,
    block_size: int,
    chunk_offsets: np.ndarray,
    chunk_digests: np.ndarray,
    input_len: np.ndarray,
    output_len: np.ndarray,
    cpu_blocks: int = 0,
    reload_ticks: int = 0,
    hash_decode_blocks: bool = False,
    log_changes: bool = False,
    pool_extra: int = 0,
    chunk_capacity: int | None = None,
) -> KVState:
    """Allocate an empty cache for every instance, sized from the workload.

    Blocks completed by output tokens join the hash chain in the reference, for every
    request (ENG-5.4). Their hashes can only ever be looked up when a later request's input
    contains an earlier request's output (accumulating multi-turn sessions, open or closed
    loop) or when the CPU tier mirrors them, so they are registered only then
    (``hash_decode_blocks``, or tiered mode); otherwise skipping them changes no output and
    halves the hash-table traffic.

    Closed-loop runs add requests while the simulation runs: ``pool_extra`` block-list slots
    are reserved beyond the listed requests' slices and the hash tables are sized for
    ``chunk_capacity`` chunk digests in all (default: those of ``chunk_offsets``).
    """
    n_req = len(input_len)
    total_chunks = int(chunk_offsets[-1]) if len(chunk_offsets) else 0
    if chunk_capacity is not None:
        total_chunks = max(total_chunks, int(chunk_capacity))
    table_entries = max(1, min(total_blocks, total_chunks + 1))
    table_size = 16
    while table_size < 2 * table_entries:
        table_size *= 2
    per_req = pool_slots(input_len, output_len, block_size, cpu_blocks > 0)
    req = np.zeros((n_req, REQ_FIELDS), dtype=np.int64)
    if n_req:
        req[1:, R_OFF] = np.cumsum(per_req)[:-1]
    pool = np.zeros(int(per_req.sum()) + int(pool_extra) + 1, dtype=np.int64)
    blk = np.zeros((n_instances, total_blocks, 8), dtype=np.int32)
    ids = np.arange(total_blocks, dtype=np.int32)
    blk[:, :, B_POS] = ids
    blk[:, :, B_FREE] = 1
    ring_size = 16
    while ring_size < 2 * total_blocks:
        ring_size *= 2
    free_ring = np.zeros((n_instances, ring_size), dtype=np.int32)
    free_ring[:, :total_blocks] = ids
    free_slot = np.full((n_instances, ring_size), -1, dtype=np.int32)
    meta = np.zeros((n_instances, 8), dtype=np.int64)
    meta[:, M_HEAD] = 0
    meta[:, M_TAIL] = total_blocks
    meta[:, M_FREE] = total_blocks
    tiered = cpu_blocks > 0
    cpu_cap = cpu_blocks if tiered else 1
    cpu_entries = max(1, min(cpu_cap, total_chunks + 1))
    cpu_table = 16
    while cpu_table < 2 * cpu_entries:
        cpu_table *= 2
    cpu_meta = np.zeros((n_instances, 12), dtype=np.int64)
    cpu_meta[:, C_HEAD] = -1
    cpu_meta[:, C_TAIL] = -1
    cpu_meta[:, C_FREETOP] = cpu_cap
    cpu_free = np.empty((n_instances, cpu_cap), dtype=np.int32)
    cpu_free[:] = np.arange(cpu_cap - 1, -1, -1, dtype=np.int32)
    cfg = np.array([block_size, total_blocks, 1 if tiered else 0, cpu_cap, reload_ticks,
                    1 if (tiered or hash_decode_blocks) else 0, 1 if log_changes else 0],
                   dtype=np.int64)
    return KVState(
        blk=blk,
        meta=meta,
        ht=np.zeros((n_instances, table_size, 2), dtype=np.uint64),
        ht_log=np.zeros((n_instances, 4096 if log_changes else 1, 2), dtype=np.uint64),
        req=req,
        pool=pool,
        chunk_off=chunk_offsets,
        chunk_dig=chunk_digests,
        cpu_ht=np.zeros((n_instances, cpu_table, 2), dtype=np.uint64),
        cpu_hash=np.zeros((n_instances, cpu_cap), dtype=np.uint64),
        cpu_prv=np.full((n_instances, cpu_cap), -1, dtype=np.int32),
        cpu_nxt=np.full((n_instances, cpu_cap), -1, dtype=np.int32),
        cpu_free=cpu_free,
        cpu_meta=cpu_meta,
        cfg=cfg,
        free_ring=free_ring,
        free_slot=free_slot,
    )


# ---------------------------------------------------------------- block hashes


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _get_hash(kv, i, b):
    lo = np.uint64(np.uint32(kv.blk[i, b, B_HLO]))
    hi = np.uint64(np.uint32(kv.blk[i, b, B_HHI]))
    return (hi << np.uint64(32)) | lo


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _set_hash(kv, i, b, h):
    h = np.uint64(h)
    kv.blk[i, b, B_HLO] = np.int32(np.uint32(h & np.uint64(0xFFFFFFFF)))
    kv.blk[i, b, B_HHI] = np.int32(np.uint32(h >> np.uint64(32)))


# ---------------------------------------------------------------- hash tables


@njit(cache=True, _nrt=False, error_model="numpy")
def _table_get(table, i, h):
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while True:
        k = table[i, j, 0]
        if k == h:
            return np.int64(table[i, j, 1])
        if k == 0:
            return np.int64(-1)
        j = (j + 1) & mask


@njit(cache=True, _nrt=False, error_model="numpy")
def _table_put(table, i, h, v):
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while True:
        k = table[i, j, 0]
        if k == h or k == 0:
            table[i, j, 0] = h
            table[i, j, 1] = np.uint64(v)
            return
        j = (j + 1) & mask


@njit(cache=True, _nrt=False, error_model="numpy")
def _table_del(table, i, h):
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while True:
        k = table[i, j, 0]
        if k == 0:
            return
        if k == h:
            break
        j = (j + 1) & mask
    # backward-shift deletion keeps probe chains intact without tombstones
    hole = j
    j = (j + 1) & mask
    while table[i, j, 0] != 0:
        home = np.int64(table[i, j, 0] & np.uint64(mask))
        if (hole - home) & mask < (j - home) & mask:
            table[i, hole, 0] = table[i, j, 0]
            table[i, hole, 1] = table[i, j, 1]
            hole = j
        j = (j + 1) & mask
    table[i, hole, 0] = 0


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _log_change(kv, i, h, v):
    """Record a change of the prefix table for the router's delayed copy (DELTA-33)."""
    if kv.cfg[CFG_LOG] == 0 or kv.meta[i, M_LOG_OVERFLOW] == 1:
        return
    k = kv.meta[i, M_LOG_LEN]
    if k >= kv.ht_log.shape[1]:
        kv.meta[i, M_LOG_OVERFLOW] = 1
        return
    kv.ht_log[i, k, 0] = h
    kv.ht_log[i, k, 1] = v
    kv.meta[i, M_LOG_LEN] = k + 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _ht_put(kv, i, h, b):
    _table_put(kv.ht, i, h, np.uint64(b))
    _log_change(kv, i, h, np.uint64(b))


@njit(cache=True, _nrt=False, error_model="numpy")
def _ht_del(kv, i, h):
    _table_del(kv.ht, i, h)
    _log_change(kv, i, h, LOG_DELETE)


@njit(cache=True, _nrt=False, error_model="numpy")
def sync_frozen_copy(kv, i, frozen):
    """Bring ``frozen`` (a copy of instance ``i``'s prefix table) up to date: replay the logged
    changes, or copy the whole table when the log overflowed; then clear the log."""
    if kv.meta[i, M_LOG_OVERFLOW] == 1:
        for j in range(kv.ht.shape[1]):
            frozen[i, j, 0] = kv.ht[i, j, 0]
            frozen[i, j, 1] = kv.ht[i, j, 1]
    else:
        for k in range(kv.meta[i, M_LOG_LEN]):
            h = kv.ht_log[i, k, 0]
            v = kv.ht_log[i, k, 1]
            if v == LOG_DELETE:
                _table_del(frozen, i, h)
            else:
                _table_put(frozen, i, h, np.uint64(v))
    kv.meta[i, M_LOG_LEN] = 0
    kv.meta[i, M_LOG_OVERFLOW] = 0


# ---------------------------------------------------------------- GPU free list


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _free_live(kv, i, b, pos):
    """True when the ring entry at ``pos`` holding block ``b`` is the block's current entry."""
    return kv.blk[i, b, B_FREE] == 1 and kv.blk[i, b, B_POS] == (pos & POS_MASK)


@njit(cache=True, _nrt=False, error_model="numpy")
def _free_compact(kv, i):
    """Squeeze the stale entries out of instance ``i``'s ring, keeping the order."""
    ring = kv.free_ring
    mask = ring.shape[1] - 1
    w = kv.meta[i, M_HEAD]
    for p in range(kv.meta[i, M_HEAD], kv.meta[i, M_TAIL]):
        b = ring[i, p & mask]
        if _free_live(kv, i, b, p):
            ring[i, w & mask] = b
            kv.free_slot[i, w & mask] = kv.free_slot[i, p & mask]
            kv.blk[i, b, B_POS] = np.int32(w & POS_MASK)
            w += 1
    kv.meta[i, M_TAIL] = w


@njit(cache=True, _nrt=False, error_model="numpy")
def _free_append(kv, i, b):
    """Put block ``b`` at the tail (most recently freed end) of the free list."""
    meta = kv.meta
    mask = kv.free_ring.shape[1] - 1
    if meta[i, M_TAIL] - meta[i, M_HEAD] > mask:
        _free_compact(kv, i)  # live entries (free blocks) fill at most half of the ring
    t = meta[i, M_TAIL]
    kv.free_ring[i, t & mask] = b
    h = _get_hash(kv, i, b)
    kv.free_slot[i, t & mask] = np.int32(h & np.uint64(kv.ht.shape[1] - 1)) if h != 0 else -1
    meta[i, M_TAIL] = t + 1
    meta[i, M_FREE] += 1
    kv.blk[i, b, B_POS] = np.int32(t & POS_MASK)
    kv.blk[i, b, B_FREE] = 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _free_remove(kv, i, b):
    """Take free block ``b`` off the list wherever it is (its ring entry goes stale)."""
    kv.meta[i, M_FREE] -= 1
    kv.blk[i, b, B_FREE] = 0


@njit(cache=True, _nrt=False, error_model="numpy")
def _pop_free(kv, i):
    """Take the LRU head of the free list and drop its hash mapping (ENG-5.4, DELTA-14)."""
    meta = kv.meta
    if meta[i, M_FREE] == 0:
        return np.int64(-1)
    ring = kv.free_ring
    mask = ring.shape[1] - 1
    pos = meta[i, M_HEAD]
    b = np.int64(ring[i, pos & mask])
    while not _free_live(kv, i, b, pos):
        pos += 1
        b = np.int64(ring[i, pos & mask])
    meta[i, M_HEAD] = pos + 1
    _free_remove(kv, i, b)
    kv.blk[i, b, B_TOK] = 0
    h = _get_hash(kv, i, b)
    if h != 0:
        _ht_del(kv, i, h)
        _set_hash(kv, i, b, 0)
    # free blocks are cold: ask for the records and the hash-table slots (deleted when
    # popped) of the blocks a few pops ahead (a stale entry just makes a useless hint)
    tail = meta[i, M_TAIL]
    if pos + 1 + LOOK_HASH < tail:
        slot = kv.free_slot[i, (pos + 1 + LOOK_HASH) & mask]
        if slot >= 0:
            prefetch(kv.ht, (i, slot))
    if pos + 1 + LOOK_RECORD < tail:
        prefetch(kv.blk, (i, ring[i, (pos + 1 + LOOK_RECORD) & mask]))
    return b


@njit(cache=True, _nrt=False, error_model="numpy")
def free_blocks(kv, i):
    """Number of blocks on instance ``i``'s free list."""
    return kv.meta[i, M_FREE]


@njit(cache=True, _nrt=False, error_model="numpy")
def used_blocks(kv, i):
    """Blocks in use on instance ``i`` (total minus free)."""
    return kv.cfg[CFG_BLOCKS] - kv.meta[i, M_FREE]


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _has_room(kv, r):
    """True while request ``r``'s block list fits in its slice of ``pool``."""
    end = kv.req[r + 1, R_OFF] if r + 1 < kv.req.shape[0] else kv.pool.shape[0]
    return kv.req[r, R_OFF] + kv.req[r, R_CNT] < end


@njit(cache=True, _nrt=False, error_model="numpy")
def list_overflowed(kv):
    """True when some request's block list outgrew its slice (the run is then invalid)."""
    for i in range(kv.meta.shape[0]):
        if kv.meta[i, M_LIST_OVERFLOW] != 0:
            return True
    return False


# ---------------------------------------------------------------- queries


@njit(cache=True, _nrt=False, error_model="numpy")
def cached_blocks(kv, i, r, input_len, out):
    """Leading full input blocks of request ``r`` present in instance ``i``'s cache (ENG-5.3).

    Writes block ids to ``out`` and returns how many were found. Pure query.
    """
    bs = kv.cfg[CFG_BS]
    n = input_len // bs
    base = kv.chunk_off[r]
    prev = np.uint64(0)
    count = 0
    for k in range(n):
        h = chain_hash(prev, kv.chunk_dig[base + k])
        b = _table_get(kv.ht, i, h)
        if b < 0:
            break
        out[count] = b
        count += 1
        prev = h
    return count


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
    bs = kv.cfg[CFG_BS]
    h = splitmix64(np.uint64(length) * _RUN_SALT ^ np.uint64(pos % bs))
    for c in range(pos // bs, (pos + length - 1) // bs + 1):
        h = splitmix64(h ^ _chunk_digest(kv, r, c))
    return h


@njit(cache=True, _nrt=False, error_model="numpy")
def _block_digest(kv, r, pos):
    """Content digest of a full block written in one run from sequence position ``pos``."""
    bs = kv.cfg[CFG_BS]
    if pos % bs == 0:
        return kv.chunk_dig[kv.chunk_off[r] + pos // bs]
    return _run_digest(kv, r, pos, bs)


@njit(cache=True, _nrt=False, error_model="numpy")
def _last_block_digest(kv, r):
    """Content digest of request ``r``'s last block, now full (R_LAST == block size)."""
    run0 = kv.req[r, R_RUN0]
    if run0 == 0:
        return _block_digest(kv, r, kv.req[r, R_SEG])
    run = _run_digest(kv, r, kv.req[r, R_SEG], kv.cfg[CFG_BS] - run0)
    return splitmix64(np.uint64(kv.req[r, R_MIX]) ^ run)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _next_pos(kv, r):
    """Sequence position that continues the run the last block of request ``r`` ends with."""
    return kv.req[r, R_SEG] + kv.req[r, R_LAST] - kv.req[r, R_RUN0]


@njit(cache=True, _nrt=False, error_model="numpy")
def _start_run(kv, r, pos):
    """Tokens from ``pos`` go on in the partly filled last block, which ends elsewhere: close
    its current run (fold it into R_MIX) and start a new one."""
    mix = np.uint64(0)
    if kv.req[r, R_RUN0] > 0:
        mix = np.uint64(kv.req[r, R_MIX])
    run = _run_digest(kv, r, kv.req[r, R_SEG], kv.req[r, R_LAST] - kv.req[r, R_RUN0])
    kv.req[r, R_MIX] = np.int64(splitmix64(mix ^ run) >> np.uint64(1))
    kv.req[r, R_RUN0] = kv.req[r, R_LAST]
    kv.req[r, R_SEG] = pos


@njit(cache=True, _nrt=False, error_model="numpy")
def _commit(kv, i, r, blocks, lo, hi):
    """Append cached blocks ``blocks[lo:hi]`` (block ``k`` holds chunk ``k``) to the list."""
    off = kv.req[r, R_OFF]
    bs = kv.cfg[CFG_BS]
    for k in range(lo, hi):
        b = blocks[k]
        kv.blk[i, b, B_REF] += 1
        if kv.blk[i, b, B_FREE] == 1:
            _free_remove(kv, i, b)
        kv.meta[i, M_HITS] += 1
        if not _has_room(kv, r):
            kv.meta[i, M_LIST_OVERFLOW] = 1
            return
        kv.pool[off + kv.req[r, R_CNT]] = b
        kv.req[r, R_CNT] += 1
        kv.req[r, R_LAST] = kv.blk[i, b, B_TOK]
        kv.req[r, R_SEG] = k * bs
        kv.req[r, R_RUN0] = 0


@njit(cache=True, _nrt=False, error_model="numpy")
def _gpu_allocate(kv, i, r, start, end, in_prefill, cached, n_cached):
    """GPU-tier AllocateKVBlocks with the check-then-act pre-check (DELTA-13).

    Writes the tokens at sequence positions ``[start, end)`` after the end of the block list,
    wherever that list ends (see the module docstring)."""
    bs = kv.cfg[CFG_BS]
    off = kv.req[r, R_OFF]
    ntok = end - start
    free = kv.meta[i, M_FREE]
    _sync_last(kv, i, r)
    if in_prefill:
        eff = ntok
        cnt = kv.req[r, R_CNT]
        if cnt > 0:
            last = kv.pool[off + cnt - 1]
            spare = bs - kv.blk[i, last, B_TOK]
            if spare > 0 and spare < bs:
                eff -= min(spare, eff)
        need = np.int64(0)
        if eff > 0:
            need = (eff + bs - 1) // bs
        from_free = np.int64(0)
        for k in range(n_cached):
            if kv.blk[i, cached[k], B_FREE] == 1:
                from_free += 1
        if need + from_free > free:
            return False
    elif free == 0 and (kv.req[r, R_CNT] == 0 or kv.req[r, R_LAST] == bs):
        return False

    remaining = ntok
    pos = start  # sequence position of the next token written
    while remaining > 0:
        cnt = kv.req[r, R_CNT]
        latest = np.int64(-1)
        if cnt > 0:
            latest = kv.pool[off + cnt - 1]
        elif n_cached > 0:
            _commit(kv, i, r, cached, np.int64(0), n_cached)
            cnt = kv.req[r, R_CNT]
            latest = kv.pool[off + cnt - 1]
        # R_LAST equals the latest block's B_TOK here (synced above, kept in step below)
        if latest >= 0 and kv.req[r, R_LAST] > 0 and kv.req[r, R_LAST] < bs:
            take = min(bs - kv.blk[i, latest, B_TOK], remaining)
            if pos != _next_pos(kv, r):
                _start_run(kv, r, pos)
            kv.blk[i, latest, B_TOK] += take
            kv.req[r, R_LAST] = kv.blk[i, latest, B_TOK]
            remaining -= take
            pos += take
            if kv.blk[i, latest, B_TOK] == bs and (in_prefill or kv.cfg[CFG_HASH_DECODE] == 1):
                prev = np.uint64(0)
                if cnt >= 2:
                    prev = _get_hash(kv, i, kv.pool[off + cnt - 2])
                h = chain_hash(prev, _last_block_digest(kv, r))
                _set_hash(kv, i, latest, h)
                _ht_put(kv, i, h, latest)
        else:
            n_new = (remaining + bs - 1) // bs
            prev = np.uint64(0)
            if in_prefill and kv.req[r, R_CNT] > 0:  # only prefill blocks are hashed here
                prev = _get_hash(kv, i, kv.pool[off + kv.req[r, R_CNT] - 1])
            # the full blocks of a prefill are hashed into the table: ask for their slots
            # LOOK_HASH blocks ahead (the chain is recomputed there, it is cheap; only for
            # block-aligned tokens, the usual case)
            n_hashed = remaining // bs if in_prefill and pos % bs == 0 else 0
            dig0 = kv.chunk_off[r] + pos // bs
            ahead = prev
            k_ahead = 0
            ht_mask = np.uint64(kv.ht.shape[1] - 1)
            for k in range(n_new):
                while k_ahead < n_hashed and k_ahead <= k + LOOK_HASH:
                    ahead = chain_hash(ahead, kv.chunk_dig[dig0 + k_ahead])
                    prefetch(kv.ht, (i, np.int64(ahead & ht_mask)))
                    k_ahead += 1
                take = min(bs, remaining)
                h = prev
                if take == bs and in_prefill:
                    h = chain_hash(prev, _block_digest(kv, r, pos))
                b = _pop_free(kv, i)
                kv.blk[i, b, B_TOK] = take
                kv.blk[i, b, B_REF] = 1
                kv.meta[i, M_MISSES] += 1
                if take == bs and in_prefill:
                    _set_hash(kv, i, b, h)
                    _ht_put(kv, i, h, b)
                    prev = h
                if not _has_room(kv, r):
                    kv.meta[i, M_LIST_OVERFLOW] = 1
                    return False
                kv.pool[off + kv.req[r, R_CNT]] = b
                kv.req[r, R_CNT] += 1
                kv.req[r, R_LAST] = take
                kv.req[r, R_SEG] = pos
                kv.req[r, R_RUN0] = 0
                remaining -= take
                pos += take
    return True


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def append_decode_token_fast(kv, i, r, pos):
    """Decode allocation of the token at sequence position ``pos`` when the request's last
    block has room for it, continues its run there, and filling it needs no hash: only the
    block's token count changes, exactly as the general path would.

    Returns False when the general :func:`allocate` is needed (new block or block hashing).
    Inlined so the hot decode path does not copy the cache state into a call.
    """
    if kv.req[r, R_CNT] == 0:
        return False
    tok = kv.req[r, R_LAST]
    bs = kv.cfg[CFG_BS]
    if tok >= bs or (tok == bs - 1 and kv.cfg[CFG_HASH_DECODE] == 1):
        return False
    if kv.req[r, R_SEG] + tok - kv.req[r, R_RUN0] != pos:
        return False
    kv.req[r, R_LAST] = tok + 1
    # the token after the block fills allocates, reading the list end and updating the last
    # block's record: ask for the list end two tokens before, for the record one before
    if tok + 2 == bs:
        prefetch(kv.pool, kv.req[r, R_OFF] + kv.req[r, R_CNT] - 1)
    elif tok + 1 == bs:
        prefetch(kv.blk, (i, kv.pool[kv.req[r, R_OFF] + kv.req[r, R_CNT] - 1]))
    return True


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _sync_last(kv, i, r):
    """Bring the last block's B_TOK up to the request's authoritative R_LAST count."""
    cnt = kv.req[r, R_CNT]
    if cnt > 0:
        kv.blk[i, kv.pool[kv.req[r, R_OFF] + cnt - 1], B_TOK] = kv.req[r, R_LAST]


@njit(cache=True, _nrt=False, error_model="numpy")
def release(kv, i, r):
    """Release every block of request ``r``, last to first, onto the free-list tail (ENG-5.5)."""
    cnt = kv.req[r, R_CNT]
    off = kv.req[r, R_OFF]
    for k in range(cnt - 1, -1, -1):
        if k >= LOOK_RECORD:
            prefetch(kv.blk, (i, kv.pool[off + k - LOOK_RECORD]))
        b = kv.pool[off + k]
        kv.blk[i, b, B_REF] -= 1
        if kv.blk[i, b, B_REF] == 0:
            _free_append(kv, i, b)
    kv.req[r, R_CNT] = 0
    kv.req[r, R_LAST] = 0
    kv.req[r, R_RUN0] = 0


# ---------------------------------------------------------------- CPU tier


@njit(cache=True, _nrt=False, error_model="numpy")
def _cpu_unlink(kv, i, s):
    cm = kv.cpu_meta
    p = kv.cpu_prv[i, s]
    n = kv.cpu_nxt[i, s]
    if p >= 0:
        kv.cpu_nxt[i, p] = n
    else:
        cm[i, C_HEAD] = n
    if n >= 0:
        kv.cpu_prv[i, n] = p
    else:
        cm[i, C_TAIL] = p
    kv.cpu_prv[i, s] = -1
    kv.cpu_nxt[i, s] = -1


@njit(cache=True, _nrt=False, error_model="numpy")
def _cpu_append(kv, i, s):
    cm = kv.cpu_meta
    tail = cm[i, C_TAIL]
    kv.cpu_nxt[i, s] = -1
    kv.cpu_prv[i, s] = tail
    if tail >= 0:
        kv.cpu_nxt[i, tail] = s
    else:
        cm[i, C_HEAD] = s
    cm[i, C_TAIL] = s


@njit(cache=True, _nrt=False, error_model="numpy")
def _cpu_store(kv, i, h):
    cm = kv.cpu_meta
    if cm[i, C_USED] >= kv.cfg[CFG_CPU_CAP]:
        victim = cm[i, C_HEAD]
        if victim >= 0:
            _cpu_unlink(kv, i, victim)
            _table_del(kv.cpu_ht, i, kv.cpu_hash[i, victim])
            cm[i, C_USED] -= 1
            cm[i, C_EVICT] += 1
            kv.cpu_free[i, cm[i, C_FREETOP]] = victim
            cm[i, C_FREETOP] += 1
    cm[i, C_FREETOP] -= 1
    s = kv.cpu_free[i, cm[i, C_FREETOP]]
    kv.cpu_hash[i, s] = h
    _table_put(kv.cpu_ht, i, h, np.uint64(s))
    _cpu_append(kv, i, s)
    cm[i, C_USED] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def mirror_to_cpu(kv, i, batch_reqs, n):
    """Copy every full, hashed block of the batch's requests to the CPU tier (ENG-5.9)."""
    if kv.cfg[CFG_TIERED] == 0:
        return
    bs = kv.cfg[CFG_BS]
    for q in range(n):
        r = batch_reqs[q]
        off = kv.req[r, R_OFF]
        _sync_last(kv, i, r)
        for k in range(kv.req[r, R_CNT]):
            b = kv.pool[off + k]
            h = _get_hash(kv, i, b)
            if h == 0 or kv.blk[i, b, B_TOK] < bs:
                continue
            s = _table_get(kv.cpu_ht, i, h)
            if s >= 0:
                _cpu_unlink(kv, i, s)
                _cpu_append(kv, i, s)
            else:
                _cpu_store(kv, i, h)
                kv.cpu_meta[i, C_MIRROR] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _reload_prefix(kv, i, r, input_len):
    bs = kv.cfg[CFG_BS]
    n = input_len // bs
    max_reloads = kv.meta[i, M_FREE]
    base = kv.chunk_off[r]
    prev = np.uint64(0)
    reloaded = False
    count = 0
    for k in range(n):
        h = chain_hash(prev, kv.chunk_dig[base + k])
        if _table_get(kv.ht, i, h) >= 0:
            prev = h
            continue
        s = _table_get(kv.cpu_ht, i, h)
        if s < 0:
            break
        if count >= max_reloads:
            break
        b = _pop_free(kv, i)
        if b < 0:
            break
        kv.blk[i, b, B_TOK] = bs
        _set_hash(kv, i, b, h)
        kv.blk[i, b, B_REF] = 0
        _ht_put(kv, i, h, b)
        _free_append(kv, i, b)
        kv.cpu_meta[i, C_PENDING] += kv.cfg[CFG_RELOAD_TICKS]
        _cpu_unlink(kv, i, s)
        _cpu_append(kv, i, s)
        kv.cpu_meta[i, C_HIT] += 1
        reloaded = True
        count += 1
        prev = h
    return reloaded


@njit(cache=True, _nrt=False, error_model="numpy")
def allocate(kv, i, r, start, end, in_prefill, input_len, cached, n_cached, scratch):
    """AllocateKVBlocks for either store (single tier, or GPU+CPU with reload, ENG-5.10)."""
    if _gpu_allocate(kv, i, r, start, end, in_prefill, cached, n_cached):
        return True
    if kv.cfg[CFG_TIERED] == 0:
        return False
    if _reload_prefix(kv, i, r, input_len):
        bs = kv.cfg[CFG_BS]
        n_new = cached_blocks(kv, i, r, input_len, scratch)
        new_start = n_new * bs
        if new_start > start:
            has_entry = kv.req[r, R_CNT] > 0
            if new_start >= end:
                end_block = min((end + bs - 1) // bs, n_new)
                if has_entry:
                    start_block = (start + bs - 1) // bs
                    if start_block < end_block:
                        _commit(kv, i, r, scratch, start_block, end_block)
                else:
                    _commit(kv, i, r, scratch, np.int64(0), end_block)
                return True
            new_start_block = new_start // bs
            if has_entry:
                start_block = (start + bs - 1) // bs
                if start_block < new_start_block:
                    _commit(kv, i, r, scratch, start_block, new_start_block)
            else:
                _commit(kv, i, r, scratch, np.int64(0), new_start_block)
            return _gpu_allocate(kv, i, r, new_start, end, in_prefill, scratch, n_new)
        return _gpu_allocate(kv, i, r, start, end, in_prefill, cached, n_cached)
    kv.cpu_meta[i, C_MISS] += 1
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def consume_pending_transfer(kv, i):
    """Pending CPU->GPU transfer latency to add to the next step, then cleared (ENG-5.10.5)."""
    lat = kv.cpu_meta[i, C_PENDING]
    kv.cpu_meta[i, C_PENDING] = 0
    return lat


@njit(cache=True, _nrt=False, error_model="numpy")
def hit_rate(kv, i):
    """Cumulative hit rate (tiered: CPU misses count as misses too, ENG-5.11)."""
    hits = kv.meta[i, M_HITS]
    total = hits + kv.meta[i, M_MISSES] + kv.cpu_meta[i, C_MISS]
    if total == 0:
        return 0.0
    return hits / total


@njit(cache=True, _nrt=False, error_model="numpy")
def thrashing_rate(kv, i):
    """CPU evictions per mirrored block (0 single-tier or without mirrors)."""
    mirrors = kv.cpu_meta[i, C_MIRROR]
    if mirrors == 0:
        return 0.0
    return kv.cpu_meta[i, C_EVICT] / mirrors
