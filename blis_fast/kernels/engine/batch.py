"""One instance's wait queue, its scheduling order, vLLM batch formation and preemption.

* The wait queue is an intrusive doubly linked list through ``RequestArrays.wq_prev/wq_next``
  with head, tail and length in ``InstanceArrays.wq[i, QueueField.*]``.
* :func:`order_wait_queue` recomputes the queued requests' priorities (CLU-4.1/4.2), the custom
  scheduler's keys, and stably sorts the queue for every scheduler but FCFS (CLU-4.4).
* :func:`form_batch` is the reference's vLLM batch formation (ENG-4.2..4.5 with DELTA-5):
  running requests first (chunked prefill, decode tokens, preemption of the newest running
  request when the KV cache is full), then new requests from the queue head.

Every function compiles without reference counting (preallocated arrays only).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from blis_fast.kernels.cluster import hooks as hk
from blis_fast.kernels.engine import lora as lk
from blis_fast.kernels.engine.state import ConfigSlot, HotField, InstanceCounter, QueueField
from blis_fast.kernels.enums import RequestState
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc
from blis_fast.kernels.prefetch import prefetch


class PriorityT(NamedTuple):
    """Priority policies: how a queued request's priority is recomputed each step (CLU-4.1/4.2)."""

    CONSTANT: int = 0
    SLO_BASED: int = 1
    INVERTED_SLO: int = 2


Priority = PriorityT()


class SchedulerT(NamedTuple):
    """Instance schedulers: the order of the wait queue (CLU-4.4)."""

    FCFS: int = 0
    PRIORITY_FCFS: int = 1
    SJF: int = 2
    REVERSE_PRIORITY: int = 3
    CUSTOM: int = 4  # the user's scheduler-key hook


Scheduler = SchedulerT()

LOOK_BATCH = 8  # batch formation prefetches the rows of the request this many places ahead

_HEAD, _TAIL, _LEN = QueueField.HEAD, QueueField.TAIL, QueueField.LEN


# ------------------------------------------------------------------ the wait queue


@njit(cache=True, _nrt=False, error_model="numpy")
def wq_push_back(ins, rs, i, r):
    """Append request ``r`` to instance ``i``'s wait queue."""
    tail = ins.wq[i, _TAIL]
    rs.wq_prev[r] = tail
    rs.wq_next[r] = -1
    if tail >= 0:
        rs.wq_next[tail] = r
    else:
        ins.wq[i, _HEAD] = r
    ins.wq[i, _TAIL] = r
    ins.wq[i, _LEN] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def wq_push_front(ins, rs, i, r):
    """Put request ``r`` at the head of instance ``i``'s wait queue (a preempted request)."""
    head = ins.wq[i, _HEAD]
    rs.wq_next[r] = head
    rs.wq_prev[r] = -1
    if head >= 0:
        rs.wq_prev[head] = r
    else:
        ins.wq[i, _TAIL] = r
    ins.wq[i, _HEAD] = r
    ins.wq[i, _LEN] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def wq_remove(ins, rs, i, r):
    """Unlink request ``r`` from instance ``i``'s wait queue."""
    p = rs.wq_prev[r]
    n = rs.wq_next[r]
    if p >= 0:
        rs.wq_next[p] = n
    else:
        ins.wq[i, _HEAD] = n
    if n >= 0:
        rs.wq_prev[n] = p
    else:
        ins.wq[i, _TAIL] = p
    rs.wq_prev[r] = -1
    rs.wq_next[r] = -1
    ins.wq[i, _LEN] -= 1


@njit(cache=True, _nrt=False, error_model="numpy")
def batch_remove(ins, i, r):
    """Take request ``r`` out of instance ``i``'s running batch (the others keep their order)."""
    keep = 0
    for q in range(ins.batch_len[i]):
        x = ins.batch[i, q]
        if x != r:
            ins.batch[i, keep] = x
            keep += 1
    ins.batch_len[i] = keep


# ------------------------------------------------------------------ scheduling order


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _sched_less(code, rs, inp, a, b):
    """Strict ordering of two queued requests for the non-FCFS schedulers (CLU-4.4)."""
    if code == Scheduler.SJF:
        if inp.input_len[a] != inp.input_len[b]:
            return inp.input_len[a] < inp.input_len[b]
    elif code == Scheduler.CUSTOM:
        if rs.sort_key[a] != rs.sort_key[b]:
            return rs.sort_key[a] < rs.sort_key[b]
    elif code == Scheduler.PRIORITY_FCFS:
        if rs.priority[a] != rs.priority[b]:
            return rs.priority[a] > rs.priority[b]
    else:
        if rs.priority[a] != rs.priority[b]:
            return rs.priority[a] < rs.priority[b]
    if inp.arrival[a] != inp.arrival[b]:
        return inp.arrival[a] < inp.arrival[b]
    return inp.id_rank[a] < inp.id_rank[b]


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _merge_pass(code, rs, inp, src, dst, n, width):
    """One bottom-up merge pass: runs of ``width`` in ``src`` merged pairwise into ``dst``."""
    lo = 0
    while lo < n:
        mid = min(lo + width, n)
        hi = min(lo + 2 * width, n)
        a = lo
        b = mid
        o = lo
        while a < mid and b < hi:
            if _sched_less(code, rs, inp, src[b], src[a]):
                dst[o] = src[b]
                b += 1
            else:
                dst[o] = src[a]
                a += 1
            o += 1
        while a < mid:
            dst[o] = src[a]
            a += 1
            o += 1
        while b < hi:
            dst[o] = src[b]
            b += 1
            o += 1
        lo += 2 * width


@njit(cache=True, _nrt=False, error_model="numpy")
def _sort_queue(code, ins, rs, inp, i, buf, tmp):
    """Stable-sort instance ``i``'s wait queue in place with the scheduler's key."""
    n = ins.wq[i, _LEN]
    if n < 2:
        return
    r = ins.wq[i, _HEAD]
    k = 0
    while r >= 0:
        buf[k] = r
        k += 1
        r = rs.wq_next[r]
    width = 1
    src = buf
    dst = tmp
    while width < n:
        _merge_pass(code, rs, inp, src, dst, n, width)
        t = src
        src = dst
        dst = t
        width *= 2
    prev = -1
    for k in range(n):
        q = src[k]
        rs.wq_prev[q] = prev
        if prev >= 0:
            rs.wq_next[prev] = q
        else:
            ins.wq[i, _HEAD] = q
        prev = q
    rs.wq_next[prev] = -1
    ins.wq[i, _TAIL] = prev


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _recompute_priorities(code, ins, rs, inp, i, now):
    """The priority policy's value for every queued request (CLU-4.1/4.2); the constant policy
    keeps every priority at 0.0, so there is nothing to do."""
    if code == Priority.CONSTANT:
        return
    r = ins.wq[i, _HEAD]
    while r >= 0:
        age = np.float64(now - inp.arrival[r])
        if code == Priority.SLO_BASED:
            rs.priority[r] = 0.0 + 1e-6 * age
        else:
            rs.priority[r] = 0.0 - 1e-6 * age
        r = rs.wq_next[r]


@njit(cache=True, _nrt=False, error_model="numpy")
def _compute_sort_keys(ins, rs, inp, i, now, key_fn, features, slo_priority):
    """The custom scheduler's key of every queued request (the user's hook, ``hooks.py``)."""
    r = ins.wq[i, _HEAD]
    while r >= 0:
        features[hk.KEY_INPUT_LEN] = inp.input_len[r]
        features[hk.KEY_ARRIVAL] = inp.arrival[r]
        features[hk.KEY_WAIT] = now - inp.arrival[r]
        features[hk.KEY_PRIORITY] = rs.priority[r]
        features[hk.KEY_SLO_PRIORITY] = slo_priority[r]
        features[hk.KEY_MAX_OUTPUT] = rs.max_out[r]
        rs.sort_key[r] = key_fn(features)
        r = rs.wq_next[r]


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def order_wait_queue(ints, ins, rs, inp, i, now, work, key_fn, slo_priority):
    """scheduleBatch's first half: priorities, then the scheduler's order of the queue."""
    _recompute_priorities(ints[ConfigSlot.PRIORITY], ins, rs, inp, i, now)
    code = ints[ConfigSlot.SCHEDULER]
    if code == Scheduler.CUSTOM:
        _compute_sort_keys(ins, rs, inp, i, now, key_fn, work.key_features, slo_priority)
    if code != Scheduler.FCFS:
        _sort_queue(code, ins, rs, inp, i, work.queue_a, work.queue_b)


# ------------------------------------------------------------------ preemption


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _reset_runs(rs, r):
    """Forget request ``r``'s ITL runs (a preempted request starts its samples again)."""
    rs.run_head[r] = -1
    rs.hot[r, HotField.RUN_TAIL] = -1
    rs.hot[r, HotField.LAST_DECODE] = -1


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _preempt(ins, rs, kv, i, victim):
    """Move ``victim`` from the running batch's tail back to the queue head, progress reset and
    blocks released, and count the preemption on the instance and the request; returns the
    tokens it had been granted this step."""
    ins.cnt[i, InstanceCounter.PREEMPTIONS] += 1
    rs.preemptions[victim] += 1
    granted = rs.hot[victim, HotField.NEW_TOKENS]
    if granted > 0:
        rs.hot[victim, HotField.NEW_TOKENS] = 0
    rs.state[victim] = RequestState.QUEUED
    rs.hot[victim, HotField.PROGRESS] = 0
    rs.hot[victim, HotField.ITL_SUM] = 0
    rs.hot[victim, HotField.ITL_COUNT] = 0
    _reset_runs(rs, victim)
    rs.hot[victim, HotField.TTFT_SET] = 0
    kvc.release(kv, i, victim)
    rs.hot[victim, HotField.COMPUTED] = 0
    wq_push_front(ins, rs, i, victim)
    return max(granted, np.int64(0))


@njit(cache=True, _nrt=False, error_model="numpy")
def _preempt_for_tokens(ins, rs, kv, i, r, n, input_len, budget, work):
    """preemptForTokens (ENG-4.4 + DELTA-5): allocate ``n`` tokens for running request ``r``,
    preempting the newest running requests while the cache is full.
    Returns (ok, budget, preempted_any)."""
    preempted = False
    while True:
        pi = rs.hot[r, HotField.PROGRESS]
        if kvc.allocate(kv, i, r, pi, pi + n, pi < input_len[r], input_len[r], work.cached,
                        np.int64(0), work.scratch, work.chain):
            return True, budget, preempted
        blen = ins.batch_len[i]
        if blen == 0:
            return False, budget, preempted
        preempted = True
        victim = ins.batch[i, blen - 1]
        ins.batch_len[i] = blen - 1
        budget += _preempt(ins, rs, kv, i, victim)
        if victim == r:
            return False, budget, preempted


# ------------------------------------------------------------------ batch formation


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _prefetch_rows(rs, inp, kv, r):
    """Ask for the rows batch formation and the step read of request ``r``."""
    prefetch(rs.hot, r)
    prefetch(inp.input_len, r)
    prefetch(inp.output_len, r)
    prefetch(kv.req, r)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _schedule_running(ints, max_len, ins, rs, kv, inp, i, work, budget):
    """Grant tokens to the running requests in batch order (ENG-4.2..4.4): a prefill chunk or
    a decode token each, preempting when the cache is full. Returns (budget, preempted_any)."""
    threshold = ints[ConfigSlot.LONG_PREFILL]
    input_len = inp.input_len
    preemption = False
    q = 0
    while q < ins.batch_len[i]:
        if budget <= 0:
            break
        r = ins.batch[i, q]
        if q + LOOK_BATCH < ins.batch_len[i]:  # this step's loops read these rows
            _prefetch_rows(rs, inp, kv, ins.batch[i, q + LOOK_BATCH])
        pi = rs.hot[r, HotField.PROGRESS]
        n = input_len[r] - pi
        if n > 0:
            if 0 < threshold and threshold < n:
                n = threshold
            n = min(n, budget)
            if max_len > 0:
                n = min(n, max(max_len - 1 - pi, 0))
            ok, budget, pre = _preempt_for_tokens(ins, rs, kv, i, r, n, input_len, budget, work)
            preemption = preemption or pre
            if not ok:
                break
            budget -= n
            rs.hot[r, HotField.NEW_TOKENS] = n
            rs.hot[r, HotField.COMPUTED] += n
        pi = rs.hot[r, HotField.PROGRESS]
        if pi >= input_len[r] and inp.output_len[r] > 0:
            if not (max_len > 0 and pi + 1 > max_len - 1):
                if not kvc.append_decode_token_fast(kv, i, r, pi):
                    ok, budget, pre = _preempt_for_tokens(ins, rs, kv, i, r, np.int64(1),
                                                          input_len, budget, work)
                    preemption = preemption or pre
                    if not ok:
                        break
                budget -= 1
                rs.hot[r, HotField.NEW_TOKENS] = 1
                rs.hot[r, HotField.COMPUTED] += 1
        q += 1
    return budget, preemption


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _admit_waiting(ints, max_len, ins, rs, kv, inp, i, work, budget, lora):
    """Move requests from the queue head into the running batch while the batch, the token
    budget and the cache allow (ENG-4.5), recording each one's cached prefix (the leading
    prompt tokens the prefix cache held, ``RequestArrays.cached_prefix``); with LoRA, a request
    whose adapter is not resident stops it (the cold-load gate, LORA-4.5). With the KV tier
    chain's secondary tiers (``work.chain``), a request awaiting a fetch is skipped and stays
    queued, and requests behind it may be admitted (KVO-7.3). Returns how many; their rows
    are in ``work.queue_a``."""
    threshold = ints[ConfigSlot.LONG_PREFILL]
    bs = kv.cfg[kvc.KVConfig.BLOCK_SIZE]
    n_admitted = 0
    skipped = 0  # deferred requests passed over this step (never without the chain)
    while (ins.batch_len[i] < ints[ConfigSlot.MAX_RUNNING] and ins.wq[i, _LEN] > skipped
           and budget > 0):
        nxt = kvc.queue_at(work.chain, rs.wq_next, ins.wq[i, _HEAD], skipped)
        if kvc.is_deferred(work.chain, nxt):
            skipped += 1
            continue
        if lora is not None and lk.is_cold(lora, inp, rs, i, nxt):
            break
        if rs.pd_sub[nxt] == 1:  # a P/D decode sub-request: one token at its progress
            pi = rs.hot[nxt, HotField.PROGRESS]
            if not kvc.allocate(kv, i, nxt, pi, pi + 1, pi < inp.input_len[nxt],
                                inp.input_len[nxt], work.cached, np.int64(0), work.scratch,
                                work.chain):
                break
            budget -= 1
            _admit(ins, rs, i, nxt, work, n_admitted, 1, pi + 1)
            n_admitted += 1
            continue
        n_cached = kvc.cached_blocks(kv, i, nxt, inp.input_len[nxt], work.cached)
        start = n_cached * bs
        n = inp.input_len[nxt] - start
        if 0 < threshold and threshold < n:
            n = threshold
        n = min(n, budget)
        if max_len > 0:
            n = min(n, max(max_len - 1 - start, 0))
        if not kvc.allocate(kv, i, nxt, start, start + n, np.int64(1) > 0, inp.input_len[nxt],
                            work.cached, n_cached, work.scratch, work.chain):
            if kvc.is_deferred(work.chain, nxt):  # deferred now: skipped (KVO-7.3)
                skipped += 1
                continue
            break
        budget -= n
        rs.cached_prefix[nxt] = start  # the prompt tokens this admission's prefill skips
        _admit(ins, rs, i, nxt, work, n_admitted, n, n + start)
        n_admitted += 1
    return n_admitted


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _admit(ins, rs, i, r, work, k, new_tokens, computed):
    """Move queue head ``r`` into the running batch as the step's ``k``-th admission."""
    wq_remove(ins, rs, i, r)
    ins.batch[i, ins.batch_len[i]] = r
    ins.batch_len[i] += 1
    rs.sched_step[r] = ins.cnt[i, InstanceCounter.STEPS]
    work.queue_a[k] = r
    rs.state[r] = RequestState.RUNNING
    rs.hot[r, HotField.NEW_TOKENS] = new_tokens
    rs.hot[r, HotField.COMPUTED] = computed


@njit(cache=True, _nrt=False, error_model="numpy")
def form_batch(ints, max_len, ins, rs, kv, inp, i, work, lora):
    """vLLM batch formation (ENG-4.2..4.5) on instance ``i`` (max model length ``max_len``, 0 =
    unlimited). Returns the number of newly admitted requests (listed in ``work.queue_a``).
    Every running request's NumNewTokens is 0 here: the previous step's progress pass reset it.
    A step that preempted admits nobody. ``lora``: the LoRA state (None without LoRA)."""
    budget, preempted = _schedule_running(ints, max_len, ins, rs, kv, inp, i, work,
                                          ints[ConfigSlot.MAX_TOKENS])
    kvc.poll_deferred(work.chain, kv, rs, i)  # PollDeferred (KVO-7.3; the chain only)
    if preempted:
        return 0
    return _admit_waiting(ints, max_len, ins, rs, kv, inp, i, work, budget, lora)
