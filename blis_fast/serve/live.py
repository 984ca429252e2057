"""The live simulation behind ``blis serve``: the engine of ``blis run`` advanced by the caller's
clock, taking requests while it runs.

How it stays the same simulation as a run. The engine is the one ``blis run`` uses (the Numba
event loop ``kernels/engine/event_loop.py: run_events`` over the state groups
``engine/packing.py`` builds), called again and again: :meth:`LiveSimulation.advance` to ``T``
sets the loop slot ``STOP_AT`` to ``T`` and the loop returns ``Status.PAUSED`` before the first
event at or after ``T`` (so a request submitted at ``T`` still joins a step that starts at
``T``, as a request does in the run whose trace has it arriving at ``T``); the one look-ahead of
the loop (``step.skip_idle_steps``, which jumps over empty steps up to the next event) stops at
``STOP_AT`` too. Nothing else in the loop reads the future, so the events before ``T`` are those
of the run with the same arrivals, however the clock is cut into calls. A submitted request
gets the next free row of preallocated request arrays (as a closed-loop follow-up does,
``engine/follow_ups.py``), its block digests drawn from the ``--seed`` source exactly as
``blis replay`` draws the ids of a trace's rows (``kernels/generation/replay_tokens.py``), and
its ``ClusterArrival`` event. When the rows (or the KV block-list pool, or the digest room)
are used up, the simulation is rebuilt with twice the room and the log of submissions and
cancellations replayed into it up to the current time: the simulation is deterministic, so
the rebuilt one is the same (the caller sees a pause, never a change).

Token times are read, never computed again: a request's first token is ``arrival + TTFT`` of
the engine (``RequestArrays.first_token``), each later token follows by the duration of the
decode step that made it plus the output-token time (``ITL`` samples, ``HotField.ITL_SUM``),
walking the request's ITL runs in the step log; the stream ends at ``arrival + E2E``
(post-decode overhead included). These are exactly the per-request figures of the run.

Not supported (refused with one line): P/D disaggregation and the autoscaler. Closed-loop
sessions do not apply (clients send their next request themselves).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
from numba.core.ccallback import CFunc
from numba.core.errors import NumbaExperimentalFeatureWarning
from numba.core.types.function_type import WrapperAddressProtocol

from blis_fast.engine.follow_ups import FollowUpRows
from blis_fast.engine.livelock import livelock_error
from blis_fast.engine.packing import (
    Capacity,
    config_ints,
    instance_config,
    instance_rank_of,
    kv_state,
    lora_state,
    request_inputs,
    request_metadata,
    router_state,
)
from blis_fast.engine.results import raise_failure
from blis_fast.engine.simulate import (
    _check_growth,
    _compiled_overload,
    _kernel_hooks,
    hook_errors,
)
from blis_fast.errors import BlisConfigError
from blis_fast.files import OutputPlan
from blis_fast.kernels.engine.event_loop import push_cluster_arrivals, run_events
from blis_fast.kernels.engine.latency import queueing_time
from blis_fast.kernels.engine.live_ops import abort_request, route_to
from blis_fast.kernels.engine.state import (
    ConfigSlot,
    HotField,
    InstanceCounter,
    InstanceSlot,
    KernelHooks,
    LogCursor,
    LoopSlot,
    OutcomeField,
    QueueField,
    SessionBuffers,
    SimConfig,
    grow_event_heap,
    grow_step_log,
    new_event_heap,
    new_instance_arrays,
    new_request_arrays,
    new_step_log,
    new_work,
)
from blis_fast.kernels.enums import Registration, RequestState, Status
from blis_fast.kernels.generation.token_ids import draw_token_ids
from blis_fast.kernels.go import gorand
from blis_fast.kernels.go.gomath import INT64_MAX
from blis_fast.kernels.hashing import block_digests
from blis_fast.kernels.kv.kv_layout import BlockList, CpuMeta, KVConfig, KVMeta, pool_slots
from blis_fast.runner import prepare
from blis_fast.workload.request_table import RequestTable
from blis_fast.workload.trace_v2 import TraceOutcome, build_trace_csv, build_trace_header

__all__ = ["Emitted", "InstanceGauges", "LiveSimulation", "serve_engine_config"]

DEFAULT_ROWS = 4096
"""Request rows reserved at the start (doubled, by a rebuild, whenever they are used up)."""
_SLOTS_PER_ROW = 80  # KV block-list slots and block digests reserved per row at the start

_RUNNING = "running"
_STATUS_OF_STATE = {RequestState.COMPLETED: "completed", RequestState.TIMED_OUT: "timed_out",
                    RequestState.DROPPED: "dropped", RequestState.ABORTED: "aborted"}


class Emitted(NamedTuple):
    """What the simulation produced for one request up to the time advanced to (a named tuple:
    one is made per request and token instant, and a frozen dataclass cost ~1.5 µs each).

    ``tokens``: the simulated times (µs) of its new output tokens, in order; ``finished``: the
    request ended (its last token is among these, or it ended otherwise) and ``end_us`` is the
    simulated time it ended (a completed request's ``arrival + E2E``: the last token plus the
    backend's post-decode overhead); ``status``: ``running``, ``completed``, ``timed_out``,
    ``rejected`` (admission or routing refused it), ``aborted`` (cancelled) or ``dropped``
    (unservable: over max-model-len or the KV cache); ``instance``: the instance it was
    routed to (-1: not yet, or never); ``scheduled_us``: when a step first admitted it from
    the wait queue (its queueing time is ``scheduled_us - arrival``; None: not yet)."""

    handle: int
    tokens: tuple[int, ...]
    finished: bool
    status: str
    end_us: int | None = None
    instance: int = -1
    scheduled_us: int | None = None


@dataclass(frozen=True)
class InstanceGauges:
    """Per instance (arrays indexed by instance): requests in the running batch and in the wait
    queue, the fraction of GPU KV blocks in use, and the prefix cache's cumulative lookups and
    hits, in blocks (vLLM's ``prefix_cache_queries``/``hits`` count tokens: times the block
    size)."""

    running: np.ndarray
    waiting: np.ndarray
    kv_usage: np.ndarray
    prefix_queries: np.ndarray
    prefix_hits: np.ndarray


def serve_engine_config(options: Any):
    """The ``EngineConfig`` of a live simulation: ``options`` validated and resolved as
    ``blis run`` does (``runner.prepare``; its workload is generated and dropped), the horizon
    unbounded unless given. P/D and the autoscaler are refused (``BlisConfigError``)."""
    prepared = prepare(options)
    engine = prepared.engine
    if engine.pd_on:
        raise BlisConfigError("blis serve does not support P/D disaggregation yet "
                              "(--prefill-instances/--decode-instances)")
    if engine.autoscale is not None:
        raise BlisConfigError("blis serve does not support the autoscaler yet "
                              "(--model-autoscaler-interval-us)")
    if not options.given("horizon"):
        engine = replace(engine, options=replace(engine.options, horizon=INT64_MAX))
    return engine, prepared.latency.model


def _id_key(k: int) -> int:
    """An int64 whose order is the byte order of ``request_<k>`` among such ids (the scheduler's
    tie-break reads only the order): the decimal digits, each + 1, in base 11, left-aligned on
    17 places (a shorter id sorts first, as a prefix does)."""
    key = 0
    digits = str(k)[:17]
    for place in range(17):
        key = key * 11 + (int(digits[place]) + 1 if place < len(digits) else 0)
    return key


@dataclass
class _Track:
    """The tokens of one request the caller has not yet been told about."""

    row: int
    sent: int = 0  # tokens handed out (of any attempt: a preempted request's are not resent)
    preemptions: int = 0  # the attempt the times below belong to
    times: list[int] = field(default_factory=list)  # token times of the current attempt
    cum: int = -1  # the last token time (-1: no first token yet in this attempt)
    run: int = -1  # the ITL run being walked and its last step walked (-1: none yet)
    step: int = -1
    end_us: int = -1  # when it ended in the simulation (-1: not ended)
    status: str = _RUNNING


@dataclass
class _Row:
    """A submission as the rebuild needs it again."""

    arrival: int
    input_len: int
    output_len: int
    deadline: int
    digests: np.ndarray
    instance: int  # -1: the router chooses


class _HookAddress(WrapperAddressProtocol):
    """A compiled hook (a ``cfunc``) seen through numba's wrapper-address protocol: the same
    function type (so the same compiled event loop), its address read once. Numba unboxes a
    first-class function argument on every call of the loop; for a ``cfunc`` that compares
    its signature with the expected one each time (~2 µs a hook, ten hooks, a call per event
    of the live loop), for this object it asks for the address only."""

    def __init__(self, cfunc: CFunc) -> None:
        self.cfunc = cfunc
        self._address = int(cfunc.address)
        self._sig = cfunc._sig

    def __wrapper_address__(self) -> int:
        return self._address

    def signature(self):
        return self._sig


def _addressed_hooks(hooks: KernelHooks) -> KernelHooks:
    """``hooks`` with every ``cfunc`` in it as a :class:`_HookAddress` (anything else kept)."""
    def one(f: Any) -> Any:
        return _HookAddress(f) if isinstance(f, CFunc) else f
    return KernelHooks(tuple(one(f) for f in hooks.scorer_table), one(hooks.admit),
                       one(hooks.sort_key))


class _Engine:
    """The engine's state for ``rows`` request rows, and the kernel calls over it."""

    def __init__(self, cfg, model: str, room: Capacity) -> None:
        self.cfg = cfg
        self.room = room
        opts = cfg.options
        table = RequestTable.empty(block_size=opts.block_size_in_tokens, seed=opts.seed,
                                   clients=[{}])
        n = room.rows
        n_inst = opts.num_instances
        max_batch = max(1, min(opts.max_num_running_reqs, n))
        self.inp = request_inputs(table, n, None)
        self.kv = kv_state(table, cfg, self.inp, room)
        self.rs = new_request_arrays(n, np.zeros(n, np.int64))
        self.ins = new_instance_arrays(n_inst, max_batch)
        self.lg = new_step_log(max(1024, 4 * n), max(1024, 2 * n))
        self.meta = request_metadata(table, cfg, model)
        self.rt = router_state(cfg, n, self.meta, self.kv, room)
        self.heap = new_event_heap(3 * n + 4 * n_inst + 16)
        self.work = new_work(n, max_batch, room.max_chunks)
        self.sess = SessionBuffers(np.zeros(1, np.int64),
                                   np.zeros((2 * max_batch + 64, OutcomeField.SIZE), np.int64))
        self.rows = FollowUpRows(0, int(self.kv.pool.shape[0] - room.pool - 1))
        self.sim_cfg = SimConfig(config_ints(cfg, self.rt), cfg.latency_params_by_class(),
                                 np.ascontiguousarray(cfg.latency.alpha, np.float64),
                                 instance_rank_of(n_inst), instance_config(cfg))
        self.lora = lora_state(cfg, table, n)  # None: no request names an adapter
        self.hooks = _addressed_hooks(_kernel_hooks(cfg.hooks))
        self.entry = run_events
        self.tiered = bool(self.kv.cfg[KVConfig.TIERED] == 1)
        self.compactions = 0  # of the step log (compact_log)

    def fits(self, row: _Row) -> bool:
        """Whether ``row`` fits the room left (else the simulation is rebuilt bigger)."""
        k = self.rows.n
        nch = row.digests.shape[0]
        slots = int(pool_slots(row.input_len, row.output_len,
                               int(self.kv.cfg[KVConfig.BLOCK_SIZE]), self.tiered))
        return (k < self.inp.arrival.shape[0] and nch <= self.room.max_chunks
                and int(self.kv.chunk_off[k]) + nch <= self.kv.chunk_dig.shape[0]
                and self.rows.pool_cursor + slots < self.kv.pool.shape[0])

    def add(self, row: _Row) -> int:
        """Append ``row`` (it fits) and schedule its arrival; returns its row index."""
        k = self.rows.n
        inp, kv, rt, meta = self.inp, self.kv, self.rt, self.meta
        inp.arrival[k] = row.arrival
        inp.input_len[k] = row.input_len
        inp.output_len[k] = row.output_len
        inp.deadline[k] = row.deadline
        inp.id_rank[k] = _id_key(k)
        self.rs.max_out[k] = row.output_len
        c0 = int(kv.chunk_off[k])
        nch = row.digests.shape[0]
        kv.chunk_dig[c0: c0 + nch] = row.digests
        kv.chunk_off[k + 1] = c0 + nch
        kv.req[k, BlockList.OFFSET] = self.rows.pool_cursor
        self.rows.pool_cursor += int(pool_slots(row.input_len, row.output_len,
                                                int(kv.cfg[KVConfig.BLOCK_SIZE]), self.tiered))
        if k + 1 < inp.arrival.shape[0]:
            kv.req[k + 1, BlockList.OFFSET] = self.rows.pool_cursor
        rt.req_priority[k] = meta.client_priority[0]
        rt.req_sheddable[k] = meta.client_priority[0] < 0
        rt.req_tenant[k] = meta.client_tenant[0]
        rt.req_model_bad[k] = meta.client_model_bad[0]
        self.rows.n = k + 1
        if row.instance < 0:
            self.heap = push_cluster_arrivals(self.heap, inp.arrival, np.array([k], np.int64),
                                              np.array([-1], np.int64))
        else:
            if self.heap.loop[LoopSlot.HEAP_SIZE] + 2 > self.heap.times.shape[0]:
                self.heap = grow_event_heap(self.heap, 2 * self.heap.times.shape[0])
            route_to(self.rs, self.ins, self.rt, self.heap, k, row.instance, row.arrival)
        return k

    def run_until(self, stop: int, compact=None) -> bool:
        """Process every event before tick ``stop`` (growing the heap and the step log); False
        when there was none (then no call: a call unboxes every state array, ~0.1 ms).
        ``compact`` (returns True when it made room) is tried before the step log grows."""
        heap = self.heap
        if heap.loop[LoopSlot.HEAP_SIZE] == 0 or heap.times[0] >= stop:
            return False
        self.heap.loop[LoopSlot.STOP_AT] = stop
        with warnings.catch_warnings(), hook_errors(self.cfg.hooks) as failures:
            warnings.simplefilter("ignore", NumbaExperimentalFeatureWarning)
            while True:
                args = (self.sim_cfg, self.inp, self.rs, self.ins, self.kv, self.lg, self.rt,
                        self.heap, self.work, self.hooks, self.sess, None, None, self.lora)
                status = self.entry(*args)
                if self.entry is run_events:
                    self.entry = _compiled_overload(run_events, args)
                if status == Status.GROW_HEAP:
                    _check_growth(2 * sum(a.nbytes for a in self.heap[:4]), self.ins, self.lg)
                    self.heap = grow_event_heap(self.heap, 2 * self.heap.times.shape[0])
                elif status == Status.GROW_LOG:
                    if compact is not None and compact():
                        continue
                    _check_growth(2 * sum(a.nbytes for a in self.lg[:-1]), self.ins, self.lg)
                    self.lg = grow_step_log(self.lg, 1, 2 * self.ins.batch.shape[1] + 1)
                elif status in (Status.PAUSED, Status.OK):
                    break
                elif status == Status.LIVELOCK and not failures:
                    raise livelock_error(self.heap.loop, self.kv.meta[:, KVMeta.TOTAL],
                                         self._table(), False)
                else:
                    raise_failure(status, failures)
        self.heap.loop[LoopSlot.STOP_AT] = INT64_MAX
        return True

    def log_full(self) -> bool:
        """Whether the step log or its ITL-run pool has no room for the next step (the loop's
        own test before a step)."""
        lg = self.lg
        max_batch = self.ins.batch.shape[1]
        return bool(lg.sizes[LogCursor.STEPS] + 1 > lg.time.shape[0]
                    or lg.sizes[LogCursor.RUNS] + 2 * max_batch + 1 > lg.run_start.shape[0])

    def compact_log(self, tracks: dict[int, _Track]) -> bool:
        """Drop the step-log entries and ITL runs no request still in the simulation refers
        to (every reference shifted: the request's runs and last decode step, the instances'
        last entries, ``tracks``' cursors, whose walks are up to date); True when at least half
        of the log and of the run pool was dropped and the loop has room again. Entries of
        requests that ended are dropped with their marks (``blis serve`` reads no ITL counts)."""
        lg, rs, hot = self.lg, self.rs, self.rs.hot
        n_steps = int(lg.sizes[LogCursor.STEPS])
        n_runs = int(lg.sizes[LogCursor.RUNS])
        n = self.rows.n
        state = rs.state[:n]
        live = np.flatnonzero(((state == RequestState.QUEUED) | (state == RequestState.RUNNING))
                              & (rs.run_head[:n] >= 0))
        heads = rs.run_head[live]
        step0 = int(lg.run_start[heads].min()) if live.shape[0] else n_steps
        run0 = int(heads.min()) if live.shape[0] else n_runs
        for track in tracks.values():
            if track.end_us < 0 and track.run >= 0:
                run0 = min(run0, track.run)
                step0 = min(step0, track.step if track.step >= 0 else n_steps,
                            int(lg.run_start[track.run]))
        if 2 * step0 < n_steps or 2 * run0 < n_runs:
            return False
        for a in lg[:8]:  # the per-step arrays
            a[: n_steps - step0] = a[step0:n_steps]
        lg.next_same[: n_steps - step0] = np.where(lg.next_same[: n_steps - step0] >= step0,
                                                   lg.next_same[: n_steps - step0] - step0, -1)
        for a in (lg.run_start, lg.run_last, lg.run_next):
            a[: n_runs - run0] = a[run0:n_runs]
        lg.run_start[: n_runs - run0] -= step0
        lg.run_last[: n_runs - run0] -= step0
        lg.run_next[: n_runs - run0] = np.where(lg.run_next[: n_runs - run0] >= run0,
                                                lg.run_next[: n_runs - run0] - run0, -1)
        lg.sizes[LogCursor.STEPS] = n_steps - step0
        lg.sizes[LogCursor.RUNS] = n_runs - run0
        last = self.ins.cnt[:, InstanceCounter.LAST_STEP]
        last[:] = np.where(last >= step0, last - step0, -1)
        for col, base in ((HotField.LAST_DECODE, step0), (HotField.RUN_TAIL, run0)):
            v = hot[:n, col]
            hot[:n, col] = np.where(v >= base, v - base, -1)
        rs.run_head[:n] = np.where(rs.run_head[:n] >= run0, rs.run_head[:n] - run0, -1)
        for track in tracks.values():
            if track.run >= 0:
                track.run -= run0
                track.step = track.step - step0 if track.step >= 0 else -1
        self.compactions += 1
        return not self.log_full()

    def _table(self) -> RequestTable:
        """The rows so far as a request table (for error messages naming a request)."""
        n = self.rows.n
        i64 = np.int64
        return RequestTable(
            arrival_us=self.inp.arrival[:n].copy(), input_len=self.inp.input_len[:n].copy(),
            output_len=self.inp.output_len[:n].copy(),
            max_output_len=self.inp.output_len[:n].copy(),
            deadline_us=self.inp.deadline[:n].copy(), prefix_length=np.zeros(n, i64),
            client_idx=np.zeros(n, np.int32),
            chunk_offsets=self.kv.chunk_off[: n + 1].astype(i64),
            chunk_digests=self.kv.chunk_dig[: int(self.kv.chunk_off[n])].astype(np.uint64),
            clients=[{}], block_size=int(self.kv.cfg[KVConfig.BLOCK_SIZE]),
            seed=int(self.cfg.options.seed))


class LiveSimulation:
    """A blis_fast cluster simulation that advances with the caller's clock and takes
    requests while it runs (the same admission, routing, batching, KV, preemption and latency
    as ``blis run`` with the same options)."""

    def __init__(self, options: Any, *, external_routing: bool = False,
                 rows: int = DEFAULT_ROWS) -> None:
        """``options``: a ``RunOptions`` (``options.build_options``); ``external_routing``:
        each request names its instance (per-instance endpoints), no admission or router;
        ``rows``: request rows reserved at the start (more are made by a rebuild)."""
        self._cfg, self._model = serve_engine_config(options)
        opts = self._cfg.options
        self._external = external_routing
        self._block = int(opts.block_size_in_tokens)
        self._timeout_us = int(opts.timeout) * 1_000_000 if opts.timeout > 0 else 0
        self._source = gorand.new_source(int(opts.seed))
        self._rows: list[_Row] = []
        self._ids: list[str | None] = []
        self._log: list[tuple[int, int, int]] = []  # (time, 0 submit / 1 cancel, row)
        self._tracks: dict[int, _Track] = {}
        self._active: np.ndarray | None = np.zeros(0, np.int64)  # rows of _tracks (None: stale)
        # per row: the engine figures last looked at (progress, state, registration,
        # preemptions; -1: never) and when the row has news next (INT64_MAX: none known)
        self._seen = np.full((0, 4), -1, np.int64)
        self._next = np.zeros(0, np.int64)
        self._final: list[str] = []  # per row: its last status told (or "running")
        self._first_sent: list[int] = []  # per row: time of its first token told (-1: none)
        self._last_sent: list[int] = []
        self._dirty = True  # the engine may have moved since the last _refresh
        self._now = 0  # the simulation has processed every event before this tick
        self._clock = 0  # the latest time the caller named (never goes back)
        self._otp = 0
        max_chunks = 4 * (opts.max_model_len // self._block + 2) if opts.max_model_len > 0 else 512
        rows = max(int(rows), int(opts.max_num_running_reqs), 16)
        # digest room of at least the blocks (GPU and CPU): the prefix tables are sized by
        # the smaller of the two, so they keep their layout when the room grows
        offload = self._cfg.kv_offload  # the tier chain's CPU tier (issue 32)
        chunks = max(rows * _SLOTS_PER_ROW, int(np.max(self._cfg.kv_blocks_per_instance())) + 1,
                     int(opts.kv_cpu_blocks) + 1, offload.cpu_blocks + 1 if offload else 0)
        self._eng = self._new_engine(Capacity(rows, chunks, rows * _SLOTS_PER_ROW, max_chunks))
        self._warm(max_chunks)

    def _warm(self, max_chunks: int) -> None:
        """Load every kernel a request can need (routing, a step, a cancellation, the heap's
        and the step log's growth, a drop's queueing delay) on a throwaway engine now, so that
        the first of each later costs no pause (a cached kernel's first call loads it)."""
        eng = _Engine(self._cfg, self._model, Capacity(16, 16 * _SLOTS_PER_ROW,
                                                       16 * _SLOTS_PER_ROW, max_chunks))
        tok = np.zeros(2 * self._block, np.int64)
        draw_token_ids(gorand.new_source(1), tok, 0, tok.shape[0])
        digests = np.empty(2, np.uint64)
        block_digests(tok, 0, self._block, 2, digests, 0)
        for instance in (-1, 0):
            eng.add(_Row(0, self._block, self._block, 0, digests, instance))
        eng.run_until(1)
        abort_request(eng.rs, eng.ins, eng.kv, eng.rt, eng.heap, 1)
        eng.heap = grow_event_heap(eng.heap, 2 * eng.heap.times.shape[0])
        eng.lg = grow_step_log(eng.lg, eng.lg.time.shape[0], 1)
        queueing_time(int(eng.sim_cfg.inst[0, InstanceSlot.BACKEND]), eng.sim_cfg.alpha, 1)

    def _new_engine(self, room: Capacity) -> _Engine:
        eng = _Engine(self._cfg, self._model, room)
        self._otp = int(eng.sim_cfg.ints[ConfigSlot.OUTPUT_TOKEN_TIME])
        return eng

    # ------------------------------------------------------------------ the interface

    @property
    def num_instances(self) -> int:
        """Instances of the simulated cluster."""
        return int(self._cfg.options.num_instances)

    @property
    def max_model_len(self) -> int:
        """The instances' max-model-len (0: unlimited)."""
        return int(self._cfg.options.max_model_len)

    @property
    def now_us(self) -> int:
        """The latest simulated time the caller named (``submit``, ``cancel``, ``advance``):
        no later call may name an earlier one."""
        return self._clock

    def submit(self, now_us: int, input_len: int, output_len: int, *,
               token_ids: np.ndarray | None = None, instance: int | None = None,
               request_id: str | None = None) -> int:
        """A request arriving at ``now_us`` with ``input_len`` prompt tokens and
        ``output_len`` output tokens (>= 1); returns its handle. ``token_ids`` (the prompt's,
        ``input_len`` of them) make its blocks' digests, so requests sharing a prefix share
        cached blocks; without them the ids are drawn as ``blis replay`` draws a trace row's
        (then ``write_trace`` + ``blis replay`` reproduce the run exactly). ``instance``: the
        instance, with ``external_routing`` only (required there)."""
        now_us = int(now_us)
        self._check_time(now_us, "submit")
        input_len, output_len = int(input_len), int(output_len)
        if input_len < 1 or output_len < 1:
            raise ValueError(f"submit: input_len and output_len must be >= 1, got "
                             f"{input_len} and {output_len}")
        if self._external:
            if instance is None or not 0 <= int(instance) < self.num_instances:
                raise ValueError(f"submit: instance must be in 0..{self.num_instances - 1} with "
                                 f"external routing, got {instance}")
        elif instance is not None:
            raise ValueError("submit: instance is chosen by the router (external_routing=False)")
        total = input_len + output_len
        tok = np.empty(total, np.int64)
        draw_token_ids(self._source, tok, 0, total)
        if token_ids is not None:
            ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
            if ids.shape[0] != input_len:
                raise ValueError(f"submit: {ids.shape[0]} token_ids for input_len {input_len}")
            tok[:input_len] = ids
        digests = np.empty(total // self._block, np.uint64)
        block_digests(tok, 0, self._block, total // self._block, digests, 0)
        deadline = now_us + self._timeout_us if self._timeout_us else 0
        row = _Row(now_us, input_len, output_len, deadline, digests,
                   -1 if instance is None else int(instance))
        # no need to run up to now first: the arrival's key orders it after every event before
        # now (and among arrivals at one tick, in submission order), so no kernel call here
        if not self._eng.fits(row):
            self._rebuild(row)
        k = self._eng.add(row)
        self._rows.append(row)
        self._ids.append(request_id)
        self._final.append(_RUNNING)
        self._first_sent.append(-1)
        self._last_sent.append(-1)
        self._log.append((now_us, 0, k))
        self._tracks[k] = _Track(k)
        self._active = None
        self._dirty = True
        if k >= self._next.shape[0]:
            cap = max(64, 2 * self._next.shape[0])
            self._seen = np.vstack([self._seen,
                                    np.full((cap - self._seen.shape[0], 4), -1, np.int64)])
            self._next = np.concatenate([self._next,
                                         np.full(cap - self._next.shape[0], INT64_MAX)])
        self._seen[k] = -1
        self._next[k] = INT64_MAX
        return k

    def cancel(self, handle: int, now_us: int) -> None:
        """The client of ``handle`` went away at ``now_us``: the request leaves the simulation
        (its KV blocks freed, out of the queue or batch; status ``aborted``). A request that
        already ended is left as it ended; nothing more is reported for ``handle``."""
        now_us = int(now_us)
        self._check_time(now_us, "cancel")
        if not 0 <= handle < len(self._rows):
            raise ValueError(f"cancel: unknown handle {handle}")
        track = self._tracks.pop(handle, None)
        if track is None:
            return
        self._active = None
        self._dirty = True
        self._run_until(now_us)
        self._log.append((now_us, 1, handle))
        abort_request(self._eng.rs, self._eng.ins, self._eng.kv, self._eng.rt, self._eng.heap,
                      handle)
        self._final[handle] = "aborted"

    def advance(self, until_us: int) -> list[Emitted]:
        """Run the simulation up to ``until_us`` (every event before it) and return, per
        request with news, the tokens made at or before ``until_us`` and whether it ended."""
        until_us = int(until_us)
        self._check_time(until_us, "advance")
        self._run_until(until_us)
        return self._collect(until_us)

    def next_event_us(self) -> int | None:
        """The earliest time something can happen: a pending event, or a token or an end
        already simulated but not told yet (None: nothing pending at all). It can be before
        ``now_us`` when a ``submit`` or ``cancel`` moved the clock past news that the next
        ``advance`` tells."""
        heap = self._eng.heap
        best = int(heap.times[0]) if heap.loop[LoopSlot.HEAP_SIZE] > 0 else INT64_MAX
        act = self._refresh()
        if act.shape[0]:
            best = min(best, int(self._next[act].min()))
        return None if best == INT64_MAX else best

    def gauges(self) -> InstanceGauges:
        """Per instance: running, waiting, KV usage fraction, prefix-cache lookups and hits
        (blocks, cumulative)."""
        eng = self._eng
        meta = eng.kv.meta
        total = meta[:, KVMeta.TOTAL].astype(np.float64)
        used = (meta[:, KVMeta.TOTAL] - meta[:, KVMeta.FREE]).astype(np.float64)
        hits = meta[:, KVMeta.HITS].astype(np.int64)
        cpu_misses = eng.kv.cpu_meta[:, CpuMeta.MISSES] if eng.kv.cpu_meta.shape[0] else 0
        return InstanceGauges(
            running=eng.ins.batch_len.copy(),
            waiting=eng.ins.wq[:, QueueField.LEN].copy(),
            kv_usage=np.where(total > 0, used / np.maximum(total, 1.0), 0.0),
            prefix_queries=hits + meta[:, KVMeta.MISSES] + cpu_misses,
            prefix_hits=hits)

    def status(self, handle: int) -> str:
        """The status last told for ``handle`` (``running`` until it ended)."""
        return self._final[handle]

    def write_trace(self, header_path: str, data_path: str) -> None:
        """Write what was served as a trace v2 (header YAML, data CSV): every submission in
        order, with its arrival, lengths and deadline; ``blis replay`` of it with the same
        options (and ``--horizon`` past the last end: replay's default stops at twice the last
        arrival) gives the same per-request times. Cancelled requests are written as
        ``incomplete`` (replay runs them to the end: it has no cancellations)."""
        table = self._trace_table()
        n = table.n
        status = np.full(n, 2, np.int8)
        codes = {"completed": 0, "timed_out": 1}
        ttft = np.full(n, -1, np.int64)
        itl = np.zeros(n, np.int64)
        for k in range(n):
            status[k] = codes.get(self._final[k], 2)
            if self._first_sent[k] >= 0:
                ttft[k] = self._first_sent[k] - self._rows[k].arrival
                itl[k] = self._last_sent[k] - self._first_sent[k]
        text = _trace_texts(table, TraceOutcome(status, ttft, itl))
        with OutputPlan() as plan:
            plan.stage_text(str(header_path), "--trace-output", text[0])
            plan.stage_text(str(data_path), "--trace-output", text[1])
            plan.commit()

    # ------------------------------------------------------------------ the clock

    def _check_time(self, t: int, what: str) -> None:
        if t < self._clock:
            raise ValueError(f"{what}: time {t} µs is before the simulation's clock "
                             f"{self._clock} µs (time never goes back)")
        if t >= INT64_MAX:
            raise ValueError(f"{what}: time {t} µs is out of range")
        self._clock = t

    def _run_until(self, t: int) -> None:
        if t > self._now:
            if self._eng.run_until(t, self._compact):
                self._dirty = True
            self._now = max(self._now, t)

    def _compact(self) -> bool:
        """Make room in the step log by dropping what no request needs any more (the
        server's memory stays bounded by the requests in flight, not by its age)."""
        self._dirty = True  # called from inside the engine's run: it moved
        self._refresh()
        return self._eng.compact_log(self._tracks)

    def _rebuild(self, row: _Row) -> None:
        """A simulation with twice the room (and room for ``row``): the state copied into
        bigger arrays, or where an array's layout depends on the room in another way than
        its length (a hash table sized by the digest room), rebuilt by replaying the
        submissions and cancellations so far into it up to now. Either way the same state."""
        room = self._eng.room
        while True:
            room = Capacity(2 * room.rows, 2 * room.chunks, 2 * room.pool,
                            max(room.max_chunks, 2 * row.digests.shape[0] + 2))
            eng = self._new_engine(room)
            if eng.fits(row) and eng.room.rows > len(self._rows):
                break
        try:
            self._eng = _copied_into(self._eng, eng)
            return
        except _LayoutChanged:
            eng = self._new_engine(room)
        for t, kind, k in self._log:
            eng.run_until(t)
            if kind == 0:
                eng.add(self._rows[k])
            else:
                abort_request(eng.rs, eng.ins, eng.kv, eng.rt, eng.heap, k)
        eng.run_until(self._now)
        self._eng = eng
        for track in self._tracks.values():  # the walks start again (the same times)
            track.times, track.cum, track.run, track.step = [], -1, -1, -1
            track.preemptions = int(eng.rs.preemptions[track.row])
        self._seen[:] = -1
        self._dirty = True

    # ------------------------------------------------------------------ token times

    def _rows_active(self) -> np.ndarray:
        """The rows of the requests not ended yet (as told), in submission order."""
        if self._active is None:
            self._active = np.fromiter(self._tracks, np.int64, len(self._tracks))
        return self._active

    def _refresh(self) -> np.ndarray:
        """Follow the requests whose engine figures moved since the last look (one vector
        comparison over the active rows; only those are walked in Python) and update when
        each has news next; returns the active rows."""
        act = self._rows_active()
        if not self._dirty or not act.shape[0]:
            return act  # nothing ran, was submitted or cancelled since the last look
        self._dirty = False
        rs = self._eng.rs
        now = np.empty((act.shape[0], 4), np.int64)
        now[:, 0] = rs.hot[act, HotField.PROGRESS]
        now[:, 1] = rs.state[act]
        now[:, 2] = rs.registered[act]
        now[:, 3] = rs.preemptions[act]
        moved = np.flatnonzero((now != self._seen[act]).any(axis=1))
        if moved.shape[0]:
            rows = act[moved]
            self._seen[rows] = now[moved]
            for r, (_, state, registered, preemptions) in zip(rows.tolist(),
                                                              now[moved].tolist(), strict=True):
                track = self._tracks[r]
                self._follow(track, state, registered, preemptions)
                self._next[r] = self._due(track)
        return act

    def _collect(self, until: int) -> list[Emitted]:
        """Every active request's news up to ``until``."""
        out: list[Emitted] = []
        done: list[int] = []
        act = self._refresh()
        due = act[self._next[act] <= until]
        if not due.shape[0]:
            return out
        # the rows' instance and first admission read in one vector pass each, not per row
        rs = self._eng.rs
        insts = rs.inst[due].tolist()
        scheds = np.where(rs.has_sched[due], self._eng.inp.arrival[due] + rs.sched_delay[due],
                          -1).tolist()
        nexts = self._next
        tracks = self._tracks
        for k, inst, sched in zip(due.tolist(), insts, scheds, strict=True):
            track = tracks[k]
            new = self._due_tokens(track, until)
            nexts[k] = self._due(track)
            finished = track.end_us >= 0 and track.end_us <= until and (
                track.sent >= len(track.times) or track.status != "completed")
            if finished:
                done.append(k)
                self._final[k] = track.status
                out.append(Emitted(k, tuple(new), True, track.status, track.end_us, inst,
                                   sched if sched >= 0 else None))
            elif new:
                out.append(Emitted(k, tuple(new), False, _RUNNING, None, inst,
                                   sched if sched >= 0 else None))
        for k in done:
            del self._tracks[k]
        if done:
            self._active = None
        return out

    def _due_tokens(self, track: _Track, until: int) -> list[int]:
        """Tokens of the current attempt not yet told, made at or before ``until`` (and, for a
        request that ended otherwise, before its end)."""
        times = track.times
        start = track.sent
        stop = start
        limit = until if track.status in (_RUNNING, "completed") else min(until, track.end_us)
        while stop < len(times) and times[stop] <= limit:
            stop += 1
        if stop == start:
            return []
        new = times[start:stop]
        track.sent = stop
        k = track.row
        if self._first_sent[k] < 0:
            self._first_sent[k] = new[0]
        self._last_sent[k] = new[-1]
        return new

    def _due(self, track: _Track) -> int:
        """When ``track`` has news next (INT64_MAX: not before the engine moves)."""
        if track.sent < len(track.times):
            t = track.times[track.sent]
            if track.status in (_RUNNING, "completed") or t <= track.end_us:
                return t
        if track.end_us >= 0:
            return track.end_us
        return INT64_MAX

    def _follow(self, track: _Track, state: int, registered: int, preemptions: int) -> None:
        """Read the engine's new figures of ``track``'s request (its ``state``, registration
        and preemption count as :meth:`_refresh` read them): the tokens its current attempt
        made since the last look, and how it ended."""
        eng = self._eng
        r = track.row
        rs = eng.rs
        if track.end_us >= 0:
            return
        if preemptions != track.preemptions:  # a new attempt: its own token times
            track.preemptions = preemptions
            track.times, track.cum, track.run, track.step = [], -1, -1, -1
        if track.cum < 0 and rs.hot[r, HotField.TTFT_SET] == 1:
            track.cum = int(eng.inp.arrival[r] + rs.first_token[r])
            track.times.append(track.cum)
        if track.cum >= 0:
            self._walk_runs(track)
        if state == RequestState.COMPLETED:
            track.status = "completed"
            track.end_us = int(self._rows[r].arrival + rs.e2e[r])
        elif state in (RequestState.TIMED_OUT, RequestState.DROPPED):
            track.status = _STATUS_OF_STATE[state]
            track.end_us = self._end_of(r, state)
        elif registered in (Registration.REJECTED_ADMISSION, Registration.REJECTED_ROUTING):
            track.status = "rejected"
            track.end_us = self._end_of(r, state)

    def _end_of(self, r: int, state: int) -> int:
        """When request ``r`` timed out, was dropped or was rejected."""
        row = self._rows[r]
        ints = self._eng.sim_cfg.ints
        adm = int(ints[ConfigSlot.ADMISSION_LATENCY])
        rout = int(ints[ConfigSlot.ROUTING_LATENCY])
        if state == RequestState.TIMED_OUT:
            return max(row.deadline, row.arrival)
        if self._eng.rs.registered[r] == Registration.REJECTED_ADMISSION:
            return row.arrival + adm
        if self._eng.rs.registered[r] == Registration.REJECTED_ROUTING:
            return row.arrival + adm + rout
        i = int(self._eng.rs.inst[r])  # dropped by the enqueue guards: at its queued event
        delay = int(queueing_time(int(self._eng.sim_cfg.inst[i, InstanceSlot.BACKEND]),
                                  self._eng.sim_cfg.alpha, row.input_len))
        return row.arrival + (0 if row.instance >= 0 else adm + rout) + delay

    def _walk_runs(self, track: _Track) -> None:
        """Append the decode tokens of the request's ITL runs (consecutive decode steps of its
        instance) walked since the last look: each at the previous token + the step's
        duration + the output-token time (an ITL sample of the engine)."""
        eng = self._eng
        r = track.row
        lg = eng.lg
        hot = eng.rs.hot
        otp = self._otp
        if track.run < 0:
            track.run = int(eng.rs.run_head[r])
            track.step = -1
        while track.run >= 0:
            run = track.run
            tail = int(hot[r, HotField.RUN_TAIL])
            last = int(hot[r, HotField.LAST_DECODE]) if run == tail else int(lg.run_last[run])
            if track.step < 0:
                s = int(lg.run_start[run])
            elif track.step == last:
                s = -1
            else:
                s = int(lg.next_same[track.step])
            while s >= 0:
                track.cum += int(lg.dur[s]) + otp
                track.times.append(track.cum)
                track.step = s
                if s == last:
                    break
                s = int(lg.next_same[s])
            if run == tail:
                return
            nxt = int(lg.run_next[run])
            if nxt < 0:
                return
            track.run, track.step = nxt, -1

    def _trace_table(self) -> RequestTable:
        """The submissions as a request table (row order = submission order)."""
        rows = self._rows
        n = len(rows)
        i64 = np.int64
        digests = [r.digests for r in rows]
        offsets = np.zeros(n + 1, i64)
        if n:
            offsets[1:] = np.cumsum([d.shape[0] for d in digests])
        return RequestTable(
            arrival_us=np.array([r.arrival for r in rows], i64),
            input_len=np.array([r.input_len for r in rows], i64),
            output_len=np.array([r.output_len for r in rows], i64),
            max_output_len=np.array([r.output_len for r in rows], i64),
            deadline_us=np.array([r.deadline for r in rows], i64),
            prefix_length=np.zeros(n, i64), client_idx=np.zeros(n, np.int32),
            chunk_offsets=offsets,
            chunk_digests=(np.concatenate(digests) if n else np.zeros(0, np.uint64)),
            clients=[{}], block_size=self._block, seed=int(self._cfg.options.seed))


class _LayoutChanged(Exception):
    """An array of the engine state is laid out differently with more room (not only longer)."""


def _carried(old: Any, new: Any) -> Any:
    """``old``'s contents in ``new``'s room: an array of the same shape is kept as it is; a
    longer one (rows, the block-list pool, digests, scratch, buffers with cursors: all used
    from index 0) gets ``old`` copied to its start; NamedTuple groups field by field."""
    if isinstance(old, np.ndarray):
        if old.shape == new.shape:
            return old
        if old.ndim != new.ndim or old.shape[1:] != new.shape[1:]:
            raise _LayoutChanged
        if old.shape[0] > new.shape[0]:  # a grown buffer already longer than the new room's
            return old
        new[: old.shape[0]] = old
        return new
    if isinstance(old, tuple) and hasattr(old, "_fields"):
        return type(old)(*(_carried(a, b) for a, b in zip(old, new, strict=True)))
    return old


def _copied_into(old: _Engine, new: _Engine) -> _Engine:
    """``new`` (an engine with more room) holding ``old``'s state. The step log and the heap
    are kept as they are: buffers the loop asks to grow (the log's size follows the requests
    in flight, ``compact_log``, not the rows)."""
    for name in ("inp", "rs", "ins", "kv", "rt", "work", "sess", "sim_cfg"):
        setattr(new, name, _carried(getattr(old, name), getattr(new, name)))
    new.lg = old.lg
    new.heap = old.heap
    new.compactions = old.compactions
    new.rows = old.rows
    new.entry = old.entry
    return new


def _trace_texts(table: RequestTable, outcome: TraceOutcome) -> tuple[str, str]:
    """The header and data texts of the trace of ``table`` (submission order kept)."""
    return (build_trace_header(table.seed),
            build_trace_csv(table, outcome, sort_by_arrival=True))


