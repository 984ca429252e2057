"""The simulation kernel: the reference's cluster loop over N vLLM-style instances.

One call of :func:`simulate` runs a whole simulation. All state is in arrays (see
``blis_fast/engine/simulate.py`` for how they are built and read back):

* ``rs``  per-request mutable state (:data:`ReqState`)
* ``ins`` per-instance state and counters (:data:`InstState`)
* ``kv``  the KV caches (:mod:`blis_fast.kernels.kvcache`)
* ``lg``  growable per-step logs (:data:`StepLog`) and the ITL run pool

Rules implemented: CLU-1 (event loop, arrival -> admission -> routing -> injection),
ENG-1..ENG-5 and ENG-7 with the adopted upstream fixes DELTA-1..8 and DELTA-13.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from blis_fast.kernels import hooks as hk
from blis_fast.kernels import kvcache as kvc
from blis_fast.kernels import routing as rtk
from blis_fast.kernels.enums import (
    Event,
    EventPriority,
    Priority,
    Registration,
    RequestState,
    Scheduler,
    SessionOutcome,
    Status,
)
from blis_fast.kernels.heap import (
    MAX_EVENT_SEQ,
    MAX_INSTANCES,
    heap_pop,
    heap_push,
    make_tie,
    tie_instance,
    tie_is_instance,
)
from blis_fast.kernels.latency import is_known_backend, queueing_time, step_time
from blis_fast.kernels.prefetch import prefetch

# integer config slots
(IC_N_INST, IC_HORIZON, IC_MAX_RUNNING, IC_MAX_TOKENS, IC_LONG_PREFILL, IC_MAX_MODEL_LEN,
 IC_ADM_LATENCY, IC_ROUTE_LATENCY, IC_ADMISSION, IC_ROUTING, IC_PRIORITY, IC_SCHEDULER,
 IC_LATENCY_CODE, IC_OUTPUT_TOKEN_TIME, IC_POST_DECODE, IC_SIZE) = range(16)

# per-instance counters (columns of ins.cnt)
(K_COMPLETED, K_DROPPED, K_TIMED_OUT, K_LENGTH_CAPPED, K_IN_TOKENS, K_OUT_TOKENS,
 K_PREEMPTIONS, K_KV_FAIL, K_INFLIGHT, K_PEAK_KV, K_STEPS, K_CLOCK, K_LAST_STEP,
 K_STEP_PENDING, K_DONE_IN_STEP, K_SIZE) = range(16)

# the last sequence number the loop hands out: room for the pushes of one event after the check
SEQ_LIMIT = MAX_EVENT_SEQ - (1 << 20)
# heap/loop state kept between calls (``hs``): heap size, next sequence number, closed-loop
# session outcomes recorded since the caller last drained them, and the earliest tick at which
# one of them could bring a follow-up arrival (the loop stops before reaching it)
HS_SIZE, HS_SEQ, HS_PEND, HS_TMIN, HS_LEN = range(5)
# columns of the session-outcome buffer: row, tick, outcome, progress index, reserved sequence
SP_ROW, SP_TICK, SP_OUTCOME, SP_PI, SP_SEQ, SP_COLS = range(6)
NO_TICK = np.int64(2**63 - 1)
LOOK_BATCH = 8  # batch formation prefetches the rows of the request this many places ahead

ReqState = namedtuple("ReqState", [
    # int64 [n, 8]: the fields every step touches, one cache line per request (H_* columns)
    "hot",
    "state", "inst", "first_token", "ttft", "has_ttft", "sched_delay", "has_sched",
    "sched_step", "fin_step", "capped", "priority", "max_out", "e2e", "registered",
    "wq_prev", "wq_next", "run_head",
    "sort_key",  # float64: the custom scheduler's key, computed each step
])
# columns of ReqState.hot: progress index, tokens granted this step, computed tokens (KV
# present), ITL sum and count of the current attempt, last ITL run, last decode step, TTFT set
H_PI, H_NNT, H_COMP, H_ITLSUM, H_ITLCNT, H_RUNTAIL, H_LASTDEC, H_TTFTSET = range(8)

InstState = namedtuple("InstState", [
    "cnt",  # int64 [N, K_SIZE]
    "kv_integral",  # float64 [N] time integral of used blocks
    "wq",  # int64 [N, 3] head, tail, length
    "batch",  # int32 [N, max_running] running batch
    "batch_len",  # int64 [N]
    "wq_sum",  # int64 [N, 2] sum and count of per-step wait-queue lengths
    "rejected",  # int64 [2] admission rejections, routing rejections
    "rr",  # int64 [1] round-robin counter
])

StepLog = namedtuple("StepLog", [
    "time", "inst", "dur", "next_same", "queue", "running", "kv_used", "itl_count",
    "run_start", "run_last", "run_next", "sizes",  # [steps used, runs used, loop entries]
])
# While the kernel runs, itl_count holds marks: +1 at a completed run's first step and
# +ITL_RUN_END at its last; _itl_counts_from_marks turns them into per-step counts at the end.
ITL_RUN_END = 1 << 32


def new_req_state(n: int, max_output_len: np.ndarray) -> ReqState:
    """Fresh per-request state arrays."""
    hot = np.zeros((n, 8), np.int64)
    hot[:, H_RUNTAIL] = -1
    hot[:, H_LASTDEC] = -1
    return ReqState(
        hot=hot, state=np.zeros(n, np.int8), inst=np.full(n, -1, np.int32),
        first_token=np.zeros(n, np.int64), ttft=np.zeros(n, np.int64),
        has_ttft=np.zeros(n, np.int8), sched_delay=np.zeros(n, np.int64),
        has_sched=np.zeros(n, np.int8), sched_step=np.zeros(n, np.int64),
        fin_step=np.zeros(n, np.int64), capped=np.zeros(n, np.int8),
        priority=np.zeros(n, np.float64), max_out=max_output_len.astype(np.int64).copy(),
        e2e=np.zeros(n, np.int64), registered=np.zeros(n, np.int8),
        wq_prev=np.full(n, -1, np.int64), wq_next=np.full(n, -1, np.int64),
        run_head=np.full(n, -1, np.int64), sort_key=np.zeros(n, np.float64),
    )


def new_inst_state(n_inst: int, max_batch: int) -> InstState:
    """Fresh per-instance state arrays."""
    cnt = np.zeros((n_inst, K_SIZE), np.int64)
    cnt[:, K_LAST_STEP] = -1
    wq = np.zeros((n_inst, 3), np.int64)
    wq[:, 0] = -1
    wq[:, 1] = -1
    return InstState(cnt=cnt, kv_integral=np.zeros(n_inst, np.float64), wq=wq,
                     batch=np.zeros((n_inst, max_batch), np.int64),
                     batch_len=np.zeros(n_inst, np.int64), wq_sum=np.zeros((n_inst, 2), np.int64),
                     rejected=np.zeros(2, np.int64), rr=np.zeros(1, np.int64))


def new_step_log(step_cap: int, run_cap: int) -> StepLog:
    """Step log and ITL run pool with the given initial capacities."""
    return StepLog(
        time=np.zeros(step_cap, np.int64), inst=np.zeros(step_cap, np.int32),
        dur=np.zeros(step_cap, np.int64), next_same=np.full(step_cap, -1, np.int64),
        queue=np.zeros(step_cap, np.int32), running=np.zeros(step_cap, np.int32),
        kv_used=np.zeros(step_cap, np.int64), itl_count=np.zeros(step_cap, np.int64),
        run_start=np.zeros(run_cap, np.int64), run_last=np.zeros(run_cap, np.int64),
        run_next=np.full(run_cap, -1, np.int64), sizes=np.zeros(3, np.int64),
    )


@njit(cache=True)
def _grow_log(lg, need_steps, need_runs):
    steps = lg.sizes[0]
    runs = lg.sizes[1]
    cap_s = lg.time.shape[0]
    cap_r = lg.run_start.shape[0]
    if steps + need_steps <= cap_s and runs + need_runs <= cap_r:
        return lg
    ns = cap_s
    while steps + need_steps > ns:
        ns *= 2
    nr = cap_r
    while runs + need_runs > nr:
        nr *= 2
    time = np.zeros(ns, np.int64)
    inst = np.zeros(ns, np.int32)
    dur = np.zeros(ns, np.int64)
    next_same = np.full(ns, -1, np.int64)
    queue = np.zeros(ns, np.int32)
    running = np.zeros(ns, np.int32)
    kv_used = np.zeros(ns, np.int64)
    itl_count = np.zeros(ns, np.int64)
    time[:steps] = lg.time[:steps]
    inst[:steps] = lg.inst[:steps]
    dur[:steps] = lg.dur[:steps]
    next_same[:steps] = lg.next_same[:steps]
    queue[:steps] = lg.queue[:steps]
    running[:steps] = lg.running[:steps]
    kv_used[:steps] = lg.kv_used[:steps]
    itl_count[:steps] = lg.itl_count[:steps]
    run_start = np.zeros(nr, np.int64)
    run_last = np.zeros(nr, np.int64)
    run_next = np.full(nr, -1, np.int64)
    run_start[:runs] = lg.run_start[:runs]
    run_last[:runs] = lg.run_last[:runs]
    run_next[:runs] = lg.run_next[:runs]
    return StepLog(time, inst, dur, next_same, queue, running, kv_used, itl_count,
                   run_start, run_last, run_next, lg.sizes)


# ------------------------------------------------------------------ wait queue (linked list)


@njit(cache=True, _nrt=False, error_model="numpy")
def _wq_push_back(ins, rs, i, r):
    tail = ins.wq[i, 1]
    rs.wq_prev[r] = tail
    rs.wq_next[r] = -1
    if tail >= 0:
        rs.wq_next[tail] = r
    else:
        ins.wq[i, 0] = r
    ins.wq[i, 1] = r
    ins.wq[i, 2] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _wq_push_front(ins, rs, i, r):
    head = ins.wq[i, 0]
    rs.wq_next[r] = head
    rs.wq_prev[r] = -1
    if head >= 0:
        rs.wq_prev[head] = r
    else:
        ins.wq[i, 1] = r
    ins.wq[i, 0] = r
    ins.wq[i, 2] += 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _wq_remove(ins, rs, i, r):
    p = rs.wq_prev[r]
    n = rs.wq_next[r]
    if p >= 0:
        rs.wq_next[p] = n
    else:
        ins.wq[i, 0] = n
    if n >= 0:
        rs.wq_prev[n] = p
    else:
        ins.wq[i, 1] = p
    rs.wq_prev[r] = -1
    rs.wq_next[r] = -1
    ins.wq[i, 2] -= 1


@njit(cache=True, _nrt=False, error_model="numpy")
def _sched_less(code, rs, arrival, input_len, id_rank, a, b):
    """Strict ordering of two queued requests for the non-FCFS schedulers (CLU-4.4)."""
    if code == Scheduler.SJF:
        if input_len[a] != input_len[b]:
            return input_len[a] < input_len[b]
    elif code == Scheduler.CUSTOM:
        if rs.sort_key[a] != rs.sort_key[b]:
            return rs.sort_key[a] < rs.sort_key[b]
    elif code == Scheduler.PRIORITY_FCFS:
        if rs.priority[a] != rs.priority[b]:
            return rs.priority[a] > rs.priority[b]
    else:
        if rs.priority[a] != rs.priority[b]:
            return rs.priority[a] < rs.priority[b]
    if arrival[a] != arrival[b]:
        return arrival[a] < arrival[b]
    return id_rank[a] < id_rank[b]


@njit(cache=True, _nrt=False, error_model="numpy")
def _reorder_queue(code, ins, rs, i, arrival, input_len, id_rank, buf, tmp):
    """Stable-sort instance ``i``'s wait queue in place with the scheduler's key."""
    n = ins.wq[i, 2]
    if n < 2:
        return
    r = ins.wq[i, 0]
    k = 0
    while r >= 0:
        buf[k] = r
        k += 1
        r = rs.wq_next[r]
    # bottom-up merge sort (stable)
    width = 1
    src = buf
    dst = tmp
    while width < n:
        lo = 0
        while lo < n:
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            a = lo
            b = mid
            o = lo
            while a < mid and b < hi:
                if _sched_less(code, rs, arrival, input_len, id_rank, src[b], src[a]):
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
            ins.wq[i, 0] = q
        prev = q
    rs.wq_next[prev] = -1
    ins.wq[i, 1] = prev


# ------------------------------------------------------------------ completion bookkeeping


@njit(cache=True, _nrt=False, error_model="numpy")
def _count_done(ins, i, column):
    """Bump a terminal counter and the cluster's in-flight count for the instance (CLU-3.5)."""
    ins.cnt[i, column] += 1
    ins.cnt[i, K_INFLIGHT] -= 1
    if ins.cnt[i, K_INFLIGHT] < 0:
        ins.cnt[i, K_INFLIGHT] = 0


@njit(cache=True, _nrt=False, error_model="numpy")
def _record_completion(ins, rs, lg, i, r, input_len, output_len, post_decode):
    """recordRequestCompletion with DELTA-6/7: output tokens counted at completion."""
    _count_done(ins, i, np.int64(K_COMPLETED))
    k = rs.hot[r, H_PI] - input_len[r]
    if k < output_len[r]:
        k += 1
    if k > 0:
        ins.cnt[i, K_OUT_TOKENS] += k
    post = post_decode if output_len[r] > 0 else 0
    rs.e2e[r] = rs.first_token[r] + rs.hot[r, H_ITLSUM] + post
    # the request's ITL samples (its final attempt) join AllITLs: mark each run's ends
    run = rs.run_head[r]
    tail = rs.hot[r, H_RUNTAIL]
    while run >= 0:
        lg.itl_count[lg.run_start[run]] += 1
        lg.itl_count[rs.hot[r, H_LASTDEC] if run == tail else lg.run_last[run]] += ITL_RUN_END
        run = lg.run_next[run]


@njit(cache=True, _nrt=False, error_model="numpy")
def _itl_counts_from_marks(lg, open_runs):
    """Turn the run marks in ``lg.itl_count`` into per-step ITL sample counts (one pass);
    ``open_runs`` (zeros, one per instance) holds each instance's count of runs in progress."""
    for s in range(lg.sizes[0]):
        i = lg.inst[s]
        v = lg.itl_count[s]
        now = open_runs[i] + (v & (ITL_RUN_END - 1))
        lg.itl_count[s] = now
        open_runs[i] = now - (v >> 32)


@njit(cache=True, _nrt=False, error_model="numpy")
def _reset_runs(rs, r):
    rs.run_head[r] = -1
    rs.hot[r, H_RUNTAIL] = -1
    rs.hot[r, H_LASTDEC] = -1


@njit(cache=True, _nrt=False, error_model="numpy")
def _session_outcome(sess_pend, hs, r, tick, outcome, pi, seq, think):
    """Record a closed-loop session request's terminal outcome for the session driver.

    A completion may bring a follow-up arriving at ``tick + think`` at the earliest; ``seq`` is
    the sequence number its arrival event takes (the reference pushes it right away).
    """
    k = hs[HS_PEND]
    sess_pend[k, SP_ROW] = r
    sess_pend[k, SP_TICK] = tick
    sess_pend[k, SP_OUTCOME] = outcome
    sess_pend[k, SP_PI] = pi
    sess_pend[k, SP_SEQ] = seq
    hs[HS_PEND] = k + 1
    if outcome == SessionOutcome.COMPLETED and tick + think < hs[HS_TMIN]:
        hs[HS_TMIN] = tick + think


# ------------------------------------------------------------------ batch formation


@njit(cache=True, _nrt=False, error_model="numpy")
def _preempt_for_tokens(ins, rs, kv, i, r, n, input_len, budget, cached_buf, scratch):
    """preemptForTokens (ENG-4.4 + DELTA-5). Returns (ok, budget, preempted_any)."""
    preempted = False
    while True:
        in_prefill = rs.hot[r, H_PI] < input_len[r]
        if kvc.allocate(kv, i, r, rs.hot[r, H_PI], rs.hot[r, H_PI] + n, in_prefill, input_len[r],
                        cached_buf, np.int64(0), scratch):
            return True, budget, preempted
        blen = ins.batch_len[i]
        if blen == 0:
            return False, budget, preempted
        preempted = True
        victim = ins.batch[i, blen - 1]
        ins.batch_len[i] = blen - 1
        ins.cnt[i, K_PREEMPTIONS] += 1
        if rs.hot[victim, H_NNT] > 0:
            budget += rs.hot[victim, H_NNT]
            rs.hot[victim, H_NNT] = 0
        rs.state[victim] = RequestState.QUEUED
        rs.hot[victim, H_PI] = 0
        rs.hot[victim, H_ITLSUM] = 0
        rs.hot[victim, H_ITLCNT] = 0
        _reset_runs(rs, victim)
        rs.hot[victim, H_TTFTSET] = 0
        kvc.release(kv, i, victim)
        rs.hot[victim, H_COMP] = 0
        _wq_push_front(ins, rs, i, victim)
        if victim == r:
            return False, budget, preempted


@njit(cache=True, _nrt=False, error_model="numpy")
def _form_batch(ic, ins, rs, kv, i, now, input_len, output_len, cached_buf, scratch, admitted):
    """vLLM batch formation (ENG-4.2..4.5). Returns the number of newly admitted requests."""
    budget = ic[IC_MAX_TOKENS]
    threshold = ic[IC_LONG_PREFILL]
    max_len = ic[IC_MAX_MODEL_LEN]
    # every running request's NumNewTokens is 0 here: the previous step's progress pass reset it
    preemption = False
    q = 0
    while q < ins.batch_len[i]:
        if budget <= 0:
            break
        r = ins.batch[i, q]
        if q + LOOK_BATCH < ins.batch_len[i]:  # this step's loops read these rows
            ahead = ins.batch[i, q + LOOK_BATCH]
            prefetch(rs.hot, ahead)
            prefetch(input_len, ahead)
            prefetch(output_len, ahead)
            prefetch(kv.req, ahead)
        n = input_len[r] - rs.hot[r, H_PI]
        if n > 0:
            if 0 < threshold and threshold < n:
                n = threshold
            n = min(n, budget)
            if max_len > 0:
                n = min(n, max(max_len - 1 - rs.hot[r, H_PI], 0))
            ok, budget, pre = _preempt_for_tokens(ins, rs, kv, i, r, n, input_len, budget,
                                                  cached_buf, scratch)
            preemption = preemption or pre
            if not ok:
                break
            budget -= n
            rs.hot[r, H_NNT] = n
            rs.hot[r, H_COMP] += n
        if rs.hot[r, H_PI] >= input_len[r] and output_len[r] > 0:
            if not (max_len > 0 and rs.hot[r, H_PI] + 1 > max_len - 1):
                if not kvc.append_decode_token_fast(kv, i, r, rs.hot[r, H_PI]):
                    ok, budget, pre = _preempt_for_tokens(ins, rs, kv, i, r, np.int64(1),
                                                          input_len, budget, cached_buf, scratch)
                    preemption = preemption or pre
                    if not ok:
                        break
                budget -= 1
                rs.hot[r, H_NNT] = 1
                rs.hot[r, H_COMP] += 1
        q += 1
    n_admitted = 0
    if preemption:
        return n_admitted
    bs = kv.cfg[kvc.CFG_BS]
    while ins.batch_len[i] < ic[IC_MAX_RUNNING] and ins.wq[i, 2] > 0 and budget > 0:
        nxt = ins.wq[i, 0]
        n_cached = kvc.cached_blocks(kv, i, nxt, input_len[nxt], cached_buf)
        start = n_cached * bs
        n = input_len[nxt] - start
        if 0 < threshold and threshold < n:
            n = threshold
        n = min(n, budget)
        if max_len > 0:
            n = min(n, max(max_len - 1 - start, 0))
        if not kvc.allocate(kv, i, nxt, start, start + n, np.int64(1) > 0, input_len[nxt],
                            cached_buf, n_cached, scratch):
            break
        _wq_remove(ins, rs, i, nxt)
        ins.batch[i, ins.batch_len[i]] = nxt
        ins.batch_len[i] += 1
        rs.sched_step[nxt] = ins.cnt[i, K_STEPS]
        admitted[n_admitted] = nxt
        n_admitted += 1
        budget -= n
        rs.state[nxt] = RequestState.RUNNING
        rs.hot[nxt, H_NNT] = n
        rs.hot[nxt, H_COMP] = n + start
    return n_admitted


# ------------------------------------------------------------------ the step


@njit(cache=True, _nrt=False, error_model="numpy")
def _step(ic, lat_params, alpha, ins, rs, kv, lg, i, now, arrival, input_len, output_len,
          id_rank, buf_a, buf_b, cached_buf, scratch, gather, key_fn, key_vec, slo_priority):
    """One engine iteration at ``now`` (ENG-2 with DELTA-2/3/4/5/6). Returns the duration, or
    -1 when the step was a no-op (idle instance)."""
    if ins.batch_len[i] == 0 and ins.wq[i, 2] == 0:
        ins.cnt[i, K_STEP_PENDING] = 0
        return np.int64(-1)
    # ---- scheduleBatch
    ins.cnt[i, K_STEPS] += 1
    pcode = ic[IC_PRIORITY]
    if pcode != Priority.CONSTANT:
        r = ins.wq[i, 0]
        while r >= 0:
            age = np.float64(now - arrival[r])
            if pcode == Priority.SLO_BASED:
                rs.priority[r] = 0.0 + 1e-6 * age
            else:
                rs.priority[r] = 0.0 - 1e-6 * age
            r = rs.wq_next[r]
    # constant policy: every priority stays 0.0, nothing to recompute
    scode = ic[IC_SCHEDULER]
    if scode == Scheduler.CUSTOM:
        r = ins.wq[i, 0]
        while r >= 0:
            key_vec[hk.KEY_INPUT_LEN] = input_len[r]
            key_vec[hk.KEY_ARRIVAL] = arrival[r]
            key_vec[hk.KEY_WAIT] = now - arrival[r]
            key_vec[hk.KEY_PRIORITY] = rs.priority[r]
            key_vec[hk.KEY_SLO_PRIORITY] = slo_priority[r]
            key_vec[hk.KEY_MAX_OUTPUT] = rs.max_out[r]
            rs.sort_key[r] = key_fn(key_vec)
            r = rs.wq_next[r]
    if scode != Scheduler.FCFS:
        _reorder_queue(scode, ins, rs, i, arrival, input_len, id_rank, buf_a, buf_b)
    n_adm = _form_batch(ic, ins, rs, kv, i, now, input_len, output_len, cached_buf, scratch,
                        buf_a)
    for k in range(n_adm):
        r = buf_a[k]
        rs.sched_delay[r] = now - arrival[r]
        rs.has_sched[r] = 1
    # step log entry
    s = lg.sizes[0]
    lg.sizes[0] = s + 1
    lg.time[s] = now
    lg.inst[s] = i
    lg.queue[s] = ins.wq[i, 2]
    lg.running[s] = ins.batch_len[i]
    prev_step = ins.cnt[i, K_LAST_STEP]
    if prev_step >= 0:
        lg.next_same[prev_step] = s
    ins.cnt[i, K_LAST_STEP] = s
    ins.wq_sum[i, 0] += ins.wq[i, 2]
    ins.wq_sum[i, 1] += 1
    # ---- executeBatchStep
    blen = ins.batch_len[i]
    g = 0
    for q in range(blen):
        r = ins.batch[i, q]
        if rs.hot[r, H_NNT] > 0:
            gather[0, g] = rs.hot[r, H_PI]
            gather[1, g] = rs.hot[r, H_NNT]
            gather[2, g] = input_len[r]
            gather[3, g] = output_len[r]
            g += 1
    d = step_time(ic[IC_LATENCY_CODE], lat_params, g, gather[0], gather[1], gather[2],
                  gather[3])
    d += kvc.consume_pending_transfer(kv, i)
    d = max(np.int64(1), d)
    lg.dur[s] = d
    otp = ic[IC_OUTPUT_TOKEN_TIME]
    max_len = ic[IC_MAX_MODEL_LEN]
    n_done = 0
    for q in range(blen):
        r = ins.batch[i, q]
        if rs.hot[r, H_PI] < input_len[r]:
            rs.hot[r, H_PI] = rs.hot[r, H_COMP]
        elif rs.hot[r, H_NNT] > 0:
            rs.hot[r, H_PI] += 1
            rs.hot[r, H_ITLSUM] += d + otp
            rs.hot[r, H_ITLCNT] += 1
            tail = rs.hot[r, H_RUNTAIL]
            if tail < 0 or rs.hot[r, H_LASTDEC] != prev_step:  # else the run goes on
                run = lg.sizes[1]
                lg.sizes[1] = run + 1
                lg.run_start[run] = s
                lg.run_next[run] = -1
                if tail >= 0:
                    lg.run_last[tail] = rs.hot[r, H_LASTDEC]
                    lg.run_next[tail] = run
                else:
                    rs.run_head[r] = run
                rs.hot[r, H_RUNTAIL] = run
            rs.hot[r, H_LASTDEC] = s
        pi = rs.hot[r, H_PI]
        if pi == input_len[r] and rs.hot[r, H_TTFTSET] == 0:
            rs.hot[r, H_TTFTSET] = 1
            rs.first_token[r] = now + d + otp - arrival[r]
            rs.ttft[r] = rs.first_token[r]
            rs.has_ttft[r] = 1
        # NumNewTokens is read again only by the next formation, which expects it reset
        rs.hot[r, H_NNT] = 0
        # count the requests processCompletions will finish, so steps without any skip it
        if pi >= input_len[r] + max(output_len[r], 1) - 1 or (max_len > 0 and pi >= max_len - 1):
            n_done += 1
    ins.cnt[i, K_DONE_IN_STEP] = n_done
    used = kvc.used_blocks(kv, i)
    lg.kv_used[s] = used
    if used > ins.cnt[i, K_PEAK_KV]:
        ins.cnt[i, K_PEAK_KV] = used
    ins.kv_integral[i] += np.float64(used) * np.float64(d)
    # ---- MirrorToCPU
    kvc.mirror_to_cpu(kv, i, ins.batch[i], blen)
    return d


# ------------------------------------------------------------------ the simulation


@njit(cache=True, _nrt=False, error_model="numpy")
def _event_loop(ic, lat_params, alpha, arrival, input_len, output_len, deadline, id_rank,
                rs, ins, kv, lg, rt, inst_rank, times, ties, kinds, payloads, hs, buf_a, buf_b,
                cached_buf, scratch, gather, scorer_table, admit_fn, key_fn, key_vec,
                req_session, sess_think, sess_pend):
    """Process events until the heap drains, the horizon is passed, or a buffer must grow.

    Compiled without reference counting (the hot path touches only preallocated arrays);
    returns Status.OK when done, Status.GROW_* so :func:`simulate` can enlarge a buffer, or
    Status.SESSIONS when closed-loop outcomes must become follow-ups before the next event
    (``req_session[r]`` >= 0 marks a request of a closed-loop session, CLU-1.15).
    """
    n_inst = ic[IC_N_INST]
    horizon = ic[IC_HORIZON]
    max_len = ic[IC_MAX_MODEL_LEN]
    bs = kv.cfg[kvc.CFG_BS]
    total_blocks = kv.cfg[kvc.CFG_BLOCKS]
    post_decode = ic[IC_POST_DECODE]
    lat_code = ic[IC_LATENCY_CODE]
    max_batch = ins.batch.shape[1]
    size = hs[HS_SIZE]
    seq = hs[HS_SEQ]
    cap = times.shape[0]
    pend_room = sess_pend.shape[0] - max_batch - 2
    status = Status.OK
    while True:
        if hs[HS_PEND] > 0 and (size == 0 or times[0] >= hs[HS_TMIN]
                                or hs[HS_PEND] >= pend_room):
            status = Status.SESSIONS
            break
        if size == 0:
            break
        if size + max_batch + 4 > cap:
            status = Status.GROW_HEAP
            break
        if kvc.list_overflowed(kv):
            status = Status.KV_LIST_OVERFLOW
            break
        if seq >= SEQ_LIMIT:
            status = Status.SEQ_OVERFLOW
            break
        t = times[0]
        if t > horizon:
            break
        tie = ties[0]
        kind = kinds[0]
        payload = payloads[0]
        if kind == Event.STEP and (
                lg.sizes[0] + 1 > lg.time.shape[0]
                or lg.sizes[1] + ins.batch_len[tie_instance(tie)] + max_batch + 1
                > lg.run_start.shape[0]):
            status = Status.GROW_LOG
            break
        size = heap_pop(times, ties, kinds, payloads, size)
        if not tie_is_instance(tie):
            r = payload
            if kind == Event.CLUSTER_ARRIVAL:
                size = heap_push(times, ties, kinds, payloads, size, t + ic[IC_ADM_LATENCY],
                                 make_tie(False, 0, EventPriority.ADMISSION, seq),
                                 Event.ADMISSION, r)
                seq += 1
            elif kind == Event.ADMISSION:
                # buildRouterState: cache-signal refresh, then snapshots of matching instances
                rtk.refresh_cache_signal(rt, kv, t)
                n_cand = n_inst
                if rt.req_model_bad[r] == 1:
                    n_cand = 0
                else:
                    rtk.take_snapshots(rt, ins.wq, ins.batch_len, kv.meta, kv.cpu_meta, ins.cnt,
                                       K_PREEMPTIONS, K_INFLIGHT, total_blocks, t)
                ok, _reason = rtk.admit(rt, r, input_len[r], n_cand, t, arrival[r], admit_fn,
                                        kv.ht)
                if not ok:
                    ins.rejected[0] += 1
                    rs.registered[r] = Registration.REJECTED_ADMISSION
                else:
                    size = heap_push(times, ties, kinds, payloads, size,
                                     t + ic[IC_ROUTE_LATENCY],
                                     make_tie(False, 0, EventPriority.ROUTING, seq),
                                     Event.ROUTING, r)
                    seq += 1
            else:  # routing decision
                rtk.refresh_cache_signal(rt, kv, t)
                if rt.req_model_bad[r] == 1:
                    ins.rejected[1] += 1
                    rs.registered[r] = Registration.REJECTED_ROUTING
                    continue
                rtk.take_snapshots(rt, ins.wq, ins.batch_len, kv.meta, kv.cpu_meta, ins.cnt,
                                   K_PREEMPTIONS, K_INFLIGHT, total_blocks, t)
                target = rtk.route(rt, kv.ht, kv.chunk_off, kv.chunk_dig, r, input_len[r], t,
                                   inst_rank, arrival[r], scorer_table)
                ins.cnt[target, K_INFLIGHT] += 1
                rtk.on_routed(rt, r)
                rs.inst[r] = target
                rs.registered[r] = Registration.ROUTED
                size = heap_push(times, ties, kinds, payloads, size, t,
                                 make_tie(True, target, EventPriority.ARRIVAL, seq),
                                 Event.ARRIVAL, r)
                seq += 1
            continue

        i = tie_instance(tie)
        if kind == Event.TIMEOUT and rs.state[payload] == RequestState.COMPLETED:
            continue  # lazily cancelled timeout: the clock does not move (DELTA-1)
        ins.cnt[i, K_CLOCK] = t
        if kind == Event.ARRIVAL:
            r = payload
            delay = queueing_time(lat_code, alpha, input_len[r])
            size = heap_push(times, ties, kinds, payloads, size, t + delay,
                             make_tie(True, i, EventPriority.QUEUED, seq),
                             Event.QUEUED, r)
            seq += 1
        elif kind == Event.QUEUED:
            r = payload
            # ---- EnqueueRequest guards (ENG-3.4)
            if rs.max_out[r] == 0 and max_len > 0 and input_len[r] < max_len:
                rs.max_out[r] = max_len - input_len[r]
            drop = False
            if rs.max_out[r] < 0:
                drop = True
            elif max_len > 0 and (input_len[r] >= max_len or (
                    rs.max_out[r] > 0 and input_len[r] + rs.max_out[r] > max_len)):
                drop = True
            elif (input_len[r] + bs - 1) // bs > total_blocks:
                drop = True
            if drop:
                rs.state[r] = RequestState.DROPPED
                rs.registered[r] = Registration.NONE
                _count_done(ins, i, np.int64(K_DROPPED))
                rtk.on_done(rt, r)
                if req_session[r] >= 0:
                    _session_outcome(sess_pend, hs, r, t, SessionOutcome.CANCELLED, 0, -1, 0)
            else:
                ins.cnt[i, K_IN_TOKENS] += input_len[r]
                if deadline[r] > 0 and deadline[r] <= t:
                    rs.state[r] = RequestState.TIMED_OUT
                    _count_done(ins, i, np.int64(K_TIMED_OUT))
                    rtk.on_done(rt, r)
                    if req_session[r] >= 0:
                        _session_outcome(sess_pend, hs, r, t, SessionOutcome.CANCELLED, 0, -1, 0)
                else:
                    rs.state[r] = RequestState.QUEUED
                    _wq_push_back(ins, rs, i, r)
                    if deadline[r] > 0 and deadline[r] <= horizon:
                        size = heap_push(times, ties, kinds, payloads, size, deadline[r],
                                         make_tie(True, i, EventPriority.TIMEOUT, seq),
                                         Event.TIMEOUT, r)
                        seq += 1
            if ins.cnt[i, K_STEP_PENDING] == 0 and ins.wq[i, 2] > 0:
                size = heap_push(times, ties, kinds, payloads, size, t,
                                 make_tie(True, i, EventPriority.STEP, seq),
                                 Event.STEP, i)
                seq += 1
                ins.cnt[i, K_STEP_PENDING] = 1
        elif kind == Event.STEP:
            d = _step(ic, lat_params, alpha, ins, rs, kv, lg, i, t, arrival, input_len,
                      output_len, id_rank, buf_a, buf_b, cached_buf, scratch, gather, key_fn,
                      key_vec, rt.req_priority)
            if d < 0:
                continue
            # ---- processCompletions (ENG-2.4, DELTA-8); skipped when nothing finishes
            if ins.cnt[i, K_DONE_IN_STEP] > 0:
                blen = ins.batch_len[i]
                keep = 0
                for q in range(blen):
                    r = ins.batch[i, q]
                    done = False
                    if rs.hot[r, H_PI] >= input_len[r] + max(output_len[r], 1) - 1:
                        rs.state[r] = RequestState.COMPLETED
                        if output_len[r] > 0 and rs.hot[r, H_PI] < input_len[r] + output_len[r]:
                            if not kvc.append_decode_token_fast(
                                    kv, i, r, rs.hot[r, H_PI]) and not kvc.allocate(
                                    kv, i, r, rs.hot[r, H_PI], rs.hot[r, H_PI] + 1,
                                    np.int64(0) > 0, input_len[r], cached_buf, np.int64(0),
                                    scratch):
                                ins.cnt[i, K_KV_FAIL] += 1
                        done = True
                    elif max_len > 0 and rs.hot[r, H_PI] >= max_len - 1:
                        ins.cnt[i, K_LENGTH_CAPPED] += 1
                        rs.capped[r] = 1
                        rs.state[r] = RequestState.COMPLETED
                        done = True
                    if done:
                        kvc.release(kv, i, r)
                        rs.fin_step[r] = ins.cnt[i, K_STEPS]
                        size = heap_push(times, ties, kinds, payloads, size, t + d,
                                         make_tie(True, i, EventPriority.REQUEST_LEFT, seq),
                                         Event.REQUEST_LEFT, r)
                        seq += 1
                        _record_completion(ins, rs, lg, i, r, input_len, output_len, post_decode)
                        rtk.on_done(rt, r)
                        if req_session[r] >= 0:
                            _session_outcome(sess_pend, hs, r, t + d, SessionOutcome.COMPLETED,
                                             rs.hot[r, H_PI], seq, sess_think[req_session[r]])
                            seq += 1
                    else:
                        ins.batch[i, keep] = r
                        keep += 1
                ins.batch_len[i] = keep

            keep = ins.batch_len[i]
            # ---- scheduleNextStep
            if keep > 0 or ins.wq[i, 2] > 0:
                size = heap_push(times, ties, kinds, payloads, size, t + d,
                                 make_tie(True, i, EventPriority.STEP, seq),
                                 Event.STEP, i)
                seq += 1
                ins.cnt[i, K_STEP_PENDING] = 1
            else:
                ins.cnt[i, K_STEP_PENDING] = 0
        elif kind == Event.TIMEOUT:
            r = payload
            if rs.state[r] == RequestState.TIMED_OUT:
                continue
            was_running = rs.state[r] == RequestState.RUNNING
            was_queued = rs.state[r] == RequestState.QUEUED
            rs.state[r] = RequestState.TIMED_OUT
            _count_done(ins, i, np.int64(K_TIMED_OUT))
            rtk.on_done(rt, r)
            if req_session[r] >= 0:
                _session_outcome(sess_pend, hs, r, t, SessionOutcome.CANCELLED, 0, -1, 0)
            kvc.release(kv, i, r)
            rs.hot[r, H_COMP] = 0
            if was_running:
                keep = 0
                for q in range(ins.batch_len[i]):
                    x = ins.batch[i, q]
                    if x != r:
                        ins.batch[i, keep] = x
                        keep += 1
                ins.batch_len[i] = keep
            elif was_queued:
                _wq_remove(ins, rs, i, r)
            if ins.batch_len[i] == 0 and ins.cnt[i, K_STEP_PENDING] == 0 and ins.wq[i, 2] > 0:
                size = heap_push(times, ties, kinds, payloads, size, t,
                                 make_tie(True, i, EventPriority.STEP, seq),
                                 Event.STEP, i)
                seq += 1
                ins.cnt[i, K_STEP_PENDING] = 1
        # Event.REQUEST_LEFT: only moves the clock
    hs[HS_SIZE] = size
    hs[HS_SEQ] = seq
    return status


Heap = namedtuple("Heap", ["times", "ties", "kinds", "payloads"])
"""The event heap's parallel arrays (key time, tie, kind, payload); see kernels/heap.py."""

Work = namedtuple("Work", ["buf_a", "buf_b", "cached_buf", "scratch", "gather", "key_vec"])
"""Scratch buffers of the loop: queue reordering, admitted lists, block lists, step gathers."""


def new_work(n_requests: int, max_batch: int, max_chunks: int) -> Work:
    """Scratch buffers for ``n_requests`` rows, a batch of ``max_batch`` and ``max_chunks``."""
    qbuf = max(n_requests, max_batch) + 1
    return Work(buf_a=np.empty(qbuf, np.int64), buf_b=np.empty(qbuf, np.int64),
                cached_buf=np.empty(max_chunks + 1, np.int64),
                scratch=np.empty(max_chunks + 1, np.int64),
                gather=np.empty((4, max_batch + 1), np.int64),
                key_vec=np.zeros(hk.KEY_COLS, np.float64))


def new_loop_state() -> np.ndarray:
    """The ``hs`` vector of an empty heap (no pending session outcomes)."""
    hs = np.zeros(HS_LEN, np.int64)
    hs[HS_TMIN] = NO_TICK
    return hs


def new_heap(cap: int) -> Heap:
    """An empty event heap with room for ``cap`` events."""
    return Heap(np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int8),
                np.empty(cap, np.int64))


@njit(cache=True)
def push_cluster_arrivals(heap, hs, arrival, rows, seqs):
    """Schedule ``ClusterArrival`` events for ``rows`` (growing the heap when needed).

    ``seqs[k]`` is the event's sequence number, or -1 to take the next one (the initial
    workload); follow-ups bring the number reserved when their parent completed.
    """
    size = hs[HS_SIZE]
    if size + rows.shape[0] + 1 > heap.times.shape[0]:
        cap = max(2 * heap.times.shape[0], size + rows.shape[0] + 16)
        t2, ti2, k2, p2 = _grow_heap(heap.times, heap.ties, heap.kinds, heap.payloads, size,
                                     cap)
        heap = Heap(t2, ti2, k2, p2)
    for k in range(rows.shape[0]):
        r = rows[k]
        seq = seqs[k]
        if seq < 0:
            seq = hs[HS_SEQ]
            hs[HS_SEQ] += 1
        size = heap_push(heap.times, heap.ties, heap.kinds, heap.payloads, size, arrival[r],
                         make_tie(False, 0, EventPriority.CLUSTER_ARRIVAL, seq),
                         Event.CLUSTER_ARRIVAL, r)
    hs[HS_SIZE] = size
    return heap


@njit(cache=True)
def _grow_heap(times, ties, kinds, payloads, size, cap):
    times2 = np.empty(cap, np.int64)
    ties2 = np.empty(cap, np.int64)
    kinds2 = np.empty(cap, np.int8)
    payloads2 = np.empty(cap, np.int64)
    times2[:size] = times[:size]
    ties2[:size] = ties[:size]
    kinds2[:size] = kinds[:size]
    payloads2[:size] = payloads[:size]
    return times2, ties2, kinds2, payloads2


@njit(cache=True)
def simulate(ic, lat_params, alpha, arrival, input_len, output_len, deadline, id_rank,
             rs, ins, kv, lg, rt, inst_rank, scorer_table, admit_fn, key_fn, heap, hs, work,
             req_session, sess_think, sess_pend):
    """Run the simulation from the state in ``heap``/``hs`` until it ends or closed-loop
    session outcomes need follow-ups. Returns (status, step log, heap); every other result is
    written into ``rs``, ``ins``, ``kv`` and ``hs`` in place. Call again after
    Status.SESSIONS (once the follow-ups are pushed) to continue."""
    times, ties, kinds, payloads = heap.times, heap.ties, heap.kinds, heap.payloads
    if not is_known_backend(ic[IC_LATENCY_CODE]):
        return Status.UNKNOWN_BACKEND, lg, heap
    if ic[IC_N_INST] > MAX_INSTANCES:
        return Status.TOO_MANY_INSTANCES, lg, heap
    while True:
        lg.sizes[2] += 1
        status = _event_loop(ic, lat_params, alpha, arrival, input_len, output_len, deadline,
                             id_rank, rs, ins, kv, lg, rt, inst_rank, times, ties, kinds,
                             payloads, hs, work.buf_a, work.buf_b, work.cached_buf,
                             work.scratch, work.gather, scorer_table, admit_fn, key_fn,
                             work.key_vec, req_session, sess_think, sess_pend)
        if status == Status.GROW_HEAP:
            times, ties, kinds, payloads = _grow_heap(times, ties, kinds, payloads,
                                                      hs[HS_SIZE], 2 * times.shape[0])
        elif status == Status.GROW_LOG:
            lg = _grow_log(lg, 1, 2 * ins.batch.shape[1] + 1)
        else:
            if status != Status.SESSIONS:  # the run is over: marks become counts
                _itl_counts_from_marks(lg, np.zeros(ic[IC_N_INST], np.int64))
            return status, lg, Heap(times, ties, kinds, payloads)
