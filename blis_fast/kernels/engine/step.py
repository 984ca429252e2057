"""One engine iteration of one instance, and what a finishing request leaves behind.

:func:`run_step` is the reference's step (ENG-2 with DELTA-2/3/4/5/6): scheduleBatch (the
queue's order and batch formation, ``kernels/engine/batch.py``), a step-log entry, executeBatchStep
(the latency backend's step time over the scheduled requests, then the progress pass with TTFT
and ITL samples) and the KV statistics. :func:`finish_requests` is processCompletions
(ENG-2.4, DELTA-8), :func:`record_completion` recordRequestCompletion (DELTA-6/7).

ITL samples: each request keeps runs of consecutive steps in which it decoded (first step,
last step); when it completes, each run of its final attempt marks its first and its last step
in ``StepLog.itl_count`` (+1 and +ITL_RUN_END), and :func:`itl_counts_from_marks` turns the marks
into per-step counts at the end of the run, so exact ITL statistics come from
``(step duration + alpha2, count)`` without storing per-token values.
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.engine import lora as lk
from blis_fast.kernels.engine.batch import Priority, Scheduler, form_batch, order_wait_queue
from blis_fast.kernels.engine.latency import step_time
from blis_fast.kernels.engine.latency_profiled import step_floor_us
from blis_fast.kernels.engine.state import (
    ITL_RUN_END,
    ConfigSlot,
    HotField,
    InstanceCounter,
    InstanceSlot,
    LogCursor,
    LoopSlot,
    QueueField,
    QueueStat,
)
from blis_fast.kernels.enums import Livelock, RequestState
from blis_fast.kernels.go.gomath import INT64_MAX
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc

_PI, _NNT, _COMP = HotField.PROGRESS, HotField.NEW_TOKENS, HotField.COMPUTED


@njit(cache=True, _nrt=False, error_model="numpy")
def count_done(ins, i, column):
    """Bump a terminal counter and the cluster's in-flight count for the instance (CLU-3.5)."""
    ins.cnt[i, column] += 1
    ins.cnt[i, InstanceCounter.IN_FLIGHT] -= 1
    if ins.cnt[i, InstanceCounter.IN_FLIGHT] < 0:
        ins.cnt[i, InstanceCounter.IN_FLIGHT] = 0


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def record_completion(ins, rs, lg, inp, i, r, post_decode):
    """recordRequestCompletion with DELTA-6/7: output tokens counted at completion, E2E, and
    the ITL runs of the final attempt marked in the step log."""
    count_done(ins, i, np.int64(InstanceCounter.COMPLETED))
    k = rs.hot[r, _PI] - inp.input_len[r]
    if k < inp.output_len[r]:
        k += 1
    if k > 0:
        ins.cnt[i, InstanceCounter.OUT_TOKENS] += k
    post = post_decode if inp.output_len[r] > 0 else 0
    rs.e2e[r] = rs.first_token[r] + rs.hot[r, HotField.ITL_SUM] + post
    run = rs.run_head[r]
    tail = rs.hot[r, HotField.RUN_TAIL]
    while run >= 0:
        lg.itl_count[lg.run_start[run]] += 1
        last = rs.hot[r, HotField.LAST_DECODE] if run == tail else lg.run_last[run]
        lg.itl_count[last] += ITL_RUN_END
        run = lg.run_next[run]


@njit(cache=True, _nrt=False, error_model="numpy")
def itl_counts_from_marks(lg, open_runs):
    """Turn the run marks in ``lg.itl_count`` into per-step ITL sample counts (one pass);
    ``open_runs`` (zeros, one per instance) holds each instance's count of runs in progress."""
    for s in range(lg.sizes[LogCursor.STEPS]):
        i = lg.inst[s]
        v = lg.itl_count[s]
        now = open_runs[i] + (v & (ITL_RUN_END - 1))
        lg.itl_count[s] = now
        open_runs[i] = now - (v >> 32)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _open_log_entry(ins, lg, i, now):
    """Append the step's log entry (queue and batch after formation); returns its index and
    the instance's previous entry."""
    s = lg.sizes[LogCursor.STEPS]
    lg.sizes[LogCursor.STEPS] = s + 1
    lg.time[s] = now
    lg.inst[s] = i
    lg.queue[s] = ins.wq[i, QueueField.LEN]
    lg.running[s] = ins.batch_len[i]
    prev_step = ins.cnt[i, InstanceCounter.LAST_STEP]
    if prev_step >= 0:
        lg.next_same[prev_step] = s
    ins.cnt[i, InstanceCounter.LAST_STEP] = s
    ins.wq_sum[i, QueueStat.LENGTH_SUM] += ins.wq[i, QueueField.LEN]
    ins.wq_sum[i, QueueStat.STEPS] += 1
    return s, prev_step


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _check_floor(ins, i, params, g, work, d):
    """Count a step the backend timed at least 1 µs below its physical floor, and the lowest
    time / floor ratio seen (the run warns once about them)."""
    floor = step_floor_us(params, g, work.progress, work.new_tokens, work.input_len,
                          work.output_len)
    if floor > 0.0 and float(d) + 1.0 <= floor:
        ppm = np.int64(float(d) / floor * 1e6)
        below = ins.cnt[i, InstanceCounter.BELOW_FLOOR]
        if below == 0 or ppm < ins.cnt[i, InstanceCounter.FLOOR_WORST_PPM]:
            ins.cnt[i, InstanceCounter.FLOOR_WORST_PPM] = ppm
        ins.cnt[i, InstanceCounter.BELOW_FLOOR] = below + 1


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _step_duration(cfg, ins, rs, kv, inp, i, work, lora):
    """The latency backend's step time over the requests granted tokens (DELTA-3), times the
    LoRA overhead factor (LORA-5.3), plus a pending CPU->GPU transfer, at least 1 tick."""
    g = 0
    for q in range(ins.batch_len[i]):
        r = ins.batch[i, q]
        if rs.hot[r, _NNT] > 0:
            work.progress[g] = rs.hot[r, _PI]
            work.new_tokens[g] = rs.hot[r, _NNT]
            work.input_len[g] = inp.input_len[r]
            work.output_len[g] = inp.output_len[r]
            g += 1
    params = cfg.latency_params[cfg.inst[i, InstanceSlot.LATENCY_CLASS]]
    d = step_time(cfg.inst[i, InstanceSlot.BACKEND], params, g, work.progress,
                  work.new_tokens, work.input_len, work.output_len)
    _check_floor(ins, i, params, g, work, d)
    if lora is not None:
        d = lk.with_overhead(lora, ins, rs, inp, i, cfg.inst[i, InstanceSlot.BACKEND], d)
    d += kvc.consume_pending_transfer(kv, i)
    return max(np.int64(1), d)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _extend_itl_run(rs, lg, r, s, prev_step):
    """Request ``r`` decoded in step ``s``: continue its ITL run, or open a new one."""
    tail = rs.hot[r, HotField.RUN_TAIL]
    if tail < 0 or rs.hot[r, HotField.LAST_DECODE] != prev_step:  # else the run goes on
        run = lg.sizes[LogCursor.RUNS]
        lg.sizes[LogCursor.RUNS] = run + 1
        lg.run_start[run] = s
        lg.run_next[run] = -1
        if tail >= 0:
            lg.run_last[tail] = rs.hot[r, HotField.LAST_DECODE]
            lg.run_next[tail] = run
        else:
            rs.run_head[r] = run
        rs.hot[r, HotField.RUN_TAIL] = run
    rs.hot[r, HotField.LAST_DECODE] = s


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _advance_progress(cfg, ins, rs, lg, inp, i, now, d, s, prev_step):
    """executeBatchStep's progress pass: prefill progress, decode tokens with their ITL, TTFT.
    Returns how many requests processCompletions will finish."""
    otp = cfg.ints[ConfigSlot.OUTPUT_TOKEN_TIME]
    max_len = cfg.inst[i, InstanceSlot.MAX_MODEL_LEN]
    n_done = 0
    for q in range(ins.batch_len[i]):
        r = ins.batch[i, q]
        if rs.hot[r, _PI] < inp.input_len[r]:
            rs.hot[r, _PI] = rs.hot[r, _COMP]
        elif rs.hot[r, _NNT] > 0:
            rs.hot[r, _PI] += 1
            rs.hot[r, HotField.ITL_SUM] += d + otp
            rs.hot[r, HotField.ITL_COUNT] += 1
            _extend_itl_run(rs, lg, r, s, prev_step)
        pi = rs.hot[r, _PI]
        if pi == inp.input_len[r] and rs.hot[r, HotField.TTFT_SET] == 0:
            rs.hot[r, HotField.TTFT_SET] = 1
            rs.first_token[r] = now + d + otp - inp.arrival[r]
            rs.ttft[r] = rs.first_token[r]
            rs.has_ttft[r] = 1
        # NumNewTokens is read again only by the next formation, which expects it reset
        rs.hot[r, _NNT] = 0
        if pi >= inp.input_len[r] + max(inp.output_len[r], 1) - 1 or (
                max_len > 0 and pi >= max_len - 1):
            n_done += 1
    return n_done


@njit(cache=True, _nrt=False, error_model="numpy")
def run_step(cfg, ins, rs, kv, lg, inp, i, now, work, key_fn, slo_priority, lora):
    """One engine iteration at ``now`` (ENG-2 with DELTA-2/3/4/5/6). Returns the duration, or
    -1 when the step was a no-op (idle instance). With LoRA (``lora`` not None) the cold-load
    trigger runs between the queue's reorder and batch formation (LORA-4.1), and each admitted
    request touches and pins its adapter (LORA-3.2)."""
    if ins.batch_len[i] == 0 and ins.wq[i, QueueField.LEN] == 0:
        ins.cnt[i, InstanceCounter.STEP_PENDING] = 0
        return np.int64(-1)
    ins.cnt[i, InstanceCounter.STEPS] += 1
    kvc.chain_poll(work.chain, kv, i, now)  # the KV store's SetClock (KVO-6.7; chain only)
    order_wait_queue(cfg.ints, ins, rs, inp, i, now, work, key_fn, slo_priority)
    if lora is not None:
        lk.maybe_start_load(lora, ins, inp, rs, i, now)
    n_adm = form_batch(cfg.ints, cfg.inst[i, InstanceSlot.MAX_MODEL_LEN], ins, rs, kv, inp, i,
                       work, lora)
    for k in range(n_adm):
        r = work.queue_a[k]
        rs.sched_delay[r] = now - inp.arrival[r]
        rs.has_sched[r] = 1
        if lora is not None:
            lk.on_admitted(lora, inp, rs, i, r)
    if lora is not None:
        lk.note_stall(lora, ins, i, now)
    s, prev_step = _open_log_entry(ins, lg, i, now)
    d = _step_duration(cfg, ins, rs, kv, inp, i, work, lora)
    lg.dur[s] = d
    ins.cnt[i, InstanceCounter.DONE_IN_STEP] = _advance_progress(
        cfg, ins, rs, lg, inp, i, now, d, s, prev_step)
    used = kvc.used_blocks(kv, i)
    lg.kv_used[s] = used
    if used > ins.cnt[i, InstanceCounter.PEAK_KV]:
        ins.cnt[i, InstanceCounter.PEAK_KV] = used
    ins.kv_integral[i] += np.float64(used) * np.float64(d)
    kvc.mirror_to_cpu(kv, i, ins.batch[i], ins.batch_len[i], inp.input_len,  # MirrorToCPU
                      work.chain)
    return d


@njit(cache=True, _nrt=False, error_model="numpy")
def skip_idle_steps(cfg, ins, kv, heap, i, t, d):
    """The time of instance ``i``'s next step after its step at ``t`` (duration ``d``), for a
    step whose batch was empty before and after batch formation (one that emptied its batch by
    preemption changed the cache, and the next step may well admit).

    A step that formed an empty batch while requests wait (their KV does not fit: e.g. a P/D
    decode instance whose blocks are reserved for transfers) changes nothing but counters, and
    so does every later step until another event happens: the reference takes them all, one
    empty step after another, up to ~3e8 one-microsecond steps until a 300 s deadline. Those
    steps are counted here instead of taken: the same step counts, queue-length sums, KV-time
    integral (added step by step, so bit-identical) and clock, with the next step on the same
    grid (``t + (k + 1) d``, the first at or after the next event, the horizon or a pending
    closed-loop follow-up). They are not logged (``IDLE_SKIPPED`` counts them). Only where the
    queue's order cannot change with time: constant priorities, no user scheduler, no CPU tier.
    With no other event left at all (an empty heap, the infinite horizon, no follow-up due) the
    empty steps would go on forever: the loop stops the run (``Livelock.STUCK`` in
    ``LoopSlot.STOP_KIND``), where the reference loops until killed.
    """
    if (ins.batch_len[i] != 0 or ins.wq[i, QueueField.LEN] == 0
            or cfg.ints[ConfigSlot.PRIORITY] != Priority.CONSTANT
            or cfg.ints[ConfigSlot.SCHEDULER] == Scheduler.CUSTOM
            or kv.cfg[kvc.KVConfig.TIERED] != 0):
        return t + d
    loop = heap.loop
    limit = INT64_MAX
    if loop[LoopSlot.HEAP_SIZE] > 0:
        limit = heap.times[0]
    horizon = cfg.ints[ConfigSlot.HORIZON]
    if horizon < limit:
        limit = horizon + 1
    if loop[LoopSlot.STOP_AT] < limit:  # blis serve: arrivals after its clock are unknown yet
        limit = loop[LoopSlot.STOP_AT]
    if loop[LoopSlot.PENDING_OUTCOMES] > 0 and loop[LoopSlot.FOLLOW_UP_TICK] < limit:
        limit = loop[LoopSlot.FOLLOW_UP_TICK]
    if limit == INT64_MAX:
        # nothing else ever happens: the reference steps like this forever (no event can
        # change the queue or the cache again, and these steps change neither); stop the run
        loop[LoopSlot.STOP_KIND] = Livelock.STUCK
        loop[LoopSlot.STOP_ROW] = ins.wq[i, QueueField.HEAD]
        loop[LoopSlot.STOP_INST] = i
        return t + d
    if limit - t <= d:
        return t + d
    k = (limit - t - 1) // d  # the steps at t + j d < limit, j = 1..k
    queued = ins.wq[i, QueueField.LEN]
    ins.cnt[i, InstanceCounter.STEPS] += k
    ins.cnt[i, InstanceCounter.IDLE_SKIPPED] += k
    ins.wq_sum[i, QueueStat.LENGTH_SUM] += k * queued
    ins.wq_sum[i, QueueStat.STEPS] += k
    area = np.float64(kvc.used_blocks(kv, i)) * np.float64(d)
    for _ in range(k):
        ins.kv_integral[i] += area
    ins.cnt[i, InstanceCounter.CLOCK] = t + k * d
    return t + (k + 1) * d


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def finishes(cfg, rs, kv, ins, inp, i, r, work):
    """processCompletions' test for running request ``r`` after a step: True (and the request
    completed, its last decode token allocated) when it is done or hit max-model-len."""
    pi = rs.hot[r, _PI]
    if pi >= inp.input_len[r] + max(inp.output_len[r], 1) - 1:
        rs.state[r] = RequestState.COMPLETED
        if inp.output_len[r] > 0 and pi < inp.input_len[r] + inp.output_len[r]:
            if not kvc.append_decode_token_fast(kv, i, r, pi) and not kvc.allocate(
                    kv, i, r, pi, pi + 1, np.int64(0) > 0, inp.input_len[r], work.cached,
                    np.int64(0), work.scratch, work.chain):
                ins.cnt[i, InstanceCounter.KV_FAILURES] += 1
        return True
    max_len = cfg.inst[i, InstanceSlot.MAX_MODEL_LEN]
    if max_len > 0 and pi >= max_len - 1:
        ins.cnt[i, InstanceCounter.LENGTH_CAPPED] += 1
        rs.capped[r] = 1
        rs.state[r] = RequestState.COMPLETED
        return True
    return False
