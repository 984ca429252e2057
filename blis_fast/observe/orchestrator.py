"""The dispatch loop of ``blis observe`` (OBS-5): pacing, concurrency slots, sessions, interrupt.

One asyncio event loop does everything: requests are released at ``start + arrival`` on the
monotonic clock, each takes one of ``max_concurrency`` slots, and runs as its own task.
Completions of closed-loop session requests feed the session driver in completion order
(single-threaded, so no serializer is needed) and their follow-ups join a buffer the loop
merges with the pre-generated requests by arrival (ties go to the follow-up).

An interrupt (first SIGINT/SIGTERM) stops dispatching at once, lets in-flight requests finish
for at most ``grace_s`` seconds, then aborts the rest; every dispatched request still ends with
exactly one record (aborted ones ``error``, ``context canceled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from blis_fast.engine.sessions import SessionDriver
from blis_fast.observe.client import CANCELLED_TEXT, PendingRequest, RealClient, RequestRecord
from blis_fast.observe.prompts import build_prompt
from blis_fast.observe.quality import LAG_SAMPLE_S, lag_per_request

log = logging.getLogger("blis_fast.observe")


SPIN_S = 0.002
"""The event loop's timer wakes late by up to a few ms on a busy machine: a send sleeps until
this long before its time, then yields in a loop until the time comes (tighter pacing)."""


@dataclass
class Job:
    """One request to dispatch: a pre-generated row or a session follow-up."""

    arrival_us: int  # planned arrival, µs from the loop's start
    ids: np.ndarray  # input token ids (group prefix included)
    max_output_len: int
    prefix_length: int
    prefix_group: str
    streaming: bool
    client_id: str
    tenant_id: str
    slo_class: str
    model: str
    deadline_us: int
    session_id: str = ""
    round_index: int = 0
    blueprint: int = -1  # session driver index; -1 = no closed-loop blueprint


@dataclass
class Observed:
    """One recorded request: what was sent, what came back, and the row's job fields."""

    pending: PendingRequest
    record: RequestRecord
    job: Job
    client_lag_us: int = -1  # largest event-loop lag sampled while in flight; -1 = unknown


@dataclass
class DispatchConfig:
    """Everything the loop needs besides the client and the jobs."""

    max_concurrency: int
    warmup: int = 0
    no_streaming: bool = False
    unconstrained: bool = False
    min_tokens: int = 0
    record_itl: bool = False
    tokens_per_word: float = 1.0
    prefixes: dict[str, str] = field(default_factory=dict)
    prefix_lengths: dict[str, int] = field(default_factory=dict)
    grace_s: float = 10.0


@dataclass
class DispatchResult:
    """Records in completion order, and the loop's time origin."""

    observed: list[Observed]
    itl: list[tuple[int, int, int]]  # (request_id, chunk_index, timestamp_us)
    start_wall_us: int  # wall clock at the loop's origin (planned send = this + arrival)
    dispatched: int
    interrupted: bool
    lag_us: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """The event loop's own lag, sampled every ``LAG_SAMPLE_S`` during the run (µs)."""


class Dispatcher:
    """Runs the reference's dispatch loop (OBS-5) over ``jobs`` with an optional driver."""

    def __init__(self, client: RealClient, jobs: list[Job], cfg: DispatchConfig,
                 driver: SessionDriver | None = None,
                 blueprint_jobs: list[Job] | None = None) -> None:
        self.client = client
        self.pre = deque(jobs)
        self.cfg = cfg
        self.driver = driver
        self.blueprint_jobs = blueprint_jobs or []  # per blueprint: a template for follow-ups
        self.follow_ups: deque[Job] = deque()
        self.wake = asyncio.Event()
        self.sem = asyncio.Semaphore(cfg.max_concurrency)
        self.inflight: dict[asyncio.Task, tuple[Job, PendingRequest]] = {}
        self.observed: list[Observed] = []
        self.itl: list[tuple[int, int, int]] = []
        self.dispatched = 0
        self.stopping = False
        self.start_mono = 0.0
        self.start_wall_us = 0
        self.active = 0
        self.lag_wall_us: list[int] = []
        self.lag_us: list[int] = []
        if driver is not None:
            self.active = len({j.session_id for j in jobs if j.session_id})

    # ---- one request ----------------------------------------------------------------------
    def _pending(self, job: Job, idx: int) -> PendingRequest:
        c = self.cfg
        return PendingRequest(
            request_id=idx, input_tokens=int(job.ids.shape[0]),
            max_output_tokens=job.max_output_len,
            prompt=build_prompt(job.ids, job.prefix_group, c.prefixes, c.prefix_lengths,
                                c.tokens_per_word),
            streaming=job.streaming and not c.no_streaming, model=job.model,
            client_id=job.client_id, tenant_id=job.tenant_id, slo_class=job.slo_class,
            prefix_group=job.prefix_group, prefix_length=job.prefix_length,
            unconstrained=c.unconstrained, min_tokens=c.min_tokens, deadline_us=job.deadline_us,
        )

    async def _run_one(self, job: Job, pending: PendingRequest, encoded: bytes | str) -> None:
        idx = pending.request_id
        try:
            try:
                record = await self.client.send(pending, encoded=encoded)
            except Exception as exc:  # noqa: BLE001 - one request's failure must not end the run
                # send records every failure it knows; anything else still becomes this
                # request's row (and ends its session), or a closed loop would wait forever
                log.error("observe: request %d: unexpected %s: %s", idx, type(exc).__name__, exc)
                record = RequestRecord(request_id=idx, status="error",
                                       error_message=f"client error: {type(exc).__name__}: {exc}")
            if idx >= self.cfg.warmup:
                self.observed.append(Observed(pending, record, job))
                if self.cfg.record_itl and record.status == "ok" and record.chunk_timestamps:
                    self.itl.extend((idx, i, ts) for i, ts in enumerate(record.chunk_timestamps))
                elif self.cfg.record_itl and not pending.streaming:
                    log.warning("request %d: --record-itl was set but request is non-streaming "
                                "(NumChunks=1)", idx)
            if job.session_id and self.driver is not None:
                self._session_done(job, record)
        finally:
            self.sem.release()

    def _session_done(self, job: Job, record: RequestRecord) -> None:
        """``OnComplete`` with the adapted request (OBS-5.6); wakes the loop."""
        fu = None
        if job.blueprint >= 0 and not self.stopping:
            tick = int((time.perf_counter() - self.start_mono) * 1e6)
            k = max(int(record.output_tokens), 0)
            n_in = int(job.ids.shape[0])
            fu = self.driver.on_outcome(job.blueprint, tick, record.status == "ok", n_in + k,
                                        n_in, np.arange(1, k + 1, dtype=np.int64))
        elif job.blueprint < 0:
            log.error("SessionManager.OnComplete: session %s not found in sessions",
                      job.session_id)
        if fu is not None:
            t = self.blueprint_jobs[job.blueprint]
            self.follow_ups.append(Job(
                arrival_us=int(fu.arrival_us), ids=fu.input_ids, max_output_len=fu.output_len,
                prefix_length=0, prefix_group="", streaming=False, client_id=t.client_id,
                tenant_id=t.tenant_id, slo_class=t.slo_class, model=t.model,
                deadline_us=int(fu.deadline_us), session_id=job.session_id,
                round_index=int(fu.round_index), blueprint=job.blueprint,
            ))
        else:
            self.active -= 1
        self.wake.set()

    # ---- the loop ---------------------------------------------------------------------------
    def _next(self) -> Job | None:
        if self.pre and self.follow_ups:
            if self.follow_ups[0].arrival_us <= self.pre[0].arrival_us:
                return self.follow_ups.popleft()
            return self.pre.popleft()
        if self.pre:
            return self.pre.popleft()
        if self.follow_ups:
            return self.follow_ups.popleft()
        return None

    async def _loop(self) -> None:
        while not self.stopping:
            job = self._next()
            if job is None:
                if self.driver is not None and self.active > 0:
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                return
            # prompt and body are built before the wait, so the send happens on time
            pending = self._pending(job, -1)
            encoded = self.client.encode(pending)
            due = self.start_mono + job.arrival_us / 1e6
            delay = due - time.perf_counter()
            if delay > SPIN_S:
                await asyncio.sleep(delay - SPIN_S)
            while time.perf_counter() < due:
                await asyncio.sleep(0)  # the last stretch yields to other tasks, timer-free
            await self.sem.acquire()
            pending.request_id = self.dispatched
            self.dispatched += 1
            task = asyncio.get_running_loop().create_task(self._run_one(job, pending, encoded))
            self.inflight[task] = (job, pending)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        """Forget a finished task; one cancelled before it ever ran still gets its row."""
        job, pending = self.inflight.pop(task)
        if task.cancelled():
            self.sem.release()
            if pending.request_id >= self.cfg.warmup:
                rec = RequestRecord(request_id=pending.request_id, status="error",
                                    error_message=f'HTTP error: Post "{self.client.endpoint}": '
                                                  f"{CANCELLED_TEXT}")
                self.observed.append(Observed(pending, rec, job))

    async def _watch_lag(self) -> None:
        """Sample how late the event loop wakes (issue 30): a loop busy with parsing or
        starved of CPU reads every chunk late, and the trace would blame the server."""
        while True:
            due = time.perf_counter() + LAG_SAMPLE_S
            await asyncio.sleep(LAG_SAMPLE_S)
            self.lag_us.append(max(int((time.perf_counter() - due) * 1e6), 0))
            self.lag_wall_us.append(time.time_ns() // 1000)

    def _attribute_lag(self) -> None:
        """Each observed request's largest sampled lag while it was in flight."""
        if not self.observed:
            return
        send = np.array([o.record.send_time_us for o in self.observed], dtype=np.int64)
        end = np.array([o.record.last_chunk_time_us or o.record.send_time_us
                        for o in self.observed], dtype=np.int64)
        lags = lag_per_request(np.array(self.lag_wall_us, dtype=np.int64),
                               np.array(self.lag_us, dtype=np.int64), send, end)
        for o, lag in zip(self.observed, lags, strict=True):
            o.client_lag_us = int(lag)

    async def run(self) -> DispatchResult:
        """Dispatch everything (or until interrupted) and wait for the in-flight requests."""
        loop = asyncio.get_running_loop()
        self.start_mono = time.perf_counter()
        self.start_wall_us = time.time_ns() // 1000
        watcher = loop.create_task(self._watch_lag())  # first: it must be waiting when the
        main = loop.create_task(self._loop())  # loop's first stretch of work runs

        def on_signal() -> None:
            if self.stopping:
                return
            log.warning("Received interrupt signal, cancelling observation...")
            self.stopping = True
            main.cancel()

        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            try:
                await main
            except asyncio.CancelledError:
                if not self.stopping:
                    raise
            if self.inflight:
                if self.stopping:
                    _done, rest = await asyncio.wait(set(self.inflight), timeout=self.cfg.grace_s)
                    for t in rest:
                        t.cancel()
                while self.inflight:
                    await asyncio.wait(set(self.inflight))
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            for sig in installed:
                loop.remove_signal_handler(sig)
        self._attribute_lag()
        return DispatchResult(self.observed, self.itl, self.start_wall_us, self.dispatched,
                              self.stopping, np.array(self.lag_us, dtype=np.int64))


__all__ = ["DispatchConfig", "DispatchResult", "Dispatcher", "Job", "Observed"]
