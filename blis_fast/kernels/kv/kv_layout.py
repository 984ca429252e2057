"""The KV cache's state: one :class:`KVState` of arrays for every instance's cache, the slot
families that index it, and its constructor (ENG-5).

All instances' caches live in arrays indexed ``[instance, ...]``: one 32-byte record per block
(``blk[i, b, BlockField.*]``), per-instance counters (``meta[i, KVMeta.*]``,
``cpu_meta[i, CpuMeta.*]``), the prefix hash table (``kernels/kv/hashtable.py``), the free list as a
ring, per request a record (``req[r, BlockList.*]``) and the block lists in ``pool``; the CPU tier's
LRU store has its own table. ``cfg[KVConfig.*]`` holds the configuration.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class KVState(NamedTuple):
    """Every instance's KV cache (allocated by :func:`new_kv_state`)."""

    # per block, int32 [n_instances, n_blocks, 8]: one 32-byte record per block (a block is
    # touched as a whole, so its fields share a cache line), columns BlockField
    blk: np.ndarray
    # per instance, int64 [n_instances, len(KVMeta)]: KVMeta
    meta: np.ndarray
    # changes to each instance's prefix hash table since the router last froze a copy of it
    # ([n_instances, log_size, 2]: key, block or LOG_DELETE); only with a cache-signal delay
    ht_log: np.ndarray
    # prefix hash table per instance (kernels/kv/hashtable.py): uint64 [n_instances, size, 2]
    ht: np.ndarray
    # per request, int64 [n_requests, BlockList.SIZE]: where its block list is and what its last
    # block holds (BlockList); LAST is authoritative: the decode fast path bumps only it, and
    # the last block's BlockField.TOKENS is brought up to date before any other use
    req: np.ndarray
    pool: np.ndarray  # int64 block ids, each request's list in its slice
    chunk_off: np.ndarray  # the requests' content digests (RequestTable, CSR)
    chunk_dig: np.ndarray
    # CPU tier (tiered mode only; 1-slot arrays otherwise)
    cpu_ht: np.ndarray  # uint64 [n_instances, cpu_table_size, 2] hash -> slot table
    cpu_hash: np.ndarray  # uint64 [n_instances, cpu_blocks]
    cpu_prv: np.ndarray  # int32 LRU links
    cpu_nxt: np.ndarray
    cpu_free: np.ndarray  # int32 free-slot stack
    # int32 [n_instances, cpu_blocks]: the tier chain's reference state of a slot (KVO-4.2):
    # -1 promotion in flight, 0 ready (on the LRU list), n > 0 pinned by n writes (off it)
    cpu_ref: np.ndarray
    cpu_meta: np.ndarray  # int64 [n_instances, CPU_META_COLS]: CpuMeta
    cfg: np.ndarray  # int64 KVConfig
    # the free list in LRU order, per instance a ring (int32 [n_instances, 2^k]) of block ids
    # between positions KVMeta.HEAD and KVMeta.TAIL; an entry is live iff its block is free and
    # its BlockField.POS is that position (a block taken off the list mid-way just leaves a stale
    # entry). Popping walks an array, so the next blocks' records can be prefetched.
    free_ring: np.ndarray
    # beside each ring entry, the home slot in ``ht`` of the block's hash when it was freed
    # (-1 = no hash): the slot a pop will probe, prefetched a few pops ahead
    free_slot: np.ndarray


class BlockFieldT(NamedTuple):
    """Fields of a block record ``blk[i, b]`` (field 7 is unused)."""

    REF: int = 0  # reference count
    TOKENS: int = 1  # tokens held
    POS: int = 2  # position of its free-list entry, modulo 2^31 (POS_MASK)
    CPU_SLOT: int = 3  # the CPU tier slot its hash was last mirrored to (a hint: cpu_offer)
    FREE: int = 4  # 1 when on the free list (the reference's !InUse)
    HASH_LO: int = 5  # the 64-bit block hash, low and high halves (0 = none)
    HASH_HI: int = 6


BlockField = BlockFieldT()


class KVMetaT(NamedTuple):
    """Columns of ``meta[i]``."""

    HEAD: int = 0  # free-ring head and tail positions
    TAIL: int = 1
    FREE: int = 2  # blocks on the free list
    HITS: int = 3
    MISSES: int = 4
    LOG_LEN: int = 5  # change-log length and overflow flag
    LOG_OVERFLOW: int = 6
    LIST_OVERFLOW: int = 7  # a request's block list outgrew its slice
    TOTAL: int = 8  # the instance's GPU blocks (its capacity; <= KVConfig.BLOCKS)


KVMeta = KVMetaT()


class CpuMetaT(NamedTuple):
    """Columns of ``cpu_meta[i]``."""

    HEAD: int = 0  # LRU head and tail slots
    TAIL: int = 1
    USED: int = 2
    FREE_TOP: int = 3  # top of the free-slot stack
    EVICTIONS: int = 4
    MIRRORS: int = 5
    HITS: int = 6
    MISSES: int = 7
    PENDING: int = 8  # transfer latency the next step pays
    EVICTABLE: int = 9  # slots on the LRU list (reference state 0)
    MIRROR_SKIPPED: int = 10  # mirrors refused: tier full, nothing evictable (KVO-4.3)
    PROMO_FIRED: int = 11  # promotion runs granted / refused by the evictable gate (KVO-4.6)
    PROMO_FAILED: int = 12
    PROMO_BLOCKS: int = 13  # blocks the granted promotions reserved (each lands once or is pending)


CpuMeta = CpuMetaT()
CPU_META_COLS = 16
"""Width of ``cpu_meta`` (room beyond CpuMeta's columns)."""


class BlockListT(NamedTuple):
    """Columns of ``req[r]``: a request's block list and where its last block's tokens come
    from in the request's sequence (see ``kernels/kv/kv_blocks.py``)."""

    OFFSET: int = 0  # offset of its block list in ``pool``
    COUNT: int = 1  # blocks held (0 = no RequestMap entry)
    SEGMENT: int = 2  # sequence position of the last block's current run's first token
    LAST: int = 3  # tokens in its last block
    RUN0: int = 4  # tokens written before that run (0 when one run fills the block)
    MIX: int = 5  # digest of the earlier runs
    CPU_RELOADS: int = 6  # blocks the CPU tier reloaded for it, over its life (its HITS share)
    SIZE: int = 8  # row width (64 bytes)


BlockList = BlockListT()


class KVConfigT(NamedTuple):
    """Slots of ``cfg``."""

    BLOCK_SIZE: int = 0
    BLOCKS: int = 1  # GPU block records per instance: the largest instance's KVMeta.TOTAL
    TIERED: int = 2
    CPU_CAPACITY: int = 3
    RELOAD_TICKS: int = 4  # ticks per reloaded block (base latency + transfer)
    HASH_DECODE: int = 5  # register blocks filled by output tokens
    LOG_CHANGES: int = 6  # log prefix-table changes for the router's delayed copy
    RELOAD_FIRST: int = 7  # tiered: consult the CPU tier before every GPU allocation (KVO-9.1)
    # tier chain (--kv-offload-config): mirror only the blocks inside the prompt (KVO-8.1)
    PROMPT_ONLY: int = 8


KVConfig = KVConfigT()

POS_MASK = (1 << 31) - 1  # BlockField.POS holds a position modulo 2^31 (a ring spans far fewer)
LOOK_RECORD, LOOK_HASH = 16, 8  # blocks ahead whose record / hash slot a loop prefetches
LOG_DELETE = np.uint64(0xFFFFFFFFFFFFFFFF)  # value recorded for a deleted key


def _empty_instance(blk, free_ring, meta, i: int, blocks: int) -> None:
    """Instance ``i``'s cache empty with ``blocks`` blocks, all on the free list in id order."""
    ids = np.arange(blocks, dtype=np.int32)
    blk[i, :, :] = 0
    blk[i, :blocks, BlockField.POS] = ids
    blk[i, :blocks, BlockField.FREE] = 1
    free_ring[i, :blocks] = ids
    meta[i, :] = 0
    meta[i, KVMeta.TAIL] = blocks
    meta[i, KVMeta.FREE] = blocks
    meta[i, KVMeta.TOTAL] = blocks


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
    total_blocks: int | np.ndarray,
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
    reload_first: bool = False,
    prompt_only_mirror: bool = False,
) -> KVState:
    """Allocate an empty cache for every instance, sized from the workload.

    ``total_blocks`` is every instance's GPU block count, or one count per instance (pools of
    different GPUs or TP, or an instance added later: ``kvcache.reset_instance_blocks``); the block
    records are sized for the largest.

    Blocks completed by output tokens join the hash chain in the reference, for every
    request (ENG-5.4). Their hashes can only ever be looked up when a later request's input
    contains an earlier request's output (accumulating multi-turn sessions, open or closed
    loop) or when the CPU tier mirrors them, so they are registered only then
    (``hash_decode_blocks``, or tiered mode); otherwise skipping them changes no output and
    halves the hash-table traffic.

    Closed-loop runs add requests while the simulation runs: ``pool_extra`` block-list slots
    are reserved beyond the listed requests' slices and the hash tables are sized for
    ``chunk_capacity`` chunk digests in all (default: those of ``chunk_offsets``).

    ``reload_first`` selects the August reference's CPU-tier rule (KVO-9.1, #1586: the tier is
    consulted before every GPU allocation) over April's (only after a failed one); it matters
    only with a CPU tier.

    ``prompt_only_mirror`` clamps each step's mirroring to the blocks inside the request's
    prompt (the tier chain's ``offload_prompt_only``, KVO-8.1); April's tier mirrors every
    full hashed block.
    """
    per_instance = np.broadcast_to(np.asarray(total_blocks, dtype=np.int64), (n_instances,))
    total_blocks = int(per_instance.max(initial=0))
    total_chunks = int(chunk_offsets[-1]) if len(chunk_offsets) else 0
    if chunk_capacity is not None:
        total_chunks = max(total_chunks, int(chunk_capacity))
    table_size = _pow2_at_least(2 * max(1, min(total_blocks, total_chunks + 1)))
    req, pool = _block_lists(input_len, output_len, block_size, cpu_blocks > 0, pool_extra)
    blk, free_ring, meta = _gpu_blocks(n_instances, per_instance, total_blocks)
    tiered = cpu_blocks > 0
    cpu_cap = cpu_blocks if tiered else 1
    cpu_table = _pow2_at_least(2 * max(1, min(cpu_cap, total_chunks + 1)))
    cpu_meta, cpu_free = _cpu_lru(n_instances, cpu_cap)
    cfg = np.array([block_size, total_blocks, 1 if tiered else 0, cpu_cap, reload_ticks,
                    1 if (tiered or hash_decode_blocks) else 0, 1 if log_changes else 0,
                    1 if (tiered and reload_first) else 0,
                    1 if (tiered and prompt_only_mirror) else 0],
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
        cpu_ref=np.zeros((n_instances, cpu_cap), dtype=np.int32),
        cpu_meta=cpu_meta,
        cfg=cfg,
        free_ring=free_ring,
        free_slot=np.full(free_ring.shape, -1, dtype=np.int32),
    )


def _pow2_at_least(n: int) -> int:
    """The smallest power of two >= ``n`` and >= 16 (hash-table and ring sizes)."""
    size = 16
    while size < n:
        size *= 2
    return size


def _block_lists(input_len: np.ndarray, output_len: np.ndarray, block_size: int, tiered: bool,
                 pool_extra: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request's block-list slice (``req``) in one shared ``pool``, plus ``pool_extra``
    slots for requests added while the simulation runs."""
    n_req = len(input_len)
    per_req = pool_slots(input_len, output_len, block_size, tiered)
    req = np.zeros((n_req, BlockList.SIZE), dtype=np.int64)
    if n_req:
        req[1:, BlockList.OFFSET] = np.cumsum(per_req)[:-1]
    pool = np.zeros(int(per_req.sum()) + int(pool_extra) + 1, dtype=np.int64)
    return req, pool


def _gpu_blocks(n_instances: int, per_instance: np.ndarray,
                total_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every instance's GPU block records, free ring and metadata, all blocks free."""
    blk = np.zeros((n_instances, total_blocks, 8), dtype=np.int32)
    free_ring = np.zeros((n_instances, _pow2_at_least(2 * total_blocks)), dtype=np.int32)
    meta = np.zeros((n_instances, len(KVMeta)), dtype=np.int64)
    for i in range(n_instances):
        _empty_instance(blk, free_ring, meta, i, int(per_instance[i]))
    return blk, free_ring, meta


def _cpu_lru(n_instances: int, cpu_cap: int) -> tuple[np.ndarray, np.ndarray]:
    """The CPU tier's metadata (empty LRU list) and free-slot stack per instance."""
    cpu_meta = np.zeros((n_instances, CPU_META_COLS), dtype=np.int64)
    cpu_meta[:, CpuMeta.HEAD] = -1
    cpu_meta[:, CpuMeta.TAIL] = -1
    cpu_meta[:, CpuMeta.FREE_TOP] = cpu_cap
    cpu_free = np.empty((n_instances, cpu_cap), dtype=np.int32)
    cpu_free[:] = np.arange(cpu_cap - 1, -1, -1, dtype=np.int32)
    return cpu_meta, cpu_free
