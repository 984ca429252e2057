"""Block KV cache with prefix caching, LRU free list and optional CPU tier (ENG-5, DELTA-13/14):
the operations the engine calls.

The state and its slot families are in ``kernels/kv/kv_layout.py`` (re-exported here), the block
hashes, free list and block contents in ``kernels/kv/kv_blocks.py``, the CPU tier in
``kernels/kv/kv_cpu.py``, the prefix tables in ``kernels/kv/hashtable.py``.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.hashing import chain_hash
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv.hashtable import leading_matches
from blis_fast.kernels.kv.kv_blocks import (
    block_digest,
    commit_cached,
    free_append,
    get_block_hash,
    has_room,
    ht_put,
    last_block_digest,
    next_pos,
    pop_free,
    set_block_hash,
    start_run,
    sync_frozen_copy,
    sync_last,
)
from blis_fast.kernels.kv.kv_chain import (
    GATE_DEFER,
    GATE_TRACKED,
    chain_forget,
    chain_gate,
    chain_poll,
    chain_quiet,
    is_deferred,
    mirror_to_cpu,
    poll_deferred,
    queue_at,
    reload_prefix,
)
from blis_fast.kernels.kv.kv_layout import (
    LOOK_HASH,
    LOOK_RECORD,
    POS_MASK,
    BlockField,
    BlockList,
    CpuMeta,
    KVConfig,
    KVMeta,
    KVState,
    new_kv_state,
    pool_slots,
)
from blis_fast.kernels.prefetch import prefetch

__all__ = [
    "POS_MASK", "BlockField", "BlockList", "CpuMeta", "KVConfig", "KVMeta", "KVState", "allocate",
    "append_decode_token_fast", "cached_blocks", "chain_poll", "chain_quiet",
    "consume_pending_transfer",
    "free_blocks", "is_deferred", "poll_deferred", "queue_at",
    "hit_rate", "list_overflowed", "mirror_to_cpu", "new_kv_state", "pool_slots", "release",
    "reset_instance_blocks", "sync_frozen_copy", "thrashing_rate", "used_blocks",
]


@njit(cache=True, _nrt=False, error_model="numpy")
def _gpu_allocate(kv, i, r, start, end, in_prefill, cached, n_cached):
    """GPU-tier AllocateKVBlocks with the check-then-act pre-check (DELTA-13).

    Writes the tokens at sequence positions ``[start, end)`` after the end of the block list,
    wherever that list ends (see the module docstring)."""
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    off = kv.req[r, BlockList.OFFSET]
    ntok = end - start
    free = kv.meta[i, KVMeta.FREE]
    sync_last(kv, i, r)
    if in_prefill:
        eff = ntok
        cnt = kv.req[r, BlockList.COUNT]
        if cnt > 0:
            last = kv.pool[off + cnt - 1]
            spare = bs - kv.blk[i, last, BlockField.TOKENS]
            if spare > 0 and spare < bs:
                eff -= min(spare, eff)
        need = np.int64(0)
        if eff > 0:
            need = (eff + bs - 1) // bs
        from_free = np.int64(0)
        for k in range(n_cached):
            if kv.blk[i, cached[k], BlockField.FREE] == 1:
                from_free += 1
        if need + from_free > free:
            return False
    elif free == 0 and (kv.req[r, BlockList.COUNT] == 0 or kv.req[r, BlockList.LAST] == bs):
        return False

    remaining = ntok
    pos = start  # sequence position of the next token written
    while remaining > 0:
        cnt = kv.req[r, BlockList.COUNT]
        latest = np.int64(-1)
        if cnt > 0:
            latest = kv.pool[off + cnt - 1]
        elif n_cached > 0:
            commit_cached(kv, i, r, cached, np.int64(0), n_cached)
            cnt = kv.req[r, BlockList.COUNT]
            latest = kv.pool[off + cnt - 1]
        # BlockList.LAST equals the latest block's BlockField.TOKENS here (synced above, kept in step below)
        if latest >= 0 and kv.req[r, BlockList.LAST] > 0 and kv.req[r, BlockList.LAST] < bs:
            take = min(bs - kv.blk[i, latest, BlockField.TOKENS], remaining)
            if pos != next_pos(kv, r):
                start_run(kv, r, pos)
            kv.blk[i, latest, BlockField.TOKENS] += take
            kv.req[r, BlockList.LAST] = kv.blk[i, latest, BlockField.TOKENS]
            remaining -= take
            pos += take
            if kv.blk[i, latest, BlockField.TOKENS] == bs and (in_prefill or kv.cfg[KVConfig.HASH_DECODE] == 1):
                prev = np.uint64(0)
                if cnt >= 2:
                    prev = get_block_hash(kv, i, kv.pool[off + cnt - 2])
                h = chain_hash(prev, last_block_digest(kv, r))
                set_block_hash(kv, i, latest, h)
                ht_put(kv, i, h, latest)
        else:
            n_new = (remaining + bs - 1) // bs
            prev = np.uint64(0)
            if in_prefill and kv.req[r, BlockList.COUNT] > 0:  # only prefill blocks are hashed here
                prev = get_block_hash(kv, i, kv.pool[off + kv.req[r, BlockList.COUNT] - 1])
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
                    h = chain_hash(prev, block_digest(kv, r, pos))
                b = pop_free(kv, i)
                kv.blk[i, b, BlockField.TOKENS] = take
                kv.blk[i, b, BlockField.REF] = 1
                kv.meta[i, KVMeta.MISSES] += 1
                if take == bs and in_prefill:
                    set_block_hash(kv, i, b, h)
                    ht_put(kv, i, h, b)
                    prev = h
                if not has_room(kv, r):
                    kv.meta[i, KVMeta.LIST_OVERFLOW] = 1
                    return False
                kv.pool[off + kv.req[r, BlockList.COUNT]] = b
                kv.req[r, BlockList.COUNT] += 1
                kv.req[r, BlockList.LAST] = take
                kv.req[r, BlockList.SEGMENT] = pos
                kv.req[r, BlockList.RUN0] = 0
                remaining -= take
                pos += take
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def allocate(kv, i, r, start, end, in_prefill, input_len, cached, n_cached, scratch,
             chain=None):
    """AllocateKVBlocks for either store (single tier, or GPU+CPU with reload, ENG-5.10).

    The CPU tier is read back after a failed GPU allocation (April), or before every one when
    ``KVConfig.RELOAD_FIRST`` is set (August, KVO-9.1); ``chain``: the tier chain's secondary
    tiers (``kernels/kv/kv_chain.py``, None without), promoted from on a CPU miss, and a new
    admission whose prefix must be fetched from them deferred (False; KVO-7.2)."""
    if kv.cfg[KVConfig.RELOAD_FIRST] == 1:
        gate = chain_gate(chain, kv, i, r, input_len, cached, n_cached)
        if gate == GATE_DEFER:
            return False
        ok = _allocate_reload_first(kv, i, r, start, end, in_prefill, input_len, cached,
                                    n_cached, scratch, chain)
        if ok and gate == GATE_TRACKED:
            chain_forget(chain, i, r)
        return ok
    if _gpu_allocate(kv, i, r, start, end, in_prefill, cached, n_cached):
        return True
    if kv.cfg[KVConfig.TIERED] == 0:
        return False
    if reload_prefix(kv, i, r, input_len, np.int64(0), np.uint64(0), chain):
        return _allocate_after_reload(kv, i, r, start, end, in_prefill, input_len, cached,
                                      n_cached, scratch)
    kv.cpu_meta[i, CpuMeta.MISSES] += 1
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def _allocate_reload_first(kv, i, r, start, end, in_prefill, input_len, cached, n_cached,
                           scratch, chain):
    """The August tier (#1586, KVO-9.1): reload the CPU-resident continuation of the prefix
    first, scanning from past the GPU-cached prefix (or past the blocks a running request
    owns), then allocate as after an April reload; with nothing reloaded, allocate on GPU and
    count a CPU miss only if that fails."""
    first = n_cached
    prev = np.uint64(0)
    if n_cached > 0:
        prev = get_block_hash(kv, i, cached[n_cached - 1])
    owned = kv.req[r, BlockList.COUNT]
    if owned > first:
        first = owned
        prev = get_block_hash(kv, i, kv.pool[kv.req[r, BlockList.OFFSET] + owned - 1])
    if reload_prefix(kv, i, r, input_len, first, prev, chain):
        return _allocate_after_reload(kv, i, r, start, end, in_prefill, input_len, cached,
                                      n_cached, scratch)
    if _gpu_allocate(kv, i, r, start, end, in_prefill, cached, n_cached):
        return True
    kv.cpu_meta[i, CpuMeta.MISSES] += 1
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def _allocate_after_reload(kv, i, r, start, end, in_prefill, input_len, cached, n_cached,
                           scratch):
    """The allocation after blocks came back from the CPU tier (ENG-5.10): commit the newly
    cached prefix (a running request only past what it holds) and allocate the rest."""
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    n_new = cached_blocks(kv, i, r, input_len, scratch)
    new_start = n_new * bs
    if new_start > start:
        has_entry = kv.req[r, BlockList.COUNT] > 0
        if new_start >= end:
            end_block = min((end + bs - 1) // bs, n_new)
            if has_entry:
                start_block = (start + bs - 1) // bs
                if start_block < end_block:
                    commit_cached(kv, i, r, scratch, start_block, end_block)
            else:
                commit_cached(kv, i, r, scratch, np.int64(0), end_block)
            return True
        new_start_block = new_start // bs
        if has_entry:
            start_block = (start + bs - 1) // bs
            if start_block < new_start_block:
                commit_cached(kv, i, r, scratch, start_block, new_start_block)
        else:
            commit_cached(kv, i, r, scratch, np.int64(0), new_start_block)
        return _gpu_allocate(kv, i, r, new_start, end, in_prefill, scratch, n_new)
    return _gpu_allocate(kv, i, r, start, end, in_prefill, cached, n_cached)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def append_decode_token_fast(kv, i, r, pos):
    """Decode allocation of the token at sequence position ``pos`` when the request's last
    block has room for it, continues its run there, and filling it needs no hash: only the
    block's token count changes, exactly as the general path would.

    Returns False when the general :func:`allocate` is needed (new block or block hashing).
    Inlined so the hot decode path does not copy the cache state into a call.
    """
    if kv.req[r, BlockList.COUNT] == 0:
        return False
    tok = kv.req[r, BlockList.LAST]
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    if tok >= bs or (tok == bs - 1 and kv.cfg[KVConfig.HASH_DECODE] == 1):
        return False
    if kv.req[r, BlockList.SEGMENT] + tok - kv.req[r, BlockList.RUN0] != pos:
        return False
    kv.req[r, BlockList.LAST] = tok + 1
    # the token after the block fills allocates, reading the list end and updating the last
    # block's record: ask for the list end two tokens before, for the record one before
    if tok + 2 == bs:
        prefetch(kv.pool, kv.req[r, BlockList.OFFSET] + kv.req[r, BlockList.COUNT] - 1)
    elif tok + 1 == bs:
        prefetch(kv.blk, (i, kv.pool[kv.req[r, BlockList.OFFSET] + kv.req[r, BlockList.COUNT] - 1]))
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def release(kv, i, r):
    """Release every block of request ``r``, last to first, onto the free-list tail (ENG-5.5)."""
    cnt = kv.req[r, BlockList.COUNT]
    off = kv.req[r, BlockList.OFFSET]
    for k in range(cnt - 1, -1, -1):
        if k >= LOOK_RECORD:
            prefetch(kv.blk, (i, kv.pool[off + k - LOOK_RECORD]))
        b = kv.pool[off + k]
        kv.blk[i, b, BlockField.REF] -= 1
        if kv.blk[i, b, BlockField.REF] == 0:
            free_append(kv, i, b)
    kv.req[r, BlockList.COUNT] = 0
    kv.req[r, BlockList.LAST] = 0
    kv.req[r, BlockList.RUN0] = 0


# ---------------------------------------------------------------- queries


@njit(cache=True, _nrt=False, error_model="numpy")
def cached_blocks(kv, i, r, input_len, out):
    """Leading full input blocks of request ``r`` present in instance ``i``'s cache (ENG-5.3).

    Writes block ids to ``out`` and returns how many were found. Pure query.
    """
    return leading_matches(kv.ht, i, kv.chunk_dig, kv.chunk_off[r],
                           input_len // kv.cfg[KVConfig.BLOCK_SIZE], out)


@njit(cache=True, _nrt=False, error_model="numpy")
def free_blocks(kv, i):
    """Number of blocks on instance ``i``'s free list."""
    return kv.meta[i, KVMeta.FREE]


@njit(cache=True, _nrt=False, error_model="numpy")
def used_blocks(kv, i):
    """Blocks in use on instance ``i`` (its total minus free)."""
    return kv.meta[i, KVMeta.TOTAL] - kv.meta[i, KVMeta.FREE]


@njit(cache=True, _nrt=False, error_model="numpy")
def reset_instance_blocks(kv, i, blocks):
    """Instance ``i``'s GPU cache empty with ``blocks`` blocks (at most ``KVConfig.BLOCKS``), all
    free in id order, its prefix table empty: for an instance that joins the cluster during
    the run (the construction-time equivalent is ``kv_layout.new_kv_state``). The CPU tier is
    left as it is."""
    kv.blk[i, :, :] = 0
    for b in range(blocks):
        kv.blk[i, b, BlockField.POS] = b
        kv.blk[i, b, BlockField.FREE] = 1
        kv.free_ring[i, b] = b
    kv.free_slot[i, :] = -1
    kv.ht[i, :, :] = 0
    kv.meta[i, :] = 0
    kv.meta[i, KVMeta.TAIL] = blocks
    kv.meta[i, KVMeta.FREE] = blocks
    kv.meta[i, KVMeta.TOTAL] = blocks


@njit(cache=True, _nrt=False, error_model="numpy")
def list_overflowed(kv):
    """True when some request's block list outgrew its slice (the run is then invalid)."""
    for i in range(kv.meta.shape[0]):
        if kv.meta[i, KVMeta.LIST_OVERFLOW] != 0:
            return True
    return False


@njit(cache=True, _nrt=False, error_model="numpy")
def consume_pending_transfer(kv, i):
    """Pending CPU->GPU transfer latency to add to the next step, then cleared (ENG-5.10.5)."""
    lat = kv.cpu_meta[i, CpuMeta.PENDING]
    kv.cpu_meta[i, CpuMeta.PENDING] = 0
    return lat


@njit(cache=True, _nrt=False, error_model="numpy")
def hit_rate(kv, i):
    """Cumulative hit rate (tiered: CPU misses count as misses too, ENG-5.11)."""
    hits = kv.meta[i, KVMeta.HITS]
    total = hits + kv.meta[i, KVMeta.MISSES] + kv.cpu_meta[i, CpuMeta.MISSES]
    if total == 0:
        return 0.0
    return hits / total


@njit(cache=True, _nrt=False, error_model="numpy")
def thrashing_rate(kv, i):
    """CPU evictions per mirrored block (0 single-tier or without mirrors)."""
    mirrors = kv.cpu_meta[i, CpuMeta.MIRRORS]
    if mirrors == 0:
        return 0.0
    return kv.cpu_meta[i, CpuMeta.EVICTIONS] / mirrors
