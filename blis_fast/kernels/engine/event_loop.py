"""The simulation kernel: the reference's cluster loop over N vLLM-style instances (CLU-1).

One call of :func:`run_events` runs the simulation until it ends, a buffer must grow, or
closed-loop follow-ups are due (``engine/simulate.py: KernelRun`` grows the buffers and calls
it again: the loop of re-entries is Python, so no compiled function sits above this one and
the engine is not optimized and linked a second time one level up, a cold compile's cost).
All state is in the NamedTuple groups of ``kernels/engine/state.py``, the KV caches
(``kernels/kv/kv_layout.py``) and the router state (``kernels/cluster/router_state.py``); see
``blis_fast/engine/`` (``packing.py``, ``results.py``) for how they are built and read back.

The loop pops the earliest event of one heap (``kernels/engine/heap.py``: cluster events before
instance events at a tick, then instance index, priority and sequence, CLU-1.5/1.6, ENG-1.2)
and hands it to the handler of its kind: a cluster arrival goes to admission after the
admission latency, admission (CLU-2) to routing after the routing latency, routing (CLU-3)
injects it into the chosen instance; there it arrives, is queued after the queueing delay
(enqueue guards ENG-3.4), runs in the instance's steps (ENG-2, ``kernels/engine/step.py``) until it
completes, is dropped or times out (DELTA-1), and leaves.

Rules implemented: CLU-1, ENG-1..ENG-5 and ENG-7 with the adopted upstream fixes DELTA-1..8
and DELTA-13. Everything the loop calls compiles without reference counting and touches only
preallocated arrays; a buffer that must grow makes the loop return a status.

The handlers are inlined into the loop (``inline="always"``, Numba-IR inlining; each has one
call site): Numba passes a NamedTuple of arrays as all of its arrays' fields, so a call handing
the whole state on costs hundreds of stores per event, and LLVM's inliner leaves functions this
large alone. Small helpers stay separate functions (LLVM inlines them): Numba-IR inlining
copies the callee's IR at every call site and every nesting level, which costs more compile
time than a small separately compiled function (measured on the engine's cold compile).
"""

from __future__ import annotations

import numpy as np

from blis_fast.kernels.cluster import admission as adm
from blis_fast.kernels.cluster import autoscale as asx
from blis_fast.kernels.cluster import pd as pdk
from blis_fast.kernels.cluster import routing as rtk
from blis_fast.kernels.cluster.router_state import RouterCfg, RouterVar, SnapGroup
from blis_fast.kernels.cluster.scorers import is_known_scorer
from blis_fast.kernels.engine import lora as lk
from blis_fast.kernels.engine.batch import (
    Priority,
    Scheduler,
    batch_remove,
    wq_push_back,
    wq_remove,
)
from blis_fast.kernels.engine.events import push_event as _push
from blis_fast.kernels.engine.events import schedule_step as _schedule_step
from blis_fast.kernels.engine.heap import (
    MAX_EVENT_SEQ,
    MAX_INSTANCES,
    heap_pop,
    heap_push,
    make_tie,
    tie_instance,
    tie_is_instance,
)
from blis_fast.kernels.engine.latency import is_known_backend, queueing_time
from blis_fast.kernels.engine.livelock import check_cycle
from blis_fast.kernels.engine.state import (
    ConfigSlot,
    EventHeap,
    HotField,
    InstanceCounter,
    InstanceSlot,
    LogCursor,
    LoopSlot,
    OutcomeField,
    QueueField,
    Rejection,
    grow_event_heap,
)
from blis_fast.kernels.engine.step import (
    count_done,
    finishes,
    record_completion,
    run_step,
    skip_idle_steps,
)
from blis_fast.kernels.enums import (
    Event,
    EventPriority,
    Livelock,
    Registration,
    RequestState,
    SessionOutcome,
    Status,
)
from blis_fast.kernels.go.gomath import INT64_MAX
from blis_fast.kernels.jit import njit
from blis_fast.kernels.kv import kvcache as kvc

SEQ_LIMIT = MAX_EVENT_SEQ - (1 << 20)
"""The last sequence number the loop hands out: room for the pushes of one event after the
check."""
_GO_ON = -1  # _stop_status: no reason to stop before the next event
_CLUSTER = False
_INSTANCE = True

# ------------------------------------------------------------------ heap and session helpers


@njit(cache=True, _nrt=False, error_model="numpy")
def _session_outcome(sess, heap, r, tick, outcome, pi, seq, think):
    """Record a closed-loop session request's terminal outcome for the session driver.

    A completion may bring a follow-up arriving at ``tick + think`` at the earliest; ``seq`` is
    the sequence number its arrival event takes (the reference pushes it right away).
    """
    loop = heap.loop
    k = loop[LoopSlot.PENDING_OUTCOMES]
    sess.outcomes[k, OutcomeField.ROW] = r
    sess.outcomes[k, OutcomeField.TICK] = tick
    sess.outcomes[k, OutcomeField.OUTCOME] = outcome
    sess.outcomes[k, OutcomeField.PROGRESS] = pi
    sess.outcomes[k, OutcomeField.SEQ] = seq
    loop[LoopSlot.PENDING_OUTCOMES] = k + 1
    if outcome == SessionOutcome.COMPLETED and tick + think < loop[LoopSlot.FOLLOW_UP_TICK]:
        loop[LoopSlot.FOLLOW_UP_TICK] = tick + think


@njit(cache=True, _nrt=False, error_model="numpy")
def _cancel(inp, rs, ins, rt, heap, sess, i, r, t, state, counter):
    """End request ``r`` on instance ``i`` without completing it (dropped or timed out): its
    state and counter, the tenant's in-flight count, its session cancelled."""
    rs.state[r] = state
    count_done(ins, i, counter)
    adm.on_done(rt, r)
    if inp.session[r] >= 0:
        _session_outcome(sess, heap, r, t, SessionOutcome.CANCELLED, 0, -1, 0)


# ------------------------------------------------------------------ cluster events


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _on_admission(cfg, inp, rs, ins, kv, rt, heap, hooks, lora, t, r):
    """AdmissionDecisionEvent (CLU-1.12, CLU-2): buildRouterState (cache-signal refresh, then
    snapshots of the instances serving the request's model), the policy's decision, then the
    routing event after the routing latency, or a rejection."""
    rtk.refresh_cache_signal(rt, kv, t)
    n_cand = rt.st[RouterVar.N_ROUTABLE]
    if rt.req_model_bad[r] == 1:
        n_cand = 0
    else:
        rtk.take_snapshots(rt, ins, kv, t, rt.routable, n_cand)
        if lora is not None:
            _lora_snapshots(lora, rt, t, n_cand)
    ok, _reason = adm.admit(rt, r, inp.input_len[r], rt.routable, n_cand, t, inp.arrival[r],
                            hooks.admit, kv)
    if not ok:
        ins.rejected[Rejection.ADMISSION] += 1
        rs.registered[r] = Registration.REJECTED_ADMISSION
        return
    _push(heap, t + cfg.ints[ConfigSlot.ROUTING_LATENCY], _CLUSTER, 0, EventPriority.ROUTING,
          Event.ROUTING, r)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _on_routing(cfg, inp, rs, ins, kv, rt, heap, hooks, pd, lora, t, r):
    """RoutingDecisionEvent (CLU-3): the policy picks one of the routable instances; the
    request arrives there at once (or is rejected when no routable instance serves its
    model). In P/D mode the decode pool is routed first (``pd.route_decode_first``)."""
    rtk.refresh_cache_signal(rt, kv, t)
    if pd is not None:
        if lora is not None:  # the decode pool's lora-affinity sees the request's adapter
            n_all = rt.st[RouterVar.N_ROUTABLE]  # (LORA-7.5; the prefill pool's is neutral)
            rtk.take_snapshots(rt, ins, kv, t, rt.routable, n_all)  # as route_decode_first
            _lora_snapshots(lora, rt, t, n_all)
            lk.fill_affinity(lora, rt.lora_warm, np.int64(inp.adapter[r]), pd.cand_decode,
                             pd.conf[pdk.PDConf.N_DECODE])
        pdk.route_decode_first(cfg, inp, rs, ins, kv, rt, heap, hooks, pd, t, r)
        if lora is not None:
            lk.fill_affinity(lora, rt.lora_warm, np.int64(-1), rt.routable, rt.routable.shape[0])
        return
    n_cand = rt.st[RouterVar.N_ROUTABLE]
    if rt.req_model_bad[r] == 1 or n_cand == 0:
        ins.rejected[Rejection.ROUTING] += 1
        rs.registered[r] = Registration.REJECTED_ROUTING
        return
    rtk.take_snapshots(rt, ins, kv, t, rt.routable, n_cand)
    if lora is not None:  # the lora-affinity scorer's view (LORA-7.1/7.2)
        _lora_snapshots(lora, rt, t, n_cand)
        lk.fill_affinity(lora, rt.lora_warm, np.int64(inp.adapter[r]), rt.routable, n_cand)
    target = rtk.route(rt, kv, r, inp.input_len[r], t, cfg.instance_rank, inp.arrival[r],
                       hooks.scorer_table, rt.routable, n_cand)
    ins.cnt[target, InstanceCounter.IN_FLIGHT] += 1
    adm.on_routed(rt, r)
    rs.inst[r] = target
    rs.registered[r] = Registration.ROUTED
    _push(heap, t, _INSTANCE, target, EventPriority.ARRIVAL, Event.ARRIVAL, r)


@njit(cache=True, _nrt=False, error_model="numpy")
def _lora_snapshots(lora, rt, t, n):
    """The resident-set snapshots of the routable instances, refreshed with the queue-depth
    group (LORA-7.2)."""
    lk.refresh_snapshots(lora, rt.rcfg[RouterCfg.REFRESH], rt.snap_last, SnapGroup.QUEUE, t,
                         rt.routable, n)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _on_cluster_arrival(cfg, heap, t, r):
    """ClusterArrivalEvent: the admission decision follows after the admission latency."""
    _push(heap, t + cfg.ints[ConfigSlot.ADMISSION_LATENCY], _CLUSTER, 0,
          EventPriority.ADMISSION, Event.ADMISSION, r)


# ------------------------------------------------------------------ instance events


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _unservable(cfg, rs, inp, kv, i, r):
    """EnqueueRequest's guards (ENG-3.4) on instance ``i``: the output budget defaults to what
    max-model-len leaves, then a request that cannot fit the model length or the cache is
    refused."""
    max_len = cfg.inst[i, InstanceSlot.MAX_MODEL_LEN]
    n_in = inp.input_len[r]
    if rs.max_out[r] == 0 and max_len > 0 and n_in < max_len:
        rs.max_out[r] = max_len - n_in
    if rs.max_out[r] < 0:
        return True
    if max_len > 0 and (n_in >= max_len or (rs.max_out[r] > 0 and n_in + rs.max_out[r] > max_len)):
        return True
    bs = kv.cfg[kvc.KVConfig.BLOCK_SIZE]
    return (n_in + bs - 1) // bs > kv.meta[i, kvc.KVMeta.TOTAL]


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _on_queued(cfg, inp, rs, ins, kv, rt, heap, sess, i, t, r):
    """QueuedEvent: the enqueue guards, the deadline check, then the wait queue with a timeout
    event at the deadline; a step is scheduled when the instance has none pending."""
    if _unservable(cfg, rs, inp, kv, i, r):
        rs.registered[r] = Registration.NONE
        _cancel(inp, rs, ins, rt, heap, sess, i, r, t, RequestState.DROPPED,
                np.int64(InstanceCounter.DROPPED))
    else:
        ins.cnt[i, InstanceCounter.IN_TOKENS] += inp.input_len[r]
        deadline = inp.deadline[r]
        if deadline > 0 and deadline <= t:
            _cancel(inp, rs, ins, rt, heap, sess, i, r, t, RequestState.TIMED_OUT,
                    np.int64(InstanceCounter.TIMED_OUT))
        else:
            rs.state[r] = RequestState.QUEUED
            wq_push_back(ins, rs, i, r)
            if deadline > 0 and deadline <= cfg.ints[ConfigSlot.HORIZON]:
                _push(heap, deadline, _INSTANCE, i, EventPriority.TIMEOUT, Event.TIMEOUT, r)
    if ins.cnt[i, InstanceCounter.STEP_PENDING] == 0 and ins.wq[i, QueueField.LEN] > 0:
        _schedule_step(heap, ins, i, t)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _complete(cfg, inp, rs, ins, kv, lg, rt, heap, sess, lora, i, r, done_at):
    """A request finished in the step: its adapter pin released (LORA-3.3), blocks released,
    RequestLeft at ``done_at``, metrics, and for a session request the outcome with the
    sequence number its follow-up takes."""
    if lora is not None:
        lk.unpin(lora, inp, rs, i, r)
    kvc.release(kv, i, r)
    rs.fin_step[r] = ins.cnt[i, InstanceCounter.STEPS]
    _push(heap, done_at, _INSTANCE, i, EventPriority.REQUEST_LEFT, Event.REQUEST_LEFT, r)
    record_completion(ins, rs, lg, inp, i, r, cfg.inst[i, InstanceSlot.POST_DECODE])
    adm.on_done(rt, r)
    if inp.session[r] >= 0:
        seq = heap.loop[LoopSlot.NEXT_SEQ]
        heap.loop[LoopSlot.NEXT_SEQ] = seq + 1
        _session_outcome(sess, heap, r, done_at, SessionOutcome.COMPLETED,
                         rs.hot[r, HotField.PROGRESS], seq, sess.think[inp.session[r]])


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _on_step(cfg, inp, rs, ins, kv, lg, rt, heap, work, hooks, sess, pd, lora, i, may_skip):
    """StepEvent at the instance's clock: the step, processCompletions (ENG-2.4, DELTA-8;
    skipped when nothing finishes), then scheduleNextStep while the instance has work (with
    LoRA, not while an adapter load is in flight and nothing runs: its completion steps again,
    LORA-4.6); in P/D mode the sub-requests that finished are then detected (``pd.detect``)."""
    t = ins.cnt[i, InstanceCounter.CLOCK]
    idle_before = ins.batch_len[i] == 0
    d = run_step(cfg, ins, rs, kv, lg, inp, i, t, work, hooks.sort_key, rt.req_priority, lora)
    if d < 0:
        return
    if lora is not None and lora.load_new[i] == 1:  # the load the step started (LORA-4.3)
        lora.load_new[i] = 0
        _push(heap, lora.load_at[i], _INSTANCE, i, EventPriority.ADAPTER_LOAD,
              Event.ADAPTER_LOAD, lora.loading[i])
    if ins.cnt[i, InstanceCounter.DONE_IN_STEP] > 0:
        keep = 0
        for q in range(ins.batch_len[i]):
            r = ins.batch[i, q]
            if finishes(cfg, rs, kv, ins, inp, i, r, work):
                _complete(cfg, inp, rs, ins, kv, lg, rt, heap, sess, lora, i, r, t + d)
                if pd is not None:
                    pdk.note_completion(pd, rs, r)
            else:
                ins.batch[i, keep] = r
                keep += 1
        ins.batch_len[i] = keep
    if ins.batch_len[i] > 0 or (ins.wq[i, QueueField.LEN] > 0
                                and (lora is None or lora.loading[i] < 0)):
        _schedule_step(heap, ins, i, skip_idle_steps(cfg, ins, kv, heap, i, t, d)
                       if may_skip and idle_before else t + d)
    else:
        ins.cnt[i, InstanceCounter.STEP_PENDING] = 0
    if pd is not None:
        pdk.detect(cfg, pd, heap, t)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _on_timeout(cfg, inp, rs, ins, kv, rt, heap, sess, pd, lora, i, t, r):
    """TimeoutEvent (DELTA-1): a request still queued or running times out; its adapter pin
    (a running or preempted request's) and its blocks are released and it leaves the queue or
    the batch (a P/D decode sub-request ends its parent)."""
    if rs.state[r] == RequestState.TIMED_OUT:
        return
    if pd is not None:
        if rs.pd_sub[r] == 1:
            pdk.on_decode_timeout(pd, r, t)
    was_running = rs.state[r] == RequestState.RUNNING
    was_queued = rs.state[r] == RequestState.QUEUED
    _cancel(inp, rs, ins, rt, heap, sess, i, r, t, RequestState.TIMED_OUT,
            np.int64(InstanceCounter.TIMED_OUT))
    if lora is not None:
        lk.unpin(lora, inp, rs, i, r)
    kvc.release(kv, i, r)
    rs.hot[r, HotField.COMPUTED] = 0
    if was_running:
        batch_remove(ins, i, r)
    elif was_queued:
        wq_remove(ins, rs, i, r)
    if (ins.batch_len[i] == 0 and ins.cnt[i, InstanceCounter.STEP_PENDING] == 0
            and ins.wq[i, QueueField.LEN] > 0):
        _schedule_step(heap, ins, i, t)


@njit(cache=True, _nrt=False, error_model="numpy")
def _on_adapter_load(lora, ins, heap, i, t, a):
    """AdapterLoadCompletionEvent (LORA-4.4): the adapter becomes resident, then
    ScheduleStepIfIdle: a step now when none is pending and requests wait."""
    lk.complete_load(lora, i, a, t)
    if ins.cnt[i, InstanceCounter.STEP_PENDING] == 0 and ins.wq[i, QueueField.LEN] > 0:
        _schedule_step(heap, ins, i, t)


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _on_arrival(cfg, inp, heap, i, t, r):
    """ArrivalEvent: the request is queued after the backend's queueing delay."""
    delay = queueing_time(cfg.inst[i, InstanceSlot.BACKEND], cfg.alpha, inp.input_len[r])
    _push(heap, t + delay, _INSTANCE, i, EventPriority.QUEUED, Event.QUEUED, r)


# ------------------------------------------------------------------ the loop


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _stop_status(horizon, ins, kv, lg, heap, sess):
    """Why the loop must stop before the next event (a Status: Status.OK once the heap is
    empty or the next event is past the horizon), or ``_GO_ON``."""
    loop = heap.loop
    size = loop[LoopSlot.HEAP_SIZE]
    max_batch = ins.batch.shape[1]
    pending = loop[LoopSlot.PENDING_OUTCOMES]
    if pending > 0 and (size == 0 or heap.times[0] >= loop[LoopSlot.FOLLOW_UP_TICK]
                        or pending >= sess.outcomes.shape[0] - max_batch - 2):
        return Status.SESSIONS
    if size == 0:
        return Status.OK
    if size + 2 * max_batch + 4 > heap.times.shape[0]:  # a P/D step: + a transfer each
        return Status.GROW_HEAP
    if kvc.list_overflowed(kv):
        return Status.KV_LIST_OVERFLOW
    if loop[LoopSlot.NEXT_SEQ] >= SEQ_LIMIT:
        return Status.SEQ_OVERFLOW
    if heap.times[0] >= loop[LoopSlot.STOP_AT]:  # blis serve: not past its clock
        return Status.PAUSED
    if heap.times[0] > horizon:
        return Status.OK
    if heap.kinds[0] == Event.STEP and (
            lg.sizes[LogCursor.STEPS] + 1 > lg.time.shape[0]
            or lg.sizes[LogCursor.RUNS] + ins.batch_len[tie_instance(heap.ties[0])] + max_batch
            + 1 > lg.run_start.shape[0]):
        return Status.GROW_LOG
    return _GO_ON


@njit(cache=True, _nrt=False, error_model="numpy")
def _never_finishes(cfg, inp, kv, heap, i, r):
    """Whether request ``r``, just queued on instance ``i``, keeps the run from ever ending;
    then the reason, the row, the instance and the blocks it needs are left in the loop slots
    STOP_* (the loop returns Status.LIVELOCK).

    Soundness. A request completes only once its progress reaches input + max(output, 1) - 1
    tokens, or max-model-len - 1 (``step.finishes``), and progress p means the request holds
    the blocks of its first p tokens at once (its own blocks, prefix-shared or not: chained
    hashes never repeat within a request). When those blocks outnumber the instance's GPU
    blocks, no attempt completes; a request leaves its instance only by completing, timing out
    or being dropped by the enqueue guards (already passed), and an instance schedules another
    step as long as its queue or batch is non-empty (``_on_step``; a draining instance waits
    for them too). Without a deadline and under the infinite horizon the request is therefore
    preempted and re-admitted forever and the run never ends (the reference's too). A deadline
    or a finite horizon ends it, so then the run goes on."""
    if cfg.ints[ConfigSlot.HORIZON] != INT64_MAX or inp.deadline[r] > 0:
        return False
    held = inp.input_len[r] + max(inp.output_len[r], 1) - 1
    max_len = cfg.inst[i, InstanceSlot.MAX_MODEL_LEN]
    if max_len > 0:
        held = min(held, max_len - 1)
    bs = kv.cfg[kvc.KVConfig.BLOCK_SIZE]
    need = (held + bs - 1) // bs
    if need <= kv.meta[i, kvc.KVMeta.TOTAL]:
        return False
    heap.loop[LoopSlot.STOP_KIND] = Livelock.TOO_BIG
    heap.loop[LoopSlot.STOP_ROW] = r
    heap.loop[LoopSlot.STOP_INST] = i
    heap.loop[LoopSlot.STOP_NEED] = need
    return True


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _autoscale_stop_status(heap, asc):
    """The autoscaler's reasons to stop before the next event: a scale-up that may need more
    instance rows or heap room than there are, or a tick while closed-loop outcomes wait for
    their follow-ups (the tick's guard counts pending arrivals)."""
    kind = heap.kinds[0]
    if kind == Event.SCALING_TICK and heap.loop[LoopSlot.PENDING_OUTCOMES] > 0:
        return Status.SESSIONS
    if kind == Event.SCALE_ACTUATION:
        rows, pushes = asx.room_needed(asc, heap)
        if rows > 0:
            return Status.GROW_FLEET
        if heap.loop[LoopSlot.HEAP_SIZE] + pushes + 4 > heap.times.shape[0]:
            return Status.GROW_HEAP
    return _GO_ON


@njit(cache=True, _nrt=False, error_model="numpy")
def run_events(cfg, inp, rs, ins, kv, lg, rt, heap, work, hooks, sess, pd, asc, lora):
    """Process events until the heap drains, the horizon is passed, or the loop must stop
    (a Status: a buffer to grow, closed-loop outcomes that must become follow-ups first,
    ``inp.session[r]`` >= 0 marking a request of a closed-loop session, CLU-1.15; or an
    error, before the first event, for a code no kernel implements). ``pd`` is the P/D state
    (``kernels/cluster/pd.py``), None without P/D; ``asc`` the autoscaler's state
    (``kernels/cluster/autoscale.py``), None for a fixed fleet; ``lora`` the LoRA adapters' state
    (``kernels/engine/lora.py``), None without active LoRA. A None leaves that feature's code out
    of the compile (a quick start compiles, and loads, none of them)."""
    status = _config_status(cfg, rt, hooks, pd)
    if status != Status.OK:
        return status
    horizon = cfg.ints[ConfigSlot.HORIZON]
    while True:
        status = _stop_status(horizon, ins, kv, lg, heap, sess)
        if status != _GO_ON:
            return status
        if asc is not None:
            status = _autoscale_stop_status(heap, asc)
            if status != _GO_ON:
                return status
        t = heap.times[0]
        tie = heap.ties[0]
        kind = heap.kinds[0]
        x = heap.payloads[0]
        heap.loop[LoopSlot.HEAP_SIZE] = heap_pop(heap.times, heap.ties, heap.kinds,
                                                 heap.payloads, heap.loop[LoopSlot.HEAP_SIZE])
        if kind != Event.STEP:  # ends a closed stretch (kernels/engine/livelock.py)
            heap.loop[LoopSlot.OTHER_EVENTS] += 1
        if not tie_is_instance(tie):
            if kind == Event.CLUSTER_ARRIVAL:
                _on_cluster_arrival(cfg, heap, t, x)
                if asc is not None:
                    asc.var[asx.AsVar.PENDING_ARRIVALS] -= 1
            elif kind == Event.ADMISSION:
                _on_admission(cfg, inp, rs, ins, kv, rt, heap, hooks, lora, t, x)
            elif kind == Event.ROUTING:
                _on_routing(cfg, inp, rs, ins, kv, rt, heap, hooks, pd, lora, t, x)
            elif pd is not None and kind == Event.PREFILL_ROUTING:
                pdk.on_prefill_routing(inp, rs, ins, kv, rt, heap, hooks, pd, t, x)
            elif pd is not None and kind == Event.KV_TRANSFER_START:
                pdk.on_transfer_start(inp, rs, kv, heap, work, pd, t, x)
            elif pd is not None and kind == Event.KV_TRANSFER_DONE:
                pdk.on_transfer_done(cfg, inp, rs, ins, rt, heap, pd, t, x)
                if rs.state[x] == RequestState.QUEUED and _never_finishes(
                        cfg, inp, kv, heap, rs.inst[x], x):
                    return Status.LIVELOCK
            elif asc is not None:
                if kind == Event.INSTANCE_LOADED:
                    asx.on_instance_loaded(asc, rt, t, x)
                elif kind == Event.SCALING_TICK:
                    asx.on_scaling_tick(asc, ins, rt, kv, heap, t)
                else:
                    asx.on_scale_actuation(asc, kv, cfg.inst, cfg.instance_rank, rt, heap, t, x)
            continue
        i = tie_instance(tie)
        if kind == Event.TIMEOUT and rs.state[x] == RequestState.COMPLETED:
            if asc is not None:
                asx.after_instance_event(asc, ins, i, t)
            continue  # lazily cancelled timeout: the clock does not move (DELTA-1)
        ins.cnt[i, InstanceCounter.CLOCK] = t
        if kind == Event.ARRIVAL:
            _on_arrival(cfg, inp, heap, i, t, x)
        elif kind == Event.QUEUED:
            _on_queued(cfg, inp, rs, ins, kv, rt, heap, sess, i, t, x)
            if rs.state[x] == RequestState.QUEUED and _never_finishes(cfg, inp, kv, heap, i, x):
                return Status.LIVELOCK
        elif kind == Event.STEP:
            # the autoscaler samples every instance event: no step may go untaken
            _on_step(cfg, inp, rs, ins, kv, lg, rt, heap, work, hooks, sess, pd, lora, i,
                     asc is None)
            if heap.loop[LoopSlot.STOP_KIND] != Livelock.NONE:  # step.skip_idle_steps
                if lora is not None and lora.blocked[i] == 1:  # the LORA-D1 stall
                    heap.loop[LoopSlot.STOP_KIND] = Livelock.LORA_STALL
                return Status.LIVELOCK
            if (asc is None and ins.batch_len[i] == 0 and ins.wq[i, QueueField.LEN] > 0
                    and kvc.chain_quiet(work.chain, i)  # a fetch in flight changes the KV
                    and check_cycle(cfg, rs, ins, kv, heap, i)):
                return Status.LIVELOCK
        elif kind == Event.TIMEOUT:
            _on_timeout(cfg, inp, rs, ins, kv, rt, heap, sess, pd, lora, i, t, x)
        elif lora is not None and kind == Event.ADAPTER_LOAD:
            _on_adapter_load(lora, ins, heap, i, t, x)
        # a request-left event only moves the instance's clock
        if asc is not None:
            asx.after_instance_event(asc, ins, i, t)


PD_ARGUMENT, ASC_ARGUMENT, LORA_ARGUMENT = 11, 12, 13
"""The positions of ``pd``, ``asc`` and ``lora`` among :func:`run_events`' arguments."""

# ------------------------------------------------------------------ entry points


@njit(cache=True)
def push_cluster_arrivals(heap, arrival, rows, seqs):
    """Schedule ``ClusterArrival`` events for ``rows`` (growing the heap when needed); returns
    the heap. ``seqs[k]`` is the event's sequence number, or -1 to take the next one (the
    initial workload); follow-ups bring the number reserved when their parent completed."""
    size = heap.loop[LoopSlot.HEAP_SIZE]
    if size + rows.shape[0] + 1 > heap.times.shape[0]:
        heap = grow_event_heap(heap, max(2 * heap.times.shape[0], size + rows.shape[0] + 16))
    for k in range(rows.shape[0]):
        seq = seqs[k]
        if seq < 0:
            seq = heap.loop[LoopSlot.NEXT_SEQ]
            heap.loop[LoopSlot.NEXT_SEQ] += 1
        size = heap_push(heap.times, heap.ties, heap.kinds, heap.payloads, size,
                         arrival[rows[k]],
                         make_tie(_CLUSTER, 0, EventPriority.CLUSTER_ARRIVAL, seq),
                         Event.CLUSTER_ARRIVAL, rows[k])
    heap.loop[LoopSlot.HEAP_SIZE] = size
    return heap


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _scorers_known(rt, hooks):
    """True when every scorer code of the policy ``rt`` is one the kernel implements."""
    for s in range(rt.scorer_codes.shape[0]):
        if not is_known_scorer(rt.scorer_codes[s], len(hooks.scorer_table)):
            return False
    return True


@njit(cache=True, _nrt=False, inline="always", error_model="numpy")
def _config_status(cfg, rt, hooks, pd):
    """Status.OK, or the error status of a code no kernel implements (the codes are checked
    before the run, never fallen through)."""
    ints = cfg.ints
    if not is_known_backend(ints[ConfigSlot.BACKEND]):
        return Status.UNKNOWN_BACKEND
    for i in range(cfg.inst.shape[0]):
        if not is_known_backend(cfg.inst[i, InstanceSlot.BACKEND]):
            return Status.UNKNOWN_BACKEND
    if ints[ConfigSlot.N_INSTANCES] > MAX_INSTANCES:
        return Status.TOO_MANY_INSTANCES
    if not (0 <= ints[ConfigSlot.PRIORITY] < len(Priority)
            and 0 <= ints[ConfigSlot.SCHEDULER] < len(Scheduler)
            and adm.is_known_policy(rt.rcfg[RouterCfg.ADMISSION])
            and rtk.is_known_policy(rt.rcfg[RouterCfg.ROUTING])):
        return Status.UNKNOWN_POLICY
    if not _scorers_known(rt, hooks):
        return Status.UNKNOWN_POLICY
    if pd is not None:
        if not (_scorers_known(pd.rt_prefill, hooks) and _scorers_known(pd.rt_decode, hooks)):
            return Status.UNKNOWN_POLICY
    return Status.OK


__all__ = ["ASC_ARGUMENT", "LORA_ARGUMENT", "PD_ARGUMENT", "SEQ_LIMIT", "EventHeap", "push_cluster_arrivals", "run_events"]
