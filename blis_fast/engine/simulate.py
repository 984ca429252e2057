"""Run the engine kernel on a request table: pack the arrays (``packing``), run the kernel,
feed closed-loop follow-ups back in (``follow_ups``), read the results (``results``)."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator

import numpy as np
from numba.core import types
from numba.core.errors import NumbaExperimentalFeatureWarning

from blis_fast.compile_notice import announce_if_compiling, finish_background_compile
from blis_fast.engine import fleet
from blis_fast.engine.engine_config import EngineConfig, Hooks
from blis_fast.engine.follow_ups import (
    FollowUpRows,
    OutOfRoom,
    SessionPlan,
    initial_capacity,
)
from blis_fast.engine.livelock import livelock_error, warn_lora_stall
from blis_fast.engine.memory import available_memory
from blis_fast.engine.packing import (
    Capacity,
    chain_state,
    config_ints,
    instance_config,
    instance_rank_of,
    kv_state,
    lora_state,
    pad,
    pd_state,
    rank_of_ids,
    request_inputs,
    request_metadata,
    router_state,
    with_prefill_rows,
)
from blis_fast.engine.results import SimulationResult, raise_failure, read_result
from blis_fast.engine.sessions import SessionDriver
from blis_fast.errors import BlisConfigError
from blis_fast.kernels.cluster import hooks as H
from blis_fast.kernels.cluster.autoscale_layout import AsVar
from blis_fast.kernels.engine.event_loop import (
    ASC_ARGUMENT,
    LORA_ARGUMENT,
    PD_ARGUMENT,
    push_cluster_arrivals,
    run_events,
)
from blis_fast.kernels.engine.state import (
    ConfigSlot,
    InstanceCounter,
    KernelHooks,
    LogCursor,
    LoopSlot,
    OutcomeField,
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
from blis_fast.kernels.engine.step import itl_counts_from_marks
from blis_fast.kernels.enums import Status
from blis_fast.kernels.go.gomath import INT64_MAX
from blis_fast.kernels.kv.kv_layout import KVMeta
from blis_fast.policies.scorers import SCORERS

__all__ = ["EngineConfig", "Hooks", "SessionPlan", "SimulationResult", "hook_errors",
           "run_engine"]


@contextlib.contextmanager
def hook_errors(hooks: Hooks | None) -> Iterator[list[tuple[str, BaseException]]]:
    """Collect the exceptions user hooks raise inside the kernel.

    A Numba cfunc cannot propagate an exception: it reports it through
    ``sys.unraisablehook`` and returns a default value. While the kernel runs, that hook
    records ``(hook name, exception)`` instead of printing, so the caller can stop the run.
    """
    failures: list[tuple[str, BaseException]] = []
    if hooks is None or not (hooks.scorer or hooks.admission or hooks.scheduler_key):
        yield failures
        return
    previous = sys.unraisablehook
    given = [name for name, fn in (("custom_scorer", hooks.scorer),
                                   ("custom_admission", hooks.admission),
                                   ("custom_scheduler_key", hooks.scheduler_key)) if fn]

    def record(unraisable) -> None:
        # the report names no function: name the hook when only one is set or the message does
        name = next((n for n in given if n in str(unraisable.exc_value)),
                    given[0] if len(given) == 1 else "a user hook (" + ", ".join(given) + ")")
        failures.append((name, unraisable.exc_value))

    sys.unraisablehook = record
    try:
        yield failures
    finally:
        sys.unraisablehook = previous


def _kernel_hooks(hooks: Hooks | None) -> KernelHooks:
    """The kernel's scorer table and admission/scheduler hooks (user cfuncs or placeholders)."""
    hooks = hooks or Hooks()
    return KernelHooks(SCORERS.table(hooks.scorer or H.no_scorer),
                       hooks.admission or H.admit_all, hooks.scheduler_key or H.zero_key)


def engine_variant(pd: bool, autoscaled: bool | None = None, lora: bool = False):
    """Whether a signature of the event loop is the variant with or without P/D (``pd``), the
    autoscaler (``autoscaled``; None: either) and LoRA (``lora``): their arguments are None
    without them."""
    return lambda signature: ((signature[PD_ARGUMENT] != types.none) == pd
                              and (autoscaled is None
                                   or (signature[ASC_ARGUMENT] != types.none) == autoscaled)
                              and (signature[LORA_ARGUMENT] != types.none) == lora)


def run_engine(table, cfg: EngineConfig, model: str = "",
               sessions: SessionPlan | None = None) -> SimulationResult:
    """Simulate ``table`` (a RequestTable) under ``cfg``; ``sessions`` continues closed-loop
    sessions with follow-ups generated as their requests finish (WL-6.5, CLU-1.15)."""
    finish_background_compile()
    room = initial_capacity(table, sessions)
    fleet_rows = fleet.initial_rows(cfg)
    while True:
        try:
            return _run_once(table, cfg, model, sessions, room, fleet_rows)
        except OutOfRoom:
            room = room.grown()
        except fleet.FleetTooSmall:
            fleet_rows *= 2


def _compiled_overload(dispatcher, args):
    """The machine-code entry point ``dispatcher`` chose for ``args`` (no type resolution)."""
    sig = tuple(dispatcher.typeof_pyval(a) for a in args)
    overload = dispatcher.overloads.get(sig)
    return dispatcher if overload is None else overload.entry_point


class KernelRun:
    """Calls of the event loop (``kernels/engine/event_loop.py: run_events``) until the run ends or
    closed-loop outcomes wait for their follow-ups, growing the heap and the step log between
    calls. After the first call the compiled entry point is called directly: resolving the
    argument types (the function-pointer table especially) costs more than a short re-entry."""

    def __init__(self) -> None:
        self.entry = run_events

    def __call__(self, cfg, inp, rs, ins, kv, lg, rt, heap, work, hooks, sess, pd, asc, lora):
        """Returns (status, step log, heap) like the loop's state after the last call."""
        while True:
            lg.sizes[LogCursor.ENTRIES] += 1
            args = (cfg, inp, rs, ins, kv, lg, rt, heap, work, hooks, sess, pd, asc, lora)
            status = self.entry(*args)
            if self.entry is run_events:
                self.entry = _compiled_overload(run_events, args)
            if status == Status.GROW_HEAP:
                _check_growth(2 * _bytes(heap[:4]), ins, lg)
                heap = grow_event_heap(heap, 2 * heap.times.shape[0])
            elif status == Status.GROW_LOG:
                _check_growth(2 * _bytes(lg[:-1]), ins, lg)
                lg = grow_step_log(lg, 1, 2 * ins.batch.shape[1] + 1)
            else:
                if status in (Status.OK, Status.SEQ_OVERFLOW, Status.KV_LIST_OVERFLOW):
                    # the run is over (or stopped on a limit): marks become counts
                    itl_counts_from_marks(lg, np.zeros(cfg.ints[ConfigSlot.N_INSTANCES],
                                                       np.int64))
                return status, lg, heap


def _bytes(arrays) -> int:
    """Bytes of a group of arrays."""
    return sum(a.nbytes for a in arrays)


def _check_growth(new_bytes: int, ins, lg) -> None:
    """Refuse to grow the step log or the event heap into ``new_bytes`` more than the memory
    available now: the run would be killed by the system a little later (a livelock the
    kernel's rules do not prove, or simply a run too long for this machine), so it stops with
    one line naming what to change instead."""
    limit = available_memory()
    if new_bytes <= limit:
        return
    steps = int(lg.sizes[LogCursor.STEPS])
    preempted = int(ins.cnt[:, InstanceCounter.PREEMPTIONS].sum())
    done = int(ins.cnt[:, InstanceCounter.COMPLETED].sum())
    hint = ("give the KV cache more blocks (--total-kv-blocks; preemptions outnumber "
            "completions)" if preempted > done else "shorten the run (--horizon, --num-requests)")
    raise BlisConfigError(
        f"--horizon: the run's step log outgrew the memory available ({steps} steps, "
        f"{preempted} preemptions and {done} completions so far; {new_bytes / 2**30:.1f} GiB "
        f"needed, {limit / 2**30:.1f} GiB available): {hint}")


class _ArgumentsCaught(Exception):
    """Raised by :func:`event_loop_arguments` to leave the run at the event loop's first call."""

    def __init__(self, arguments: tuple) -> None:
        super().__init__()
        self.arguments = arguments


def event_loop_arguments(table, cfg: EngineConfig) -> tuple:
    """The arguments of the event loop's first call when ``table`` runs under ``cfg``, nothing
    simulated and nothing compiled (the heap holds no arrivals: pushing them is a kernel): the
    engine warm-up compiles the loop and parts of it for exactly these types."""

    def catch(*arguments):
        raise _ArgumentsCaught(arguments)

    try:
        _run_once(table, cfg, "", None, initial_capacity(table, None), fleet.initial_rows(cfg),
                  event_loop=catch)
    except _ArgumentsCaught as caught:
        return caught.arguments
    raise AssertionError("the run ended without calling the event loop")


def _run_once(table, given: EngineConfig, model: str, sessions: SessionPlan | None,
              room: Capacity, fleet_rows: int, event_loop=None) -> SimulationResult:
    """One simulation with ``room`` for follow-ups and ``fleet_rows`` instance rows (the flag's
    count for a fixed fleet; an autoscaled run that outgrows them raises FleetTooSmall).
    ``event_loop`` replaces the loop's caller (:class:`KernelRun`), for
    :func:`event_loop_arguments`."""
    parents = table
    if given.pd_on:  # prefill sub-requests get rows of their own (kernels/cluster/pd.py)
        table = with_prefill_rows(table)
    n0 = table.n
    n = n0 + room.rows
    cfg = given if given.autoscale is None else fleet.row_config(given, fleet_rows)
    opts = cfg.options
    n_inst = opts.num_instances
    max_batch = max(1, min(opts.max_num_running_reqs, max(n, 1)))
    # the ids' string order: the scheduler's ties, the order deferred fetches advance in (KVO-7.3)
    ranked = (cfg.policies.scheduler not in ("", "fcfs")
              or (cfg.kv_offload is not None and bool(cfg.kv_offload.tiers)))
    ids = table.id_strings() if ranked else []  # 100k strings cost a few garbage collections
    inp = request_inputs(table, n, ids if ranked else None)
    kv = kv_state(table, cfg, inp, room)
    rs = new_request_arrays(n, pad(table.max_output_len, n, np.int64))
    ins = new_instance_arrays(n_inst, max_batch)
    n_req = parents.n + room.rows  # requests (P/D: sub-request rows excluded); logs grow
    lg = new_step_log(max(1024, 4 * n_req), max(1024, 2 * n_req))
    meta = request_metadata(table, given, model)  # tenant capacity: --num-instances (AS-7.3)
    rt = router_state(cfg, n, meta, kv, room)
    heap = new_event_heap(3 * n_req + 4 * n_inst + 16)
    work = new_work(n, max_batch, room.max_chunks, chain_state(cfg, kv, room, inp.id_rank))
    driver = None
    think = np.zeros(1, np.int64)
    if sessions and sessions.blueprints:
        driver = SessionDriver(sessions.blueprints, sessions.follow_up_budget,
                               opts.block_size_in_tokens)
        for b, bp in enumerate(sessions.blueprints):
            inp.session[bp.round0_row] = b
        think = driver.think_times()
    sess = SessionBuffers(think, np.zeros((2 * max_batch + 64, OutcomeField.SIZE), np.int64))
    appended = FollowUpRows(n0, int(kv.pool.shape[0] - room.pool - 1))
    sim_cfg = SimConfig(config_ints(cfg, rt),
                        cfg.latency_params_by_class(),
                        np.ascontiguousarray(cfg.latency.alpha, np.float64),
                        instance_rank_of(n_inst), instance_config(cfg))
    # after config_ints: a pool's policy copies the main router's packed slots
    pd = pd_state(cfg, parents, max_batch, inp, ranked, rt) if cfg.pd_on else None
    if cfg.pd_on:  # no follow-ups with P/D: nothing reads the kernel rows' table or ids again
        table, ids = None, []  # (the prefill rows' copies: ~15 MB per 100k requests)
    asc = None
    if cfg.autoscale is not None:  # the fleet's first events come before the arrivals
        fleet.check_rows(fleet_rows)
        asc = fleet.new_autoscale_state(cfg.autoscale, cfg, fleet_rows, n0)
        fleet.start_fleet(given, asc, kv, sim_cfg.inst, sim_cfg.instance_rank, rt, heap)
    lora = lora_state(cfg, table if table is not None else parents, n)
    if event_loop is None:  # not the arguments alone (event_loop_arguments)
        heap = push_cluster_arrivals(heap, inp.arrival, np.arange(parents.n, dtype=np.int64),
                                     np.full(parents.n, -1, np.int64))
        # the variant the flags' guess did not compile first (the autoscaler's, LoRA's)
        announce_if_compiling(run_events, engine_variant(pd is not None, asc is not None,
                                                         lora is not None))
    with warnings.catch_warnings(), hook_errors(cfg.hooks) as failures:
        # the scorer table and the hooks are first-class functions, labelled experimental
        warnings.simplefilter("ignore", NumbaExperimentalFeatureWarning)
        hooks = _kernel_hooks(cfg.hooks)
        run = KernelRun() if event_loop is None else event_loop
        while True:
            status, lg, heap = run(sim_cfg, inp, rs, ins, kv, lg, rt, heap, work, hooks, sess,
                                   pd, asc, lora)
            if status == Status.GROW_FLEET:
                raise fleet.FleetTooSmall
            if status != Status.SESSIONS:
                break
            pending = heap.loop[LoopSlot.PENDING_OUTCOMES]
            rows, seqs = appended.take(driver, sess.outcomes[:pending], rs, inp, kv, rt, meta,
                                       room)
            heap.loop[LoopSlot.PENDING_OUTCOMES] = 0
            heap.loop[LoopSlot.FOLLOW_UP_TICK] = INT64_MAX
            if ranked and rows.shape[0]:
                inp.id_rank[: appended.n] = rank_of_ids(
                    ids + [f.request_id for f in appended.follow_ups])
            heap = push_cluster_arrivals(heap, inp.arrival, rows, seqs)
            if asc is not None:
                asc.var[AsVar.PENDING_ARRIVALS] += rows.shape[0]
    if status == Status.LIVELOCK and not failures:
        raise livelock_error(heap.loop, kv.meta[:, KVMeta.TOTAL], parents, cfg.pd_on)
    warn_lora_stall(lora, parents)
    raise_failure(status, failures)
    n_used = appended.n
    final = appended.table(table, sessions) if n_used > n0 else table
    if cfg.pd_on:  # every row read back; the table stays the workload's
        return read_result(cfg, parents, n_used, rs, ins, kv, lg, rt, pd, lora)
    res = read_result(given, final, n_used, rs, ins, kv, lg, rt, lora=lora, chain=work.chain)
    return res if asc is None else fleet.fleet_result(res, asc, given.latency.model)
