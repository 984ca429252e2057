"""The KV cache's tiers beyond the GPU in motion: mirroring to the CPU tier and reloading from it
(ENG-5.9, ENG-5.10, KVO-5, KVO-8), and the tier chain's secondary tiers (issue 32; spec
kv-offload.md KVO-4.4..4.6, KVO-5.4, KVO-6.7): the write-through cascade from the CPU tier, the
promotion of a run of blocks back from a secondary tier, and the completions the transfer
station hands over at each step start.

The secondary tiers' state is a :class:`ChainState` of its own, never a part of ``KVState``:
the engine carries it in ``Work.chain``, None when the run has no secondary tier. Every kernel
here that takes ``chain`` tests ``chain is None`` on its own argument, which Numba resolves at
compile time: a run without secondary tiers compiles the GPU and CPU code alone, the same code
as before the chain existed, and pays nothing for it.

A secondary tier is a set of keys with no capacity and no eviction (KVO-4.5, the reference's
defect KVO-D2): all instances' sets share one table of keys (``ChainState.sec_ht``) with a bit
per instance and tier (``ChainState.sec_bits``). A write job's tag is the CPU slot it pins; a
read job's run is described in ``ChainState.reads`` (the request's blocks it covers), whose
keys its completion makes readable.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.enums import RequestState
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
    CPU_HIT,
    CPU_HIT_PENDING,
    CPU_MISS,
    _cpu_touch,
    cpu_complete_store,
    cpu_lookup,
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
    StationMeta,
    StationState,
    TierState,
    clear_done,
    draw_jitter,
    free_job,
    new_station,
    poll,
    submit,
)
from blis_fast.kernels.prefetch import prefetch

__all__ = ["ChainCfg", "ChainMeta", "ChainState", "Defer", "chain_forget", "chain_gate",
           "chain_poll", "chain_quiet", "Read", "is_deferred", "mirror_to_cpu", "new_chain_state",
           "new_station", "poll_deferred", "queue_at", "reload_prefix", "sec_holder",
           "station_rows"]


MIRROR_AHEAD = 8
"""Mirroring prefetches the record of the block this many places ahead in a request's list."""

SEC_LOAD_LIMIT = 3
"""The shared key table refuses a key past this many quarters full (it is sized for twice
every prompt block of the workload; only hashed decode blocks can go beyond)."""


class ChainCfgT(NamedTuple):
    """Slots of ``ChainState.cfg``."""

    N_TIERS: int = 0  # secondary tiers (>= 1)
    BLOCK_BYTES: int = 1  # bytes of one block (a transfer's size per block)
    SIZE: int = 2


ChainCfg = ChainCfgT()


class ChainMetaT(NamedTuple):
    """Columns of ``ChainState.meta[i]``."""

    CLOCK: int = 0  # the store's clock: the start tick of the instance's current step
    OVERFLOW: int = 1  # the secondary key table or the station's job rows ran out of room
    SEC_KEYS: int = 2  # row 0 only: keys in the shared secondary-tier table
    DEFER_HEAD: int = 3  # the first tracked (deferred) request, by id string order; -1: none
    DEFERRALS: int = 4  # deferral episodes started (deferralsStarted, KVO-7.4)
    SIZE: int = 8


ChainMeta = ChainMetaT()


class DeferT(NamedTuple):
    """Columns of ``ChainState.defer[r]``: request ``r``'s deferral episode (KVO-7)."""

    PHASE: int = 0  # DEFER_*
    FIRST: int = 1  # input block index of the awaited run's first block
    LEN: int = 2  # blocks in the run
    TIER: int = 3  # the secondary tier holding the run (-1: awaiting another promotion)
    START: int = 4  # the store's clock when the episode began
    NEXT: int = 5  # the instance's next tracked request (id string order), -1
    PREV: int = 6  # the key of the block before the run (a uint64's bits; 0 at block 0)
    # the request's totals over its life (requests.parquet): episodes started, ticks spent
    # deferred (each episode from its start to the poll that ended it), blocks promoted for it
    EPISODES: int = 7
    WAITED: int = 8
    PROMOTED: int = 9
    SIZE: int = 10


Defer = DeferT()


class ReadT(NamedTuple):
    """Columns of ``ChainState.reads[i, j]``: the run promotion read ``j`` (a job row of the
    instance's station) brings back: request ``REQUEST``'s input blocks ``FIRST ..
    FIRST + LEN - 1``, the first block's key ``KEY`` (a uint64's bits)."""

    REQUEST: int = 0
    FIRST: int = 1
    LEN: int = 2
    KEY: int = 3
    SIZE: int = 4


Read = ReadT()

DEFER_NONE, DEFER_RETRY, DEFER_PROMOTING, DEFER_RESOLVED, DEFER_RECOMPUTE = 0, 1, 2, 3, 4
"""A request's deferral phase: untracked; its run's existence probe outstanding (a run this
instance never probed); awaiting a promotion; to admit (its blocks landed); to admit as a
miss (the fetch was refused or lost)."""
FETCH_NONE, FETCH_SECONDARY, FETCH_PENDING = 0, 1, 2
"""What a new admission's uncached tail needs (classifyFetch, KVO-7.2)."""
GATE_CHAIN, GATE_DEFER, GATE_TRACKED = 0, 1, 2
"""Answers of :func:`chain_gate`: allocate through the chain; deferred (the allocation
fails); allocate an admission whose episode ended, forgetting it once allocated."""
MAX_DEFER_TICKS = 1_000_000_000
"""A deferral episode older than this many ticks is recomputed (KVO-7.4's backstop)."""


class ChainState(NamedTuple):
    """The secondary tiers of every instance (built by :func:`new_chain_state`)."""

    cfg: np.ndarray  # int64 [ChainCfg.SIZE]
    meta: np.ndarray  # int64 [n_instances, ChainMeta.SIZE]
    # the keys any instance's tier holds: one shared table (uint64 [1, size, 2]: key -> its own
    # slot, never deleted: tiers have no eviction, KVO-4.5), and per slot the holders, bit
    # ``i * N_TIERS + t`` of ``sec_bits[slot, word]`` (uint64 [size, words])
    sec_ht: np.ndarray
    sec_bits: np.ndarray
    keys: np.ndarray  # uint64 [2, n]: scratch of a promotion run's keys and its fresh keys
    station: StationState  # every instance's transfer station (kernels/kv/kv_station.py)
    # deferral (KVO-7): per request its episode (int64 [n_requests, Defer.SIZE]); per slot of
    # ``sec_ht`` the instances that probed the key's existence on their tiers (bit i of
    # ``known[slot, i >> 6]``); the ids' string order (the engine's ``RequestInputs.id_rank``)
    defer: np.ndarray
    known: np.ndarray
    id_rank: np.ndarray
    reads: np.ndarray  # int64 [n_instances, job rows, Read.SIZE]: each promotion read's run


def new_chain_state(n_instances: int, n_keys: int, max_run: int, block_bytes: int,
                    station: StationState, n_tiers: int, id_rank: np.ndarray) -> ChainState:
    """Empty secondary tiers for ``n_instances`` instances: ``n_tiers`` tiers served by
    ``station``, a key table sized for ``n_keys`` distinct block keys (the workload's prompt
    blocks), promotion runs of up to ``max_run`` blocks (a request's prompt), ``block_bytes``
    per block; one deferral record per entry of ``id_rank`` (the requests' id string ranks,
    kept by reference: the engine fills in its follow-ups' ranks)."""
    size = 16
    while size < 2 * (n_keys + 1):
        size *= 2
    words = (n_instances * n_tiers + 63) // 64
    meta = np.zeros((n_instances, ChainMeta.SIZE), np.int64)
    meta[:, ChainMeta.DEFER_HEAD] = -1
    defer = np.zeros((id_rank.shape[0], Defer.SIZE), np.int64)
    defer[:, Defer.NEXT] = -1
    return ChainState(
        cfg=np.array([n_tiers, block_bytes], np.int64), meta=meta,
        sec_ht=np.zeros((1, size, 2), np.uint64),
        sec_bits=np.zeros((size, words), np.uint64),
        keys=np.zeros((2, max_run + 1), np.uint64), station=station, defer=defer,
        known=np.zeros((size, (n_instances + 63) // 64), np.uint64), id_rank=id_rank,
        reads=np.zeros((n_instances, station.jobs.shape[1], Read.SIZE), np.int64))


def station_rows(cpu_blocks: int, n_tiers: int) -> int:
    """Job rows a station needs: a write per pinned CPU block and tier, a read per promoting
    block (each run reads at least one block)."""
    return cpu_blocks * (n_tiers + 1)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def sec_holder(chain, i, h):
    """The first secondary tier (lowest index) of instance ``i`` holding key ``h``, or -1
    (KVO-4.5)."""
    s = table_get(chain.sec_ht, 0, h)
    if s < 0:
        return np.int64(-1)
    n_t = chain.cfg[ChainCfg.N_TIERS]
    for t in range(n_t):
        bit = i * n_t + t
        if (chain.sec_bits[s, bit >> 6] >> np.uint64(bit & 63)) & np.uint64(1):
            return np.int64(t)
    return np.int64(-1)


@njit(cache=True, _nrt=False, error_model="numpy")
def sec_add(chain, i, t, h):
    """Tier ``t`` of instance ``i`` now holds key ``h`` (a write completed, KVO-4.4). False
    when the shared table is too full to take a new key (flagged in ``OVERFLOW``)."""
    table = chain.sec_ht
    mask = table.shape[1] - 1
    j = np.int64(h & np.uint64(mask))
    while table[0, j, 0] != h:
        if table[0, j, 0] == 0:
            if 4 * (chain.meta[0, ChainMeta.SEC_KEYS] + 1) > SEC_LOAD_LIMIT * table.shape[1]:
                chain.meta[i, ChainMeta.OVERFLOW] = 1
                return False
            table[0, j, 0] = h
            table[0, j, 1] = np.uint64(j)
            chain.meta[0, ChainMeta.SEC_KEYS] += 1
            break
        j = (j + 1) & mask
    bit = i * chain.cfg[ChainCfg.N_TIERS] + t
    chain.sec_bits[j, bit >> 6] |= np.uint64(1) << np.uint64(bit & 63)
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def cascade(chain, kv, i, h):
    """Write-through of a block newly stored on the CPU tier (KVO-4.4): for each secondary
    tier in order, pin it and submit a write of one block at the store's clock (the jitter
    factor drawn in submit order, KVO-6.5)."""
    s = table_get(kv.cpu_ht, i, h)
    st = chain.station
    for t in range(chain.cfg[ChainCfg.N_TIERS]):
        cpu_pin(kv, i, h)
        jitter = draw_jitter(st, i, t)
        if submit(st, i, t, WRITE, chain.cfg[ChainCfg.BLOCK_BYTES],
                  chain.meta[i, ChainMeta.CLOCK], jitter, s) < 0:
            cpu_unpin(kv, i, h)
            chain.meta[i, ChainMeta.OVERFLOW] = 1


@njit(cache=True, _nrt=False, error_model="numpy")
def gather_run(chain, kv, i, r, input_len, first, h, out):
    """gatherSecondaryRun (KVO-5.4): the run of request ``r``'s input blocks from block
    ``first`` (key ``h``, a CPU miss) that miss on GPU and CPU and whose first holding tier
    is the first block's, keys written to ``out``. Returns (blocks, tier); tier -1 when no
    secondary tier holds the first block (a genuine miss)."""
    t = sec_holder(chain, i, h)
    if t < 0:
        return np.int64(0), np.int64(-1)
    out[0] = h
    n = np.int64(1)
    base = kv.chunk_off[r]
    prev = h
    for k in range(first + 1, input_len // kv.cfg[KVConfig.BLOCK_SIZE]):
        if n >= out.shape[0]:
            chain.meta[i, ChainMeta.OVERFLOW] = 1
            break
        key = chain_hash(prev, kv.chunk_dig[base + k])
        if (table_get(kv.ht, i, key) >= 0 or table_get(kv.cpu_ht, i, key) >= 0
                or sec_holder(chain, i, key) != t):
            break
        out[n] = key
        n += 1
        prev = key
    return n, t


@njit(cache=True, _nrt=False, error_model="numpy")
def fire_run(chain, kv, i, run, n, t, r, first):
    """firePromotionRun (KVO-5.4, KVO-4.6): reserve CPU slots for the absent keys of
    ``run[:n]`` (request ``r``'s input blocks from ``first``) under the evictable gate (a
    refusal is counted, nothing moves) and submit one read of their bytes on tier ``t``. The
    read remembers the whole run, as the reference's does: its completion makes every key of
    the run still awaiting a promotion readable (:func:`chain_poll`). True when granted."""
    g = cpu_prepare_store(kv, i, run, n, chain.keys[1])
    if g == 0:
        return False
    st = chain.station
    jitter = draw_jitter(st, i, t)
    j = submit(st, i, t, READ, g * chain.cfg[ChainCfg.BLOCK_BYTES],
               chain.meta[i, ChainMeta.CLOCK], jitter, np.int64(-1))
    if j < 0:
        chain.meta[i, ChainMeta.OVERFLOW] = 1
        return True
    chain.reads[i, j, Read.REQUEST] = r
    chain.reads[i, j, Read.FIRST] = first
    chain.reads[i, j, Read.LEN] = n
    chain.reads[i, j, Read.KEY] = np.int64(run[0])
    return True


@njit(cache=True, _nrt=False, error_model="numpy")
def maybe_promote(chain, kv, i, r, input_len, first, h):
    """maybePromoteFromSecondary (KVO-5.4): input block ``first`` (key ``h``) missed on the
    CPU tier; if a secondary tier holds it, the run behind it is promoted (a miss now: a
    later consult finds it on the CPU tier)."""
    run = chain.keys[0]
    n, t = gather_run(chain, kv, i, r, input_len, first, h, run)
    if t >= 0:
        fire_run(chain, kv, i, run, n, t, r, first)


@njit(cache=True, _nrt=False, error_model="numpy")
def _read_landed(chain, kv, i, j):
    """Promotion read ``j`` completed: every key of its run still awaiting a promotion (its own
    blocks, and any another read promotes) becomes ready at the CPU tier's LRU tail, in run
    order (completeStore, KVO-4.6)."""
    rd = chain.reads
    r = rd[i, j, Read.REQUEST]
    base = kv.chunk_off[r] + rd[i, j, Read.FIRST]
    key = np.uint64(rd[i, j, Read.KEY])
    for q in range(rd[i, j, Read.LEN]):
        if q > 0:
            key = chain_hash(key, kv.chunk_dig[base + q])
        if cpu_complete_store(kv, i, key, True):
            chain.defer[r, Defer.PROMOTED] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def chain_poll(chain, kv, i, now):
    """SetClock at a step start (KVO-6.7): the store's clock becomes ``now`` and every
    transfer completed by then is applied in completion order: a write's tier records the
    key and its CPU block is unpinned; a read's promoted blocks become ready at the CPU
    tier's LRU tail. Nothing without secondary tiers (``chain`` None)."""
    if chain is None:
        return
    chain.meta[i, ChainMeta.CLOCK] = now
    st = chain.station
    n = poll(st, i, now)
    for q in range(n):
        j = st.done[i, q]
        s = st.jobs[i, j, JobField.TAG]
        if st.jobs[i, j, JobField.DIR] == WRITE:
            h = kv.cpu_hash[i, s]
            sec_add(chain, i, st.jobs[i, j, JobField.TIER], h)
            cpu_unpin(kv, i, h)
        else:
            _read_landed(chain, kv, i, j)
        free_job(st, i, j)
    clear_done(st, i)


@njit(cache=True, _nrt=False, error_model="numpy")
def reload_prefix(kv, i, r, input_len, first, prev, chain=None):
    """reloadPrefixFromCPU (ENG-5.10; KVO-9.1): from input block ``first``, whose predecessor's
    hash is ``prev`` (0 at block 0), put each block the GPU lacks and the CPU tier holds into a
    free GPU block (hashed, unreferenced, at the free-list tail), charging its transfer to the
    next step; stops at the first block neither tier holds, or whose promotion is still in
    flight. With secondary tiers (``chain``) a CPU miss first fires the promotion of the run a
    secondary tier holds (KVO-5.4), which a later call finds. True when any block came back."""
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
            if chain is not None:
                maybe_promote(chain, kv, i, r, input_len, k, h)
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
        kv.req[r, BlockList.CPU_RELOADS] += 1
        reloaded = True
        count += 1
        prev = h
    return reloaded


@njit(cache=True, _nrt=False, error_model="numpy")
def mirror_to_cpu(kv, i, batch_reqs, n, input_len, chain=None):
    """Copy every full, hashed block of the batch's requests to the CPU tier (ENG-5.9); with
    ``KVConfig.PROMPT_ONLY`` (the tier chain's ``offload_prompt_only``, KVO-8.1) only the
    blocks that lie wholly inside the request's prompt (``input_len[r]`` tokens). With
    secondary tiers (``chain``) each newly stored block is written through (KVO-4.4)."""
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
            if k + MIRROR_AHEAD < count:  # the block record a few blocks on: it is a miss
                prefetch(kv.blk, (i, kv.pool[off + k + MIRROR_AHEAD]))
            b = kv.pool[off + k]
            h = get_block_hash(kv, i, b)
            if h == 0 or kv.blk[i, b, BlockField.TOKENS] < bs:
                continue
            answer, s = cpu_offer(kv, i, h, np.int64(kv.blk[i, b, BlockField.CPU_SLOT]))
            if s >= 0:
                kv.blk[i, b, BlockField.CPU_SLOT] = s
            if answer == 1 and chain is not None:
                cascade(chain, kv, i, h)


# ---------------------------------------------------------------- deferral (KVO-7)


@njit(cache=True, _nrt=False, error_model="numpy")
def _run_keys(kv, r, first, n, prev, out):
    """The keys of request ``r``'s input blocks ``first .. first + n - 1`` into ``out``
    (``prev``: the key of the block before them, 0 at block 0)."""
    base = kv.chunk_off[r]
    for q in range(n):
        prev = chain_hash(prev, kv.chunk_dig[base + first + q])
        out[q] = prev


@njit(cache=True, _nrt=False, error_model="numpy")
def _known(chain, i, run, n, mark):
    """allKnown / markKnown (KVO-7.4): True when instance ``i`` probed the existence of every
    key of ``run[:n]`` on its tiers before; with ``mark`` they are probed now. A run's keys
    are on a tier, so each has a slot in the shared key table, with a probe bit per
    instance."""
    every = True
    word = i >> 6
    bit = np.uint64(1) << np.uint64(i & 63)
    for q in range(n):
        s = table_get(chain.sec_ht, 0, run[q])
        if s < 0 or (chain.known[s, word] & bit) == 0:
            every = False
            if mark and s >= 0:
                chain.known[s, word] |= bit
    return every


@njit(cache=True, _nrt=False, error_model="numpy")
def _awaited(kv, i, run, n):
    """awaitedState (KVO-7.4): CPU_HIT when every key of ``run[:n]`` is readable on the CPU
    tier, CPU_MISS when any is absent, else CPU_HIT_PENDING."""
    every = True
    for q in range(n):
        a = cpu_lookup(kv, i, run[q])
        if a == CPU_MISS:
            return CPU_MISS
        if a == CPU_HIT_PENDING:
            every = False
    return CPU_HIT if every else CPU_HIT_PENDING


@njit(cache=True, _nrt=False, error_model="numpy")
def _classify(chain, kv, i, r, input_len, first, prev):
    """classifyFetch (KVO-7.2), changing nothing: from input block ``first`` (``prev``: the
    key before it) the first block neither on GPU nor ready on the CPU tier decides: its
    promotion in flight (FETCH_PENDING), a CPU miss a secondary tier holds (FETCH_SECONDARY,
    the run's keys in ``chain.keys[0]``), else FETCH_NONE (recompute). Returns (kind, the
    run's first block, its length, its tier, the key before it)."""
    base = kv.chunk_off[r]
    for k in range(first, input_len // kv.cfg[KVConfig.BLOCK_SIZE]):
        h = chain_hash(prev, kv.chunk_dig[base + k])
        if table_get(kv.ht, i, h) < 0:
            a = cpu_lookup(kv, i, h)
            if a == CPU_HIT_PENDING:
                return FETCH_PENDING, np.int64(k), np.int64(1), np.int64(-1), prev
            if a == CPU_MISS:
                n, t = gather_run(chain, kv, i, r, input_len, k, h, chain.keys[0])
                kind = FETCH_SECONDARY if t >= 0 else FETCH_NONE
                return kind, np.int64(k), n, t, prev
        prev = h
    return FETCH_NONE, np.int64(0), np.int64(0), np.int64(-1), prev


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _pending(phase):
    """True while an episode in ``phase`` still waits on its fetch."""
    return phase == DEFER_RETRY or phase == DEFER_PROMOTING


@njit(cache=True, _nrt=False, error_model="numpy")
def _track(chain, i, r):
    """Add request ``r`` to instance ``i``'s tracked requests, kept in id string order (the
    order PollDeferred advances them in, KVO-7.3)."""
    d = chain.defer
    rank = chain.id_rank[r]
    prev = np.int64(-1)
    cur = chain.meta[i, ChainMeta.DEFER_HEAD]
    while cur >= 0 and chain.id_rank[cur] < rank:
        prev = cur
        cur = d[cur, Defer.NEXT]
    d[r, Defer.NEXT] = cur
    if prev < 0:
        chain.meta[i, ChainMeta.DEFER_HEAD] = r
    else:
        d[prev, Defer.NEXT] = r


@njit(cache=True, _nrt=False, error_model="numpy")
def _untrack(chain, i, r, prev):
    """Forget request ``r``'s episode (``prev``: the tracked request before it, -1 at the
    head)."""
    d = chain.defer
    if prev < 0:
        chain.meta[i, ChainMeta.DEFER_HEAD] = d[r, Defer.NEXT]
    else:
        d[prev, Defer.NEXT] = d[r, Defer.NEXT]
    d[r, Defer.PHASE] = DEFER_NONE
    d[r, Defer.NEXT] = -1


@njit(cache=True, _nrt=False, error_model="numpy")
def _register(chain, kv, i, r, kind, first, n, t, prev):
    """registerDeferral (KVO-7.4): a new episode for request ``r``. A block whose promotion
    is in flight is awaited; a run this instance probed before is promoted now (refused:
    recompute); any other run waits a step for its existence probe."""
    d = chain.defer
    chain.meta[i, ChainMeta.DEFERRALS] += 1
    d[r, Defer.EPISODES] += 1
    d[r, Defer.FIRST] = first
    d[r, Defer.LEN] = n
    d[r, Defer.TIER] = t
    d[r, Defer.START] = chain.meta[i, ChainMeta.CLOCK]
    d[r, Defer.PREV] = np.int64(prev)
    if kind == FETCH_PENDING:
        d[r, Defer.PHASE] = DEFER_PROMOTING
    elif _known(chain, i, chain.keys[0], n, False):
        fired = fire_run(chain, kv, i, chain.keys[0], n, t, r, first)
        d[r, Defer.PHASE] = DEFER_PROMOTING if fired else DEFER_RECOMPUTE
    else:
        d[r, Defer.PHASE] = DEFER_RETRY
    _track(chain, i, r)


@njit(cache=True, _nrt=False, error_model="numpy")
def _advance(chain, kv, i, r, now):
    """One PollDeferred round of pending request ``r`` (KVO-7.4): a probed run lands, is
    awaited from a promotion in flight, or is promoted now (refused: recompute); an awaited
    run is admitted once every block is readable, recomputed once one is gone; an episode
    past MAX_DEFER_TICKS is recomputed."""
    d = chain.defer
    n = d[r, Defer.LEN]
    run = chain.keys[0]
    _run_keys(kv, r, d[r, Defer.FIRST], n, np.uint64(d[r, Defer.PREV]), run)
    a = _awaited(kv, i, run, n)
    if d[r, Defer.PHASE] == DEFER_RETRY:
        _known(chain, i, run, n, True)
        if a == CPU_HIT:
            d[r, Defer.PHASE] = DEFER_RESOLVED
        elif a == CPU_HIT_PENDING:
            d[r, Defer.PHASE] = DEFER_PROMOTING
        elif fire_run(chain, kv, i, run, n, d[r, Defer.TIER], r, d[r, Defer.FIRST]):
            d[r, Defer.PHASE] = DEFER_PROMOTING
        else:
            d[r, Defer.PHASE] = DEFER_RECOMPUTE
    elif a == CPU_HIT:
        d[r, Defer.PHASE] = DEFER_RESOLVED
    elif a == CPU_MISS:
        d[r, Defer.PHASE] = DEFER_RECOMPUTE
    ph = d[r, Defer.PHASE]
    if _pending(ph) and now - d[r, Defer.START] > MAX_DEFER_TICKS:
        d[r, Defer.PHASE] = DEFER_RECOMPUTE
    if _pending(d[r, Defer.PHASE]):
        return
    d[r, Defer.WAITED] += now - d[r, Defer.START]


@njit(cache=True, _nrt=False, error_model="numpy")
def poll_deferred(chain, kv, rs, i):
    """PollDeferred at the top of batch formation's second phase (KVO-7.3): every tracked
    request of instance ``i`` still pending advances one round, in id string order; one that
    left the instance (timed out, finished, dropped) is forgotten first, as ClearDeferredKV
    forgets it when it leaves (KVO-7.6). A running request keeps its episode: the reference
    forgets one only when its tracked allocation succeeds, and a request that became running
    otherwise (a failed allocation left GPU blocks committed to it, so the gate saw it as
    running) carries its ended episode into its next preemption, where it is admitted without
    a new classification. Nothing without secondary tiers (``chain`` None)."""
    if chain is None:
        return
    now = chain.meta[i, ChainMeta.CLOCK]
    prev = np.int64(-1)
    r = chain.meta[i, ChainMeta.DEFER_HEAD]
    while r >= 0:
        nxt = chain.defer[r, Defer.NEXT]
        st = rs.state[r]
        if (st != RequestState.QUEUED and st != RequestState.RUNNING) or rs.inst[r] != i:
            if _pending(chain.defer[r, Defer.PHASE]):  # it left while waiting
                chain.defer[r, Defer.WAITED] += now - chain.defer[r, Defer.START]
            _untrack(chain, i, r, prev)
            r = nxt
            continue
        ph = chain.defer[r, Defer.PHASE]
        if _pending(ph):
            _advance(chain, kv, i, r, now)
        prev = r
        r = nxt


@njit(cache=True, _nrt=False, error_model="numpy")
def chain_gate(chain, kv, i, r, input_len, cached, n_cached):
    """AllocateKVBlocks' deferral gate for request ``r`` (KVO-7.2): only a new admission (it
    holds no GPU blocks) is gated. A pending episode defers again (GATE_DEFER); an ended one
    allocates (GATE_TRACKED); an untracked request whose uncached tail (past its ``n_cached``
    GPU-cached blocks ``cached``) needs a fetch starts an episode (GATE_DEFER); else
    GATE_CHAIN. Always GATE_CHAIN without secondary tiers."""
    if chain is None:
        return GATE_CHAIN
    if kv.req[r, BlockList.COUNT] != 0:
        return GATE_CHAIN
    ph = chain.defer[r, Defer.PHASE]
    if _pending(ph):
        return GATE_DEFER
    if ph != DEFER_NONE:
        return GATE_TRACKED
    prev = np.uint64(0)
    if n_cached > 0:
        prev = get_block_hash(kv, i, cached[n_cached - 1])
    kind, first, n, t, before = _classify(chain, kv, i, r, input_len, n_cached, prev)
    if kind == FETCH_NONE:
        return GATE_CHAIN
    _register(chain, kv, i, r, kind, first, n, t, before)
    return GATE_DEFER


@njit(cache=True, _nrt=False, error_model="numpy")
def chain_forget(chain, i, r):
    """Request ``r``'s ended episode is over: it was admitted (KVO-7.4). Nothing without
    secondary tiers."""
    if chain is None:
        return
    prev = np.int64(-1)
    cur = chain.meta[i, ChainMeta.DEFER_HEAD]
    while cur >= 0 and cur != r:
        prev = cur
        cur = chain.defer[cur, Defer.NEXT]
    if cur == r:
        _untrack(chain, i, r, prev)


@njit(cache=True, _nrt=False, error_model="numpy")
def is_deferred(chain, r):
    """True when request ``r`` waits on a fetch (batch formation skips it, KVO-7.3); never
    without secondary tiers."""
    if chain is None:
        return False
    return _pending(chain.defer[r, Defer.PHASE])


@njit(cache=True, _nrt=False, error_model="numpy")
def queue_at(chain, wq_next, head, skipped):
    """The waiting request batch formation examines: the one ``skipped`` places behind the
    queue's ``head`` (``wq_next``: the queue's links), past the deferred requests it set
    aside this step (KVO-7.3). The head without secondary tiers."""
    if chain is None:
        return head
    r = head
    for _ in range(skipped):
        r = wq_next[r]
    return r


@njit(cache=True, _nrt=False, error_model="numpy")
def chain_quiet(chain, i):
    """True when instance ``i``'s chain will change nothing by itself: no transfer queued or
    in service, no request deferred (the engine's livelock search may then fingerprint the
    instance without it). Always without secondary tiers."""
    if chain is None:
        return True
    st = chain.station
    if st.meta[i, StationMeta.HEAP_LEN] > 0 or chain.meta[i, ChainMeta.DEFER_HEAD] >= 0:
        return False
    for t in range(chain.cfg[ChainCfg.N_TIERS]):
        ts = st.tier_state
        if ts[i, t, TierState.RQ_HEAD] >= 0 or ts[i, t, TierState.WQ_HEAD] >= 0:
            return False
    return True
