"""The KV cache's tiers beyond the GPU in motion: mirroring to the CPU tier and reloading from it
(ENG-5.9, ENG-5.10, KVO-5, KVO-8), and the tier chain's secondary tiers (issue 32; spec
kv-offload.md KVO-4.4..4.6, KVO-5.4, KVO-6.7): the write-through cascade from the CPU tier, the
promotion of a run of blocks back from a secondary tier, and the completions the transfer
station hands over at each step start.

A secondary tier is a set of keys with no capacity and no eviction (KVO-4.5, the reference's
defect KVO-D2): all instances' sets share one table of keys (``KVState.sec_ht``) with a bit per
instance and tier (``KVState.sec_bits``). A write job's tag is the CPU slot it pins; a read
job's tag is the first slot of its run, the run's promoting slots chained through
``cpu_nxt`` (free while a slot is off the LRU list).
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.hashing import chain_hash
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv.hashtable import table_get
from blis_fast.kernels.kv.kv_blocks import (
    free_append,
    get_block_hash,
    ht_put,
    pop_free,
    set_block_hash,
    sync_last,
)
from blis_fast.kernels.kv.kv_cpu import (
    _cpu_append,
    _cpu_touch,
    cpu_offer,
    cpu_pin,
    cpu_prepare_store,
    cpu_unpin,
)
from blis_fast.kernels.kv.kv_layout import BlockField, BlockList, CpuMeta, KVConfig, KVMeta
from blis_fast.kernels.kv.kv_station import (
    READ,
    WRITE,
    JobField,
    clear_done,
    draw_jitter,
    free_job,
    poll,
    submit,
)

SEC_LOAD_LIMIT = 3
"""The shared key table refuses a key past this many quarters full (it is sized for twice
every prompt block of the workload; only hashed decode blocks can go beyond)."""


@njit(cache=True, _nrt=False, error_model="numpy")
def sec_holder(kv, i, h):
    """The first secondary tier (lowest index) of instance ``i`` holding key ``h``, or -1
    (KVO-4.5)."""
    s = table_get(kv.sec_ht, 0, h)
    if s < 0:
        return np.int64(-1)
    n_t = kv.cfg[KVConfig.N_TIERS]
    for t in range(n_t):
        bit = i * n_t + t
        if (kv.sec_bits[s, bit >> 6] >> np.uint64(bit & 63)) & np.uint64(1):
            return np.int64(t)
    return np.int64(-1)


@njit(cache=True, _nrt=False, error_model="numpy")
def sec_add(kv, i, t, h):
    """Tier ``t`` of instance ``i`` now holds key ``h`` (a write completed, KVO-4.4). False
    when the shared table is too full to take a new key (flagged in ``OVERFLOW``)."""
    table = kv.sec_ht
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while table[0, j, 0] != h:
        if table[0, j, 0] == 0:
            if 4 * (kv.cpu_meta[0, CpuMeta.SEC_KEYS] + 1) > SEC_LOAD_LIMIT * table.shape[1]:
                kv.cpu_meta[i, CpuMeta.OVERFLOW] = 1
                return False
            table[0, j, 0] = h
            table[0, j, 1] = np.uint64(j)
            kv.cpu_meta[0, CpuMeta.SEC_KEYS] += 1
            break
        j = (j + 1) & mask
    bit = i * kv.cfg[KVConfig.N_TIERS] + t
    kv.sec_bits[j, bit >> 6] |= np.uint64(1) << np.uint64(bit & 63)
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def cascade(kv, i, h):
    """Write-through of a block newly stored on the CPU tier (KVO-4.4): for each secondary
    tier in order, pin it and submit a write of one block at the store's clock (the jitter
    factor drawn in submit order, KVO-6.5)."""
    s = table_get(kv.cpu_ht, i, h)
    st = kv.station
    for t in range(kv.cfg[KVConfig.N_TIERS]):
        cpu_pin(kv, i, h)
        jitter = draw_jitter(st, i, t)
        if submit(st, i, t, WRITE, kv.cfg[KVConfig.BLOCK_BYTES], kv.cpu_meta[i, CpuMeta.CLOCK],
                  jitter, s) < 0:
            cpu_unpin(kv, i, h)
            kv.cpu_meta[i, CpuMeta.OVERFLOW] = 1


@njit(cache=True, _nrt=False, error_model="numpy")
def maybe_promote(kv, i, r, input_len, first, h):
    """maybePromoteFromSecondary (KVO-5.4): input block ``first`` (key ``h``) missed on the
    CPU tier; if a secondary tier holds it, the run of following blocks that miss on GPU and
    CPU and whose first holder is that tier is promoted: its CPU slots are reserved under the
    evictable gate (refused: counted, nothing moves) and one read of the run's bytes is
    submitted. The blocks become readable when the read completes (:func:`chain_poll`)."""
    t = sec_holder(kv, i, h)
    if t < 0:
        return
    run = kv.chain_keys[0]
    run[0] = h
    n = 1
    base = kv.chunk_off[r]
    prev = h
    for k in range(first + 1, input_len // kv.cfg[KVConfig.BLOCK_SIZE]):
        key = chain_hash(prev, kv.chunk_dig[base + k])
        if (table_get(kv.ht, i, key) >= 0 or table_get(kv.cpu_ht, i, key) >= 0
                or sec_holder(kv, i, key) != t):
            break
        run[n] = key
        n += 1
        prev = key
    fresh = kv.chain_keys[1]
    g = cpu_prepare_store(kv, i, run, n, fresh)
    if g == 0:
        return
    head = table_get(kv.cpu_ht, i, fresh[0])
    prev_slot = head
    for q in range(1, g):
        s = table_get(kv.cpu_ht, i, fresh[q])
        kv.cpu_nxt[i, prev_slot] = s
        prev_slot = s
    kv.cpu_nxt[i, prev_slot] = -1
    st = kv.station
    jitter = draw_jitter(st, i, t)
    if submit(st, i, t, READ, g * kv.cfg[KVConfig.BLOCK_BYTES], kv.cpu_meta[i, CpuMeta.CLOCK],
              jitter, head) < 0:
        kv.cpu_meta[i, CpuMeta.OVERFLOW] = 1


@njit(cache=True, _nrt=False, error_model="numpy")
def chain_poll(kv, i, now):
    """SetClock (KVO-6.7): the store's clock becomes ``now`` and every transfer completed by
    then is applied in completion order (the engine calls it through :func:`chain_sync`): a
    write's tier records the key and its CPU block is unpinned; a read's promoted blocks
    become ready at the CPU tier's LRU tail."""
    kv.cpu_meta[i, CpuMeta.CLOCK] = now
    if kv.cfg[KVConfig.N_TIERS] == 0:
        return
    st = kv.station
    n = poll(st, i, now)
    for q in range(n):
        j = st.done[i, q]
        s = st.jobs[i, j, JobField.TAG]
        if st.jobs[i, j, JobField.DIR] == WRITE:
            h = kv.cpu_hash[i, s]
            sec_add(kv, i, st.jobs[i, j, JobField.TIER], h)
            cpu_unpin(kv, i, h)
        else:
            while s >= 0:
                nxt = kv.cpu_nxt[i, s]
                kv.cpu_ref[i, s] = 0
                _cpu_append(kv, i, s)
                kv.cpu_meta[i, CpuMeta.EVICTABLE] += 1
                s = nxt
        free_job(st, i, j)
    clear_done(st, i)


@njit(cache=True, _nrt=False, error_model="numpy")
def chain_sync(kv, i):
    """Apply the transfers finished by the store's clock (``CpuMeta.CLOCK``, set at each step
    start) before the chain is read or changed. Applying them at the step's first use of the
    chain rather than at its start changes nothing (nothing reads the chain in between, and
    the station completes jobs in the same order whenever it is polled), and keeps the call
    out of the step of runs without secondary tiers."""
    if kv.cfg[KVConfig.N_TIERS] > 0:
        chain_poll(kv, i, kv.cpu_meta[i, CpuMeta.CLOCK])


@njit(cache=True, _nrt=False, error_model="numpy")
def reload_prefix(kv, i, r, input_len, first, prev):
    """reloadPrefixFromCPU (ENG-5.10; KVO-9.1): from input block ``first``, whose predecessor's
    hash is ``prev`` (0 at block 0), put each block the GPU lacks and the CPU tier holds into a
    free GPU block (hashed, unreferenced, at the free-list tail), charging its transfer to the
    next step; stops at the first block neither tier holds, or whose promotion is still in
    flight. With secondary tiers a CPU miss first fires the promotion of the run a secondary
    tier holds (KVO-5.4), which a later call finds. True when any block came back."""
    chain_sync(kv, i)
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    n = input_len // bs
    max_reloads = kv.meta[i, KVMeta.FREE]
    base = kv.chunk_off[r]
    reloaded = False
    count = 0
    for k in range(first, n):
        h = chain_hash(prev, kv.chunk_dig[base + k])
        if table_get(kv.ht, i, h) >= 0:
            prev = h
            continue
        s = table_get(kv.cpu_ht, i, h)
        if s < 0:
            if kv.cfg[KVConfig.N_TIERS] > 0:
                maybe_promote(kv, i, r, input_len, k, h)
            break
        if kv.cpu_ref[i, s] < 0:
            break  # its promotion still in flight (KVO-5.2)
        if count >= max_reloads:
            break
        b = pop_free(kv, i)
        if b < 0:
            break
        kv.blk[i, b, BlockField.TOKENS] = bs
        set_block_hash(kv, i, b, h)
        kv.blk[i, b, BlockField.REF] = 0
        ht_put(kv, i, h, b)
        free_append(kv, i, b)
        kv.cpu_meta[i, CpuMeta.PENDING] += kv.cfg[KVConfig.RELOAD_TICKS]
        _cpu_touch(kv, i, s)
        kv.cpu_meta[i, CpuMeta.HITS] += 1
        reloaded = True
        count += 1
        prev = h
    return reloaded


@njit(cache=True, _nrt=False, error_model="numpy")
def mirror_to_cpu(kv, i, batch_reqs, n, input_len):
    """Copy every full, hashed block of the batch's requests to the CPU tier (ENG-5.9); with
    ``KVConfig.PROMPT_ONLY`` (the tier chain's ``offload_prompt_only``, KVO-8.1) only the
    blocks that lie wholly inside the request's prompt (``input_len[r]`` tokens)."""
    if kv.cfg[KVConfig.TIERED] == 0:
        return
    chain_sync(kv, i)
    bs = kv.cfg[KVConfig.BLOCK_SIZE]
    prompt_only = kv.cfg[KVConfig.PROMPT_ONLY] == 1
    for q in range(n):
        r = batch_reqs[q]
        off = kv.req[r, BlockList.OFFSET]
        sync_last(kv, i, r)
        count = kv.req[r, BlockList.COUNT]
        if prompt_only:
            count = min(count * bs, input_len[r]) // bs
        for k in range(count):
            b = kv.pool[off + k]
            h = get_block_hash(kv, i, b)
            if h == 0 or kv.blk[i, b, BlockField.TOKENS] < bs:
                continue
            if cpu_offer(kv, i, h) == 1 and kv.cfg[KVConfig.N_TIERS] > 0:
                cascade(kv, i, h)
