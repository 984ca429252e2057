"""The routing scorers (CLU-3.19..3.22, DELTA-30..36): the stateless ones as ``cfunc``s, the
stateful ones (prefix affinity, precise prefix cache, no-hit LRU) as kernels on the router
state, and :func:`score_dimension`, which gives one scorer's values for every candidate of a
routing decision (``rt.dim[k]`` for candidate ``cand[k]``).

The stateless scorers have exactly the signature of a user scorer
(``blis_fast.kernels.cluster.hooks.SCORER_SIG``): they read the per-instance snapshot rows and write one
score per instance. The engine calls them through a table of function pointers, so adding a
scorer is one function here plus one line in ``blis_fast.policies.SCORERS`` (see
docs/extending.md). Integer-valued inputs arrive as float64; every formula below gives the same
float64 results as the reference's integer arithmetic (the values are far below 2**53).
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.cluster.hooks import (
    SCORER_SIG,
    SNAP_BATCH,
    SNAP_CACHED_BLOCKS,
    SNAP_IN_FLIGHT,
    SNAP_KV_UTIL,
    SNAP_QUEUE,
)
from blis_fast.kernels.cluster.router_state import LruMeta, RouterVar
from blis_fast.kernels.enums import StatefulScorer
from blis_fast.kernels.hashing import chain_hashes
from blis_fast.kernels.jit import cfunc, njit
from blis_fast.kernels.kv.hashtable import leading_matches, table_del, table_get, table_put

LOAD_AWARE_QUEUE_THRESHOLD = 128.0  # sim/routing_scorers.go loadAwareQueueThreshold


@njit(cache=True, _nrt=False, error_model="numpy")
def normalize_min_max(values, n, higher_is_better):
    """Min-max normalise ``values[:n]`` in place: (x - min) / (max - min) when higher is better,
    else (max - x) / (max - min); 1 for every instance when all are equal. Exact on integer
    values below 2**53, as the reference's integer arithmetic is."""
    lo = values[0]
    hi = values[0]
    for i in range(1, n):
        if values[i] < lo:
            lo = values[i]
        if values[i] > hi:
            hi = values[i]
    for i in range(n):
        if hi == lo:
            values[i] = 1.0
        elif higher_is_better:
            values[i] = (values[i] - lo) / (hi - lo)
        else:
            values[i] = (hi - values[i]) / (hi - lo)


# ---------------------------------------------------------------- stateless scorers (cfuncs)


@cfunc(SCORER_SIG, cache=True)
def score_queue_depth(snapshots, request, out):
    """queue-depth: min-max over wait-queue lengths, shortest queue scores 1 (DELTA-30)."""
    n = snapshots.shape[0]
    for i in range(n):
        out[i] = snapshots[i, SNAP_QUEUE]
    normalize_min_max(out, n, False)


@cfunc(SCORER_SIG, cache=True)
def score_kv_utilization(snapshots, request, out):
    """kv-utilization: 1 - used/total GPU blocks (CLU-3.20)."""
    for i in range(snapshots.shape[0]):
        out[i] = 1.0 - snapshots[i, SNAP_KV_UTIL]


@cfunc(SCORER_SIG, cache=True)
def score_load_balance(snapshots, request, out):
    """load-balance: 1 / (1 + queue + batch + in-flight) (CLU-3.21)."""
    for i in range(snapshots.shape[0]):
        load = (snapshots[i, SNAP_QUEUE] + snapshots[i, SNAP_BATCH]) + snapshots[i, SNAP_IN_FLIGHT]
        out[i] = 1.0 / (1.0 + load)


@cfunc(SCORER_SIG, cache=True)
def score_active_requests(snapshots, request, out):
    """active-requests: (max - in-flight) / max; 1 for an instance with none (DELTA-35)."""
    n = snapshots.shape[0]
    top = 0.0
    for i in range(n):
        top = max(top, snapshots[i, SNAP_IN_FLIGHT])
    for i in range(n):
        f = snapshots[i, SNAP_IN_FLIGHT]
        out[i] = 1.0 if (f == 0.0 or top == 0.0) else (top - f) / top


@cfunc(SCORER_SIG, cache=True)
def score_running_requests(snapshots, request, out):
    """running-requests: min-max over running-batch sizes, smallest scores 1 (DELTA-35)."""
    n = snapshots.shape[0]
    for i in range(n):
        out[i] = snapshots[i, SNAP_BATCH]
    normalize_min_max(out, n, False)


@cfunc(SCORER_SIG, cache=True)
def score_load_aware(snapshots, request, out):
    """load-aware: 0.5 for an empty queue, else 0.5 * (1 - min(queue, 128) / 128) (DELTA-35)."""
    for i in range(snapshots.shape[0]):
        q = snapshots[i, SNAP_QUEUE]
        if q == 0.0:
            out[i] = 0.5
        else:
            out[i] = 0.5 * (1.0 - min(q, LOAD_AWARE_QUEUE_THRESHOLD) / LOAD_AWARE_QUEUE_THRESHOLD)


@cfunc(SCORER_SIG, cache=True)
def score_vllm_dp(snapshots, request, out):
    """vllm-dp: min-max over 4 * queue + batch, lowest scores 1 (DELTA-36)."""
    n = snapshots.shape[0]
    for i in range(n):
        out[i] = snapshots[i, SNAP_QUEUE] * 4.0 + snapshots[i, SNAP_BATCH]
    normalize_min_max(out, n, False)


# ---------------------------------------------------------------- stateful scorers


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _score_prefix_affinity(rt, kv, r, cand, n, n_blocks):
    """prefix-affinity: the share of the request's input blocks the router's index has seen on
    each candidate as a leading run (DELTA-32)."""
    for k in range(n):
        i = cand[k]
        if n_blocks == 0:
            rt.dim[k] = 0.0
        elif rt.pa_meta[i, LruMeta.LEN] == 0:
            rt.dim[k] = 0.0
        else:
            hits = leading_matches(rt.pa_table, i, kv.chunk_dig, kv.chunk_off[r], n_blocks,
                                   rt.found)
            rt.dim[k] = np.float64(hits) / np.float64(n_blocks)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _prune_no_hit(rt, cand, n):
    """Drop the instances that are not candidates from the no-hit LRU (the reference prunes
    its list to the snapshot set on every cold request; a no-op while every instance is a
    candidate). Leaves ``rt.pos`` mapping each candidate to its position."""
    for k in range(n):
        rt.pos[cand[k]] = k
    kept = 0
    for k in range(rt.st[RouterVar.NH_LEN]):
        i = rt.nh_order[k]
        if rt.pos[i] >= 0:
            rt.nh_order[kept] = i
            kept += 1
        else:
            rt.nh_set[i] = 0
    rt.st[RouterVar.NH_LEN] = kept


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _score_no_hit_lru(rt, r, cand, n):
    """no-hit-lru (DELTA-34): 0.5 everywhere when some candidate has the prefix cached, else
    candidates never chosen for a cold request first, then least recently chosen first."""
    warm = False
    for k in range(n):
        if rt.hook_snap[k, SNAP_CACHED_BLOCKS] > 0:
            warm = True
            break
    rt.st[RouterVar.NH_LAST_REQ] = r
    rt.st[RouterVar.NH_LAST_WARM] = 1 if warm else 0
    if warm:
        for k in range(n):
            rt.dim[k] = 0.5
    elif n <= 1:
        for k in range(n):
            rt.dim[k] = 1.0
    else:
        _prune_no_hit(rt, cand, n)
        rank = 0
        for k in range(n):
            if rt.nh_set[cand[k]] == 0:
                rt.dim[k] = 1.0 - np.float64(rank) / np.float64(n - 1)
                rank += 1
        for k in range(rt.st[RouterVar.NH_LEN] - 1, -1, -1):
            i = rt.nh_order[k]
            rt.dim[rt.pos[i]] = 1.0 - np.float64(rank) / np.float64(n - 1)
            rank += 1
        for k in range(n):
            rt.pos[cand[k]] = -1


@njit(cache=True, _nrt=False, error_model="numpy")
def score_dimension(rt, kv, code, r, cand, n, n_blocks, scorer_table):
    """One scorer's values for the candidates ``cand[:n]`` into rt.dim[:n] (CLU-3.22,
    DELTA-32/34; the stateless scorers are table cfuncs reading rt.hook_snap's candidate
    rows)."""
    if code >= StatefulScorer.TABLE_BASE:
        scorer_table[code - StatefulScorer.TABLE_BASE](rt.hook_snap[:n], rt.hook_req, rt.dim[:n])
    elif code == StatefulScorer.PREFIX_AFFINITY:
        _score_prefix_affinity(rt, kv, r, cand, n, n_blocks)
    elif code == StatefulScorer.PRECISE_PREFIX_CACHE:
        for k in range(n):
            rt.dim[k] = rt.hook_snap[k, SNAP_CACHED_BLOCKS]
        normalize_min_max(rt.dim, n, True)
    elif code == StatefulScorer.LORA_AFFINITY:  # filled before routing (kernels/engine/lora.py)
        for k in range(n):
            rt.dim[k] = rt.lora_warm[k]
    else:
        _score_no_hit_lru(rt, r, cand, n)


@njit(cache=True, _nrt=False, error_model="numpy")
def is_known_scorer(code, table_size):
    """True for a scorer code :func:`score_dimension` implements (``table_size`` cfuncs)."""
    if code >= StatefulScorer.TABLE_BASE:
        return code < StatefulScorer.TABLE_BASE + table_size
    return StatefulScorer.PREFIX_AFFINITY <= code <= StatefulScorer.LORA_AFFINITY


# ---------------------------------------------------------------- what routing teaches them


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _lru_unlink(rt, i, node):
    """Take ``node`` out of instance ``i``'s prefix-affinity LRU list."""
    meta = rt.pa_meta
    p = rt.pa_prev[i, node]
    q = rt.pa_next[i, node]
    if p >= 0:
        rt.pa_next[i, p] = q
    else:
        meta[i, LruMeta.HEAD] = q
    if q >= 0:
        rt.pa_prev[i, q] = p
    else:
        meta[i, LruMeta.TAIL] = p


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _lru_new_node(rt, i, h):
    """A node for hash ``h``: a fresh one, or the least recent one evicted when full."""
    meta = rt.pa_meta
    if meta[i, LruMeta.LEN] >= rt.pa_hash.shape[1]:
        node = meta[i, LruMeta.TAIL]
        table_del(rt.pa_table, i, rt.pa_hash[i, node])
        p = rt.pa_prev[i, node]
        if p >= 0:
            rt.pa_next[i, p] = -1
        else:
            meta[i, LruMeta.HEAD] = -1
        meta[i, LruMeta.TAIL] = p
        meta[i, LruMeta.LEN] -= 1
    else:
        node = meta[i, LruMeta.NEXT_NODE]
        meta[i, LruMeta.NEXT_NODE] += 1
    rt.pa_hash[i, node] = h
    table_put(rt.pa_table, i, h, node)
    meta[i, LruMeta.LEN] += 1
    return node


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _record_prefix(rt, i, n_blocks):
    """Record the request's block hashes (``rt.hashes``) as most recently used on ``i``."""
    meta = rt.pa_meta
    for k in range(n_blocks):
        h = rt.hashes[k]
        node = table_get(rt.pa_table, i, h)
        if node >= 0:
            _lru_unlink(rt, i, node)
        else:
            node = _lru_new_node(rt, i, h)
        rt.pa_prev[i, node] = -1
        head = meta[i, LruMeta.HEAD]
        rt.pa_next[i, node] = head
        if head >= 0:
            rt.pa_prev[i, head] = node
        meta[i, LruMeta.HEAD] = node
        if meta[i, LruMeta.TAIL] < 0:
            meta[i, LruMeta.TAIL] = node


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _observe_no_hit(rt, r, target):
    """A cold request went to ``target``: it becomes the most recent in the no-hit LRU."""
    if rt.st[RouterVar.NH_LAST_WARM] == 1 or rt.st[RouterVar.NH_LAST_REQ] != r:
        return
    length = rt.st[RouterVar.NH_LEN]
    if rt.nh_set[target] == 1:
        pos = 0
        while rt.nh_order[pos] != target:
            pos += 1
        for k in range(pos, length - 1):
            rt.nh_order[k] = rt.nh_order[k + 1]
        length -= 1
    for k in range(length, 0, -1):
        rt.nh_order[k] = rt.nh_order[k - 1]
    rt.nh_order[0] = target
    rt.nh_set[target] = 1
    rt.st[RouterVar.NH_LEN] = length + 1


@njit(cache=True, _nrt=False, error_model="numpy")
def observe_routing(rt, kv, r, target, n_blocks):
    """After a weighted decision, the stateful scorers learn where request ``r`` went."""
    for s in range(rt.scorer_codes.shape[0]):
        c = rt.scorer_codes[s]
        if c == StatefulScorer.PREFIX_AFFINITY:
            chain_hashes(kv.chunk_dig, kv.chunk_off[r], n_blocks, rt.hashes)
            _record_prefix(rt, target, n_blocks)
        elif c == StatefulScorer.NO_HIT_LRU:
            _observe_no_hit(rt, r, target)
