"""The KV cache's CPU tier (ENG-5.9, ENG-5.10): an LRU store of block hashes per instance,
filled by mirroring the running batch's full blocks after each step and read back by reloading
a request's missing prefix blocks into free GPU blocks, at a transfer cost the next step pays.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.hashing import chain_hash
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv.hashtable import table_del, table_get, table_put
from blis_fast.kernels.kv.kv_blocks import (
    free_append,
    get_block_hash,
    ht_put,
    pop_free,
    set_block_hash,
    sync_last,
)
from blis_fast.kernels.kv.kv_layout import BlockField, BlockList, CpuMeta, KVConfig, KVMeta


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
def _cpu_store(kv, i, h):
    cm = kv.cpu_meta
    if cm[i, CpuMeta.USED] >= kv.cfg[KVConfig.CPU_CAPACITY]:
        victim = cm[i, CpuMeta.HEAD]
        if victim >= 0:
            _cpu_unlink(kv, i, victim)
            table_del(kv.cpu_ht, i, kv.cpu_hash[i, victim])
            cm[i, CpuMeta.USED] -= 1
            cm[i, CpuMeta.EVICTIONS] += 1
            kv.cpu_free[i, cm[i, CpuMeta.FREE_TOP]] = victim
            cm[i, CpuMeta.FREE_TOP] += 1
    cm[i, CpuMeta.FREE_TOP] -= 1
    s = kv.cpu_free[i, cm[i, CpuMeta.FREE_TOP]]
    kv.cpu_hash[i, s] = h
    table_put(kv.cpu_ht, i, h, np.uint64(s))
    _cpu_append(kv, i, s)
    cm[i, CpuMeta.USED] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def mirror_to_cpu(kv, i, batch_reqs, n, input_len):
    """Copy every full, hashed block of the batch's requests to the CPU tier (ENG-5.9); with
    ``KVConfig.PROMPT_ONLY`` (the tier chain's ``offload_prompt_only``, KVO-8.1) only the
    blocks that lie wholly inside the request's prompt (``input_len[r]`` tokens)."""
    if kv.cfg[KVConfig.TIERED] == 0:
        return
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
            s = table_get(kv.cpu_ht, i, h)
            if s >= 0:
                _cpu_unlink(kv, i, s)
                _cpu_append(kv, i, s)
            else:
                _cpu_store(kv, i, h)
                kv.cpu_meta[i, CpuMeta.MIRRORS] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def reload_prefix(kv, i, r, input_len, first, prev):
    """reloadPrefixFromCPU (ENG-5.10; KVO-9.1): from input block ``first``, whose predecessor's
    hash is ``prev`` (0 at block 0), put each block the GPU lacks and the CPU tier holds into a
    free GPU block (hashed, unreferenced, at the free-list tail), charging its transfer to the
    next step; stops at the first block neither tier holds. True when any block came back."""
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
            break
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
        _cpu_unlink(kv, i, s)
        _cpu_append(kv, i, s)
        kv.cpu_meta[i, CpuMeta.HITS] += 1
        reloaded = True
        count += 1
        prev = h
    return reloaded
