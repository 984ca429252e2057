"""The engine's state layouts: the NamedTuple groups the kernels take, their slot constants, and
the constructors that allocate them (plain NumPy, called from ``blis_fast/engine/packing.py`` and ``simulate.py``).

Groups (each a ``NamedTuple`` of arrays, so a kernel signature names a handful of them):

* :class:`SimConfig` – the run's configuration: integer slots (:data:`ConfigSlot`), the latency
  backend's packed parameters and alpha, the instances' rank in id order, per-instance
  configuration (:data:`InstanceSlot`);
* :class:`RequestInputs` – per-request inputs (arrival, lengths, deadline, id rank, session);
* :class:`RequestArrays` – per-request mutable state; the fields every step touches share one
  64-byte row ``hot[r, HotField.*]``;
* :class:`InstanceArrays` – per-instance counters (:data:`InstanceCounter`), wait queue
  (:data:`QueueField`), running batch, wait-queue statistics, rejection counts;
* :class:`StepLog` – growable per-step logs and the ITL run pool (cursors :data:`LogCursor`);
* :class:`EventHeap` – the event heap's arrays (``kernels/engine/heap.py``) and the loop's scalars
  (:data:`LoopSlot`); :class:`SessionBuffers` – closed-loop outcomes for the session driver
  (columns :data:`OutcomeField`); :class:`Work` – scratch buffers; :class:`KernelHooks` – the
  scorer table and the user's admission and scheduler-key hooks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from blis_fast.kernels.buffers import copy_range
from blis_fast.kernels.cluster import hooks as hk
from blis_fast.kernels.go.gomath import INT64_MAX
from blis_fast.kernels.jit import njit


class ConfigSlotT(NamedTuple):
    """Slots of ``SimConfig.ints``, filled by the engine, from a policy registry or from the
    options row that names the slot (``slot="ConfigSlot.X"``): the slot numbers are frozen
    into compiled kernels, so they are declared here, in a kernel module (docs/extending.md)."""

    N_INSTANCES: int = 0
    HORIZON: int = 1
    MAX_RUNNING: int = 2  # --max-num-running-reqs
    MAX_TOKENS: int = 3  # --max-num-scheduled-tokens
    LONG_PREFILL: int = 4  # --long-prefill-token-threshold
    MAX_MODEL_LEN: int = 5  # the global value; instances read InstanceSlot.MAX_MODEL_LEN
    ADMISSION_LATENCY: int = 6
    ROUTING_LATENCY: int = 7
    PRIORITY: int = 8  # Priority code
    SCHEDULER: int = 9  # Scheduler code
    BACKEND: int = 10  # the global latency Backend code; instances read InstanceSlot.BACKEND
    OUTPUT_TOKEN_TIME: int = 11  # alpha2 as ticks
    POST_DECODE: int = 12  # the global post-decode overhead; instances read InstanceSlot's
    SIZE: int = 13


ConfigSlot = ConfigSlotT()


class InstanceSlotT(NamedTuple):
    """Columns of ``SimConfig.inst`` (one row per instance): configuration that can differ
    between instances (pools of different GPUs or TP, instances added later)."""

    MAX_MODEL_LEN: int = 0  # 0 = unlimited
    LATENCY_CLASS: int = 1  # row of SimConfig.latency_params its steps are timed with
    BACKEND: int = 2  # latency Backend code of its steps, queueing delay and post-decode time
    POST_DECODE: int = 3  # fixed post-decode overhead (ticks) of its latency backend
    SIZE: int = 4


InstanceSlot = InstanceSlotT()


class InstanceCounterT(NamedTuple):
    """Columns of ``InstanceArrays.cnt`` (one row per instance)."""

    COMPLETED: int = 0
    DROPPED: int = 1
    TIMED_OUT: int = 2
    LENGTH_CAPPED: int = 3
    IN_TOKENS: int = 4
    OUT_TOKENS: int = 5
    PREEMPTIONS: int = 6
    KV_FAILURES: int = 7
    IN_FLIGHT: int = 8  # routed to the instance and not finished there (CLU-3.5)
    PEAK_KV: int = 9
    STEPS: int = 10
    CLOCK: int = 11
    LAST_STEP: int = 12  # the instance's last step-log entry (-1 = none)
    STEP_PENDING: int = 13  # 1 while a step event of the instance is in the heap
    DONE_IN_STEP: int = 14  # requests the last step will finish (0: skip completions)
    IDLE_SKIPPED: int = 15  # steps without work counted but not logged (step.skip_idle_steps)
    BELOW_FLOOR: int = 16  # steps the backend timed below their physical floor
    FLOOR_WORST_PPM: int = 17  # the lowest step time / floor of those, in parts per million
    # the cycle search of kernels/engine/livelock.py (Brent's algorithm): the closed stretch it
    # is in (LoopSlot.OTHER_EVENTS + 1), the stored fingerprint, the power and the count since,
    # and the stretch in which this instance was proven to cycle
    CYCLE_EPOCH: int = 18
    CYCLE_FP_A: int = 19
    CYCLE_FP_B: int = 20
    CYCLE_POWER: int = 21
    CYCLE_LAM: int = 22
    CYCLE_PROVEN: int = 23
    SIZE: int = 24


InstanceCounter = InstanceCounterT()


class QueueFieldT(NamedTuple):
    """Columns of ``InstanceArrays.wq``: the wait queue, an intrusive doubly linked list."""

    HEAD: int = 0
    TAIL: int = 1
    LEN: int = 2


QueueField = QueueFieldT()


class QueueStatT(NamedTuple):
    """Columns of ``InstanceArrays.wq_sum``: per-step wait-queue lengths summed, and steps."""

    LENGTH_SUM: int = 0
    STEPS: int = 1


QueueStat = QueueStatT()


class RejectionT(NamedTuple):
    """Entries of ``InstanceArrays.rejected``: cluster-wide rejection counts."""

    ADMISSION: int = 0
    ROUTING: int = 1


Rejection = RejectionT()


class HotFieldT(NamedTuple):
    """Columns of ``RequestArrays.hot`` (one 64-byte row per request)."""

    PROGRESS: int = 0  # progress index: tokens processed
    NEW_TOKENS: int = 1  # tokens granted this step (NumNewTokens)
    COMPUTED: int = 2  # tokens whose KV is present
    ITL_SUM: int = 3  # ITL sum of the current attempt
    ITL_COUNT: int = 4
    RUN_TAIL: int = 5  # last ITL run of the request (-1 = none)
    LAST_DECODE: int = 6  # step-log entry of its last decode step (-1 = none)
    TTFT_SET: int = 7
    SIZE: int = 8


HotField = HotFieldT()


class LogCursorT(NamedTuple):
    """Entries of ``StepLog.sizes``."""

    STEPS: int = 0  # step-log entries used
    RUNS: int = 1  # ITL runs used
    ENTRIES: int = 2  # calls of the event loop (re-entries after growth or sessions)


LogCursor = LogCursorT()


class LoopSlotT(NamedTuple):
    """Slots of ``EventHeap.loop``: the loop's scalars kept between calls."""

    HEAP_SIZE: int = 0
    NEXT_SEQ: int = 1  # the next event sequence number
    PENDING_OUTCOMES: int = 2  # session outcomes recorded since the driver last took them
    FOLLOW_UP_TICK: int = 3  # earliest tick one of them could bring a follow-up arrival
    STOP_KIND: int = 4  # why the loop returned Status.LIVELOCK (enums.Livelock; 0 = it did not)
    STOP_ROW: int = 5  # the request that can never finish (-1: none named)
    STOP_INST: int = 6  # its instance
    STOP_NEED: int = 7  # the KV blocks it needs to finish
    OTHER_EVENTS: int = 8  # events popped that were not instance steps (kernels/engine/livelock.py)
    STOP_AT: int = 9  # the loop returns Status.PAUSED before an event at or after this tick
    SIZE: int = 10


LoopSlot = LoopSlotT()


class OutcomeFieldT(NamedTuple):
    """Columns of ``SessionBuffers.outcomes``."""

    ROW: int = 0
    TICK: int = 1
    OUTCOME: int = 2  # SessionOutcome code
    PROGRESS: int = 3  # progress index of the finished request
    SEQ: int = 4  # sequence number reserved for the follow-up's arrival (-1 = none)
    SIZE: int = 5


OutcomeField = OutcomeFieldT()

NO_TICK = INT64_MAX
"""``LoopSlot.FOLLOW_UP_TICK`` when no recorded outcome can bring a follow-up."""
ITL_RUN_END = 1 << 32
"""While the kernel runs, ``StepLog.itl_count`` holds marks: +1 at a completed ITL run's first
step, +ITL_RUN_END at its last; ``itl_counts_from_marks`` turns them into per-step counts."""


class SimConfig(NamedTuple):
    """The run's configuration as the kernels read it."""

    ints: np.ndarray  # int64 [ConfigSlot.SIZE]
    latency_params: np.ndarray  # float64 [classes, P]: the backend's layout (kernels/engine/latency.py)
    alpha: np.ndarray  # float64 [3]
    instance_rank: np.ndarray  # int64 [n_instances]: rank of ``instance_<i>`` in string order
    inst: np.ndarray  # int64 [n_instances, InstanceSlot.SIZE]: per-instance configuration


class RequestInputs(NamedTuple):
    """Per-request inputs (rows in injection order; closed-loop follow-ups are appended between
    kernel calls)."""

    arrival: np.ndarray  # int64 ticks
    input_len: np.ndarray  # int64
    output_len: np.ndarray  # int64
    deadline: np.ndarray  # int64 ticks (0 = none)
    id_rank: np.ndarray  # int64 rank of the request id in string order (scheduler ties)
    session: np.ndarray  # int32 closed-loop session blueprint of the request (-1 = none)
    adapter: np.ndarray  # int32 LoRA adapter (index of RequestTable.adapter_names; -1 = none)


class RequestArrays(NamedTuple):
    """Per-request mutable state."""

    hot: np.ndarray  # int64 [n, HotField.SIZE]
    state: np.ndarray  # int8 RequestState
    inst: np.ndarray  # int32 instance (-1 = none)
    first_token: np.ndarray  # int64 ticks from arrival to the first token
    ttft: np.ndarray
    has_ttft: np.ndarray  # int8
    sched_delay: np.ndarray
    has_sched: np.ndarray  # int8
    sched_step: np.ndarray  # the instance step that admitted it last
    fin_step: np.ndarray  # the instance step that finished it
    capped: np.ndarray  # int8: completed at the max-model-len cap
    priority: np.ndarray  # float64, recomputed each step it waits by the priority policy
    max_out: np.ndarray  # int64 output budget (0 = up to max-model-len)
    e2e: np.ndarray
    registered: np.ndarray  # int8 Registration
    wq_prev: np.ndarray  # wait-queue links
    wq_next: np.ndarray
    run_head: np.ndarray  # first ITL run of the current attempt (-1 = none)
    sort_key: np.ndarray  # float64: the custom scheduler's key, computed each step
    pd_sub: np.ndarray  # int8: 1 = a P/D decode sub-request (admitted for one token, PD-3.11)
    preemptions: np.ndarray  # int32: times the request was preempted (batch._preempt)
    cached_prefix: np.ndarray  # int64: leading prompt tokens found in the prefix cache at its
    # last admission from the wait queue (full blocks x block size; the prefill skips them)


class InstanceArrays(NamedTuple):
    """Per-instance state and counters."""

    cnt: np.ndarray  # int64 [N, InstanceCounter.SIZE]
    kv_integral: np.ndarray  # float64 [N] time integral of used blocks
    wq: np.ndarray  # int64 [N, 3] QueueField
    batch: np.ndarray  # int64 [N, max_running] running batch
    batch_len: np.ndarray  # int64 [N]
    wq_sum: np.ndarray  # int64 [N, 2] QueueStat
    rejected: np.ndarray  # int64 [2] Rejection


class StepLog(NamedTuple):
    """Per-step logs and the pool of ITL runs (both grow; cursors in ``sizes``)."""

    time: np.ndarray
    inst: np.ndarray
    dur: np.ndarray
    next_same: np.ndarray  # the instance's next entry (-1 = none)
    queue: np.ndarray
    running: np.ndarray
    kv_used: np.ndarray
    itl_count: np.ndarray  # ITL samples of the step (marks while running, see ITL_RUN_END)
    run_start: np.ndarray
    run_last: np.ndarray
    run_next: np.ndarray
    sizes: np.ndarray  # int64 [3] LogCursor


class EventHeap(NamedTuple):
    """The event heap's parallel arrays (key time and tie, kind, payload; ``kernels/engine/heap.py``)
    and the loop's scalars (``loop[LoopSlot.*]``)."""

    times: np.ndarray
    ties: np.ndarray
    kinds: np.ndarray
    payloads: np.ndarray
    loop: np.ndarray


class SessionBuffers(NamedTuple):
    """Closed-loop sessions: least think time per blueprint, and the outcomes recorded for the
    session driver since it last took them (rows of OutcomeField)."""

    think: np.ndarray
    outcomes: np.ndarray


class Work(NamedTuple):
    """Scratch buffers of the loop."""

    queue_a: np.ndarray  # wait-queue order while sorting; then the requests a step admitted
    queue_b: np.ndarray  # merge-sort buffer
    cached: np.ndarray  # block ids of a request's cached prefix
    scratch: np.ndarray  # block ids found by a tiered reload
    progress: np.ndarray  # the scheduled requests' progress, new tokens and lengths (step time)
    new_tokens: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    key_features: np.ndarray  # float64 [hooks.KEY_COLS]: what the scheduler-key hook sees
    # the KV tier chain's secondary tiers (kernels/kv/kv_chain.py: ChainState), None without:
    # carried here, not in KVState, so that a run without them compiles none of their code
    chain: Any = None


class KernelHooks(NamedTuple):
    """The scorer table (cfuncs, ``policies.scorer_table``) and the user's admission rule and
    scheduler key (placeholders when unused); see ``kernels/cluster/hooks.py``."""

    scorer_table: tuple
    admit: object
    sort_key: object


def new_request_arrays(n: int, max_output_len: np.ndarray) -> RequestArrays:
    """Fresh per-request state."""
    hot = np.zeros((n, HotField.SIZE), np.int64)
    hot[:, HotField.RUN_TAIL] = -1
    hot[:, HotField.LAST_DECODE] = -1
    return RequestArrays(
        hot=hot, state=np.zeros(n, np.int8), inst=np.full(n, -1, np.int32),
        first_token=np.zeros(n, np.int64), ttft=np.zeros(n, np.int64),
        has_ttft=np.zeros(n, np.int8), sched_delay=np.zeros(n, np.int64),
        has_sched=np.zeros(n, np.int8), sched_step=np.zeros(n, np.int64),
        fin_step=np.zeros(n, np.int64), capped=np.zeros(n, np.int8),
        priority=np.zeros(n, np.float64), max_out=max_output_len.astype(np.int64).copy(),
        e2e=np.zeros(n, np.int64), registered=np.zeros(n, np.int8),
        wq_prev=np.full(n, -1, np.int64), wq_next=np.full(n, -1, np.int64),
        run_head=np.full(n, -1, np.int64), sort_key=np.zeros(n, np.float64),
        pd_sub=np.zeros(n, np.int8), preemptions=np.zeros(n, np.int32),
        cached_prefix=np.zeros(n, np.int64),
    )


def new_instance_arrays(n_inst: int, max_batch: int) -> InstanceArrays:
    """Fresh per-instance state."""
    cnt = np.zeros((n_inst, InstanceCounter.SIZE), np.int64)
    cnt[:, InstanceCounter.LAST_STEP] = -1
    wq = np.zeros((n_inst, len(QueueField)), np.int64)
    wq[:, QueueField.HEAD] = -1
    wq[:, QueueField.TAIL] = -1
    return InstanceArrays(cnt=cnt, kv_integral=np.zeros(n_inst, np.float64), wq=wq,
                          batch=np.zeros((n_inst, max_batch), np.int64),
                          batch_len=np.zeros(n_inst, np.int64),
                          wq_sum=np.zeros((n_inst, len(QueueStat)), np.int64),
                          rejected=np.zeros(len(Rejection), np.int64))


def new_step_log(step_cap: int, run_cap: int) -> StepLog:
    """Step log and ITL run pool with the given initial capacities."""
    return StepLog(
        time=np.zeros(step_cap, np.int64), inst=np.zeros(step_cap, np.int32),
        dur=np.zeros(step_cap, np.int64), next_same=np.full(step_cap, -1, np.int64),
        queue=np.zeros(step_cap, np.int32), running=np.zeros(step_cap, np.int32),
        kv_used=np.zeros(step_cap, np.int64), itl_count=np.zeros(step_cap, np.int64),
        run_start=np.zeros(run_cap, np.int64), run_last=np.zeros(run_cap, np.int64),
        run_next=np.full(run_cap, -1, np.int64), sizes=np.zeros(len(LogCursor), np.int64),
    )


def new_event_heap(cap: int) -> EventHeap:
    """An empty event heap with room for ``cap`` events (no pending session outcomes)."""
    loop = np.zeros(LoopSlot.SIZE, np.int64)
    loop[LoopSlot.FOLLOW_UP_TICK] = NO_TICK
    loop[LoopSlot.STOP_AT] = NO_TICK
    return EventHeap(np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int8),
                     np.empty(cap, np.int64), loop)


def new_work(n_requests: int, max_batch: int, max_chunks: int, chain: Any = None) -> Work:
    """Scratch buffers for ``n_requests`` rows, a batch of ``max_batch`` and ``max_chunks``;
    ``chain`` is the KV tier chain's secondary tiers (None without)."""
    qbuf = max(n_requests, max_batch) + 1
    return Work(queue_a=np.empty(qbuf, np.int64), queue_b=np.empty(qbuf, np.int64),
                cached=np.empty(max_chunks + 1, np.int64),
                scratch=np.empty(max_chunks + 1, np.int64),
                progress=np.empty(max_batch + 1, np.int64),
                new_tokens=np.empty(max_batch + 1, np.int64),
                input_len=np.empty(max_batch + 1, np.int64),
                output_len=np.empty(max_batch + 1, np.int64),
                key_features=np.zeros(hk.KEY_COLS, np.float64), chain=chain)


@njit(cache=True)
def grow_step_log(lg, need_steps, need_runs):
    """The step log with room for ``need_steps`` more steps and ``need_runs`` more ITL runs
    (capacities doubled as needed; the used entries copied)."""
    steps = lg.sizes[LogCursor.STEPS]
    runs = lg.sizes[LogCursor.RUNS]
    ns = lg.time.shape[0]
    nr = lg.run_start.shape[0]
    if steps + need_steps <= ns and runs + need_runs <= nr:
        return lg
    while steps + need_steps > ns:
        ns *= 2
    while runs + need_runs > nr:
        nr *= 2
    return StepLog(_grown(lg.time, steps, ns, 0), _grown(lg.inst, steps, ns, 0),
                   _grown(lg.dur, steps, ns, 0), _grown(lg.next_same, steps, ns, -1),
                   _grown(lg.queue, steps, ns, 0), _grown(lg.running, steps, ns, 0),
                   _grown(lg.kv_used, steps, ns, 0), _grown(lg.itl_count, steps, ns, 0),
                   _grown(lg.run_start, runs, nr, 0), _grown(lg.run_last, runs, nr, 0),
                   _grown(lg.run_next, runs, nr, -1), lg.sizes)


@njit(cache=True)
def _grown(a, used, cap, fill):
    """A copy of ``a[:used]`` in a new array of ``cap`` entries (the rest ``fill``)."""
    out = np.full(cap, fill, a.dtype)
    copy_range(out, 0, a, 0, used)
    return out


@njit(cache=True)
def grow_event_heap(heap, cap):
    """The heap's events in arrays of ``cap`` entries (the loop scalars are shared)."""
    size = heap.loop[LoopSlot.HEAP_SIZE]
    times = np.empty(cap, np.int64)
    ties = np.empty(cap, np.int64)
    kinds = np.empty(cap, np.int8)
    payloads = np.empty(cap, np.int64)
    copy_range(times, 0, heap.times, 0, size)
    copy_range(ties, 0, heap.ties, 0, size)
    copy_range(kinds, 0, heap.kinds, 0, size)
    copy_range(payloads, 0, heap.payloads, 0, size)
    return EventHeap(times, ties, kinds, payloads, heap.loop)
