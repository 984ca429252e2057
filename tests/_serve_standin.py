"""A small stand-in of ``serve.live.LiveSimulation`` for the HTTP tests (never shipped).

Same interface, a toy engine whose timings are easy to state: each instance runs up to
``batch`` requests at once, first come first served; a request's first token comes
``prefill_us`` after it starts and every further token ``itl_us`` after the previous one; a
request that ends frees its slot for the oldest waiting one at that instant. Admission
rejects a request when ``reject_over`` requests are already outstanding in the fleet, and a
request whose tokens exceed ``kv_tokens`` is dropped. Routing sends a request to the instance
with the fewest outstanding requests (lowest index on ties) unless ``instance`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Emitted:
    handle: int
    tokens: tuple[int, ...]
    finished: bool
    status: str
    instance: int = -1
    scheduled_us: int | None = None


@dataclass(frozen=True)
class Gauges:
    running: list[int]
    waiting: list[int]
    kv_usage: list[float]
    prefix_queries: list[int]
    prefix_hits: list[int]


class _Req:
    def __init__(self, handle: int, arrival: int, input_len: int, output_len: int,
                 instance: int, rid: str | None) -> None:
        self.handle = handle
        self.arrival = arrival
        self.input_len = input_len
        self.output_len = output_len
        self.instance = instance
        self.rid = rid
        self.start: int | None = None
        self.next_token: int | None = None
        self.emitted = 0
        self.tokens: list[int] = []
        self.status = "running"


class StandInSimulation:
    """The toy engine (see the module docstring)."""

    def __init__(self, num_instances: int = 1, *, batch: int = 4, prefill_us: int = 50_000,
                 itl_us: int = 10_000, max_model_len: int = 2048, kv_tokens: int = 10**9,
                 reject_over: int | None = None) -> None:
        self._n = num_instances
        self.batch = batch
        self.prefill_us = prefill_us
        self.itl_us = itl_us
        self._max_len = max_model_len
        self.kv_tokens = kv_tokens
        self.reject_over = reject_over
        self._reqs: dict[int, _Req] = {}
        self._running: list[list[_Req]] = [[] for _ in range(num_instances)]
        self._waiting: list[list[_Req]] = [[] for _ in range(num_instances)]
        self._pending: list[Emitted] = []
        self._now = 0
        self.submitted: list[_Req] = []
        self.cancelled: list[int] = []

    @property
    def num_instances(self) -> int:
        return self._n

    @property
    def max_model_len(self) -> int:
        return self._max_len

    def _outstanding(self, i: int) -> int:
        return len(self._running[i]) + len(self._waiting[i])

    def submit(self, now_us: int, input_len: int, output_len: int, *, token_ids=None,
               instance: int | None = None, request_id: str | None = None) -> int:
        if now_us < self._now:
            raise ValueError("time went back")
        handle = len(self.submitted)
        if instance is None:
            instance = min(range(self._n), key=lambda i: (self._outstanding(i), i))
        r = _Req(handle, now_us, input_len, output_len, instance, request_id)
        self.submitted.append(r)
        total = sum(self._outstanding(i) for i in range(self._n))
        if self.reject_over is not None and total >= self.reject_over:
            r.status = "rejected"
            self._pending.append(Emitted(handle, (), True, "rejected", instance))
            return handle
        if input_len + output_len > self.kv_tokens:
            r.status = "dropped"
            self._pending.append(Emitted(handle, (), True, "dropped", instance))
            return handle
        self._reqs[handle] = r
        self._waiting[instance].append(r)
        self._fill(instance, now_us)
        return handle

    def _fill(self, i: int, t: int) -> None:
        while self._waiting[i] and len(self._running[i]) < self.batch:
            r = self._waiting[i].pop(0)
            r.start = t
            r.next_token = t + self.prefill_us
            self._running[i].append(r)

    def cancel(self, handle: int, now_us: int) -> None:
        self.cancelled.append(handle)
        r = self._reqs.pop(handle, None)
        if r is None:
            return
        r.status = "aborted"
        i = r.instance
        if r in self._running[i]:
            self._running[i].remove(r)
            self._fill(i, max(now_us, self._now))
        elif r in self._waiting[i]:
            self._waiting[i].remove(r)

    def next_event_us(self) -> int | None:
        if self._pending:
            return self._now
        times = [r.next_token for run in self._running for r in run]
        return min(times) if times else None

    def advance(self, until_us: int) -> list[Emitted]:
        out: dict[int, list[int]] = {}
        done: dict[int, _Req] = {}
        emitted = list(self._pending)
        self._pending.clear()
        while True:
            nxt = self.next_event_us()
            if nxt is None or nxt > until_us:
                break
            for i in range(self._n):
                for r in list(self._running[i]):
                    if r.next_token == nxt:
                        out.setdefault(r.handle, []).append(nxt)
                        r.tokens.append(nxt)
                        r.emitted += 1
                        if r.emitted >= r.output_len:
                            r.status = "completed"
                            self._running[i].remove(r)
                            self._reqs.pop(r.handle, None)
                            done[r.handle] = r
                        else:
                            r.next_token = nxt + self.itl_us
                self._fill(i, nxt)
        self._now = max(self._now, until_us)
        for handle, times in out.items():
            r = self.submitted[handle]
            emitted.append(Emitted(handle, tuple(times), handle in done, r.status,
                                   r.instance, r.start))
        return emitted

    def gauges(self) -> Gauges:
        kv = []
        for i in range(self._n):
            used = sum(r.input_len + r.emitted for r in self._running[i])
            kv.append(min(1.0, used / self.kv_tokens))
        return Gauges([len(x) for x in self._running], [len(x) for x in self._waiting], kv,
                      [0] * self._n, [0] * self._n)

    def write_trace(self, header_path: str, data_path: str) -> None:
        with open(header_path, "w") as fh:
            fh.write("trace_version: 2\n")
        with open(data_path, "w") as fh:
            fh.write("request_id,arrival_time_us,input_tokens,output_tokens\n")
            for r in self.submitted:
                fh.write(f"{r.rid},{r.arrival},{r.input_len},{r.output_len}\n")
