"""Run sweep tasks: in this process, on a pool of local worker processes, or as Ray tasks.

Each backend takes a picklable top-level function and its payloads and yields the results in
completion order. Worker processes are started with ``spawn`` and live for the whole sweep, so
each loads the compiled kernels once. Leaving the ``with`` block early (an error, Ctrl-C)
cancels what has not run and stops the workers.

Inside the ``with`` block Ctrl-C does not interrupt whatever code is running (a
``KeyboardInterrupt`` raised inside a Numba kernel can leave the process unusable): it sets
``worker.STOP``, and ``KeyboardInterrupt`` is raised at the next safe point (between two
configurations, or while waiting for workers). A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from types import TracebackType
from typing import Any

from blis_fast.errors import BlisConfigError, BlisRuntimeError
from blis_fast.sweep import BACKENDS
from blis_fast.sweep.worker import STOP, check_stop, init_worker_process

__all__ = ["BACKENDS", "TaskRunner", "default_workers"]

POLL_S = 0.2
"""How often a wait for workers looks for a stop request."""


def _request_stop(_signum: int, _frame: object) -> None:
    """SIGINT handler: ask for a stop at the next safe point; a second Ctrl-C stops at once."""
    if STOP.is_set():
        raise KeyboardInterrupt
    STOP.set()


def default_workers() -> int:
    """The CPUs this process may use."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BlisConfigError("--backend ray needs Ray: pip install 'blis_fast[ray]'") from None
    return ray


class TaskRunner:
    """Maps a function over payloads with the chosen backend; use as a context manager."""

    def __init__(self, backend: str = "local", workers: int | None = None,
                 ray_address: str | None = None) -> None:
        if backend not in BACKENDS:
            raise BlisConfigError(f"--backend: unknown value {backend!r}. Valid: "
                                  + ", ".join(BACKENDS))
        if workers is not None and workers < 1:
            raise BlisConfigError(f"--workers must be >= 1, got {workers}")
        if ray_address and backend != "ray":
            raise BlisConfigError("--ray-address needs --backend ray")
        self.backend = backend
        self.workers = workers or default_workers()
        self.ray_address = ray_address
        self._ray = _import_ray() if backend == "ray" else None
        self._pool: ProcessPoolExecutor | None = None
        self._ray_started = False
        self._previous_sigint: Any = None

    def __enter__(self) -> TaskRunner:
        STOP.clear()
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, _request_stop)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._previous_sigint is not None:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        if self._pool is not None:
            # ProcessPoolExecutor has no public way to stop running work before Python 3.14's
            # terminate_workers(): keep its processes to terminate them after an early exit
            processes = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=exc_type is None, cancel_futures=True)
            if exc_type is not None:
                for proc in processes:
                    proc.terminate()
                for proc in processes:
                    proc.join(timeout=5)
            self._pool = None
        if self._ray_started:
            self._ray.shutdown()
            self._ray_started = False

    def map(self, func: Callable[[Any], Any], payloads: list[Any]) -> Iterator[Any]:
        """``func(payload)`` for every payload; results in completion order."""
        if not payloads:
            return iter(())
        if self.backend == "ray":
            return self._map_ray(func, payloads)
        if self.workers == 1 or len(payloads) == 1:
            return self._map_here(func, payloads)
        return self._map_pool(func, payloads)

    @staticmethod
    def _map_here(func: Callable[[Any], Any], payloads: list[Any]) -> Iterator[Any]:
        for payload in payloads:
            check_stop()
            yield func(payload)

    def _map_pool(self, func: Callable[[Any], Any], payloads: list[Any]) -> Iterator[Any]:
        self._pool = ProcessPoolExecutor(
            max_workers=min(self.workers, len(payloads)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=init_worker_process, initargs=(os.getpid(),))
        pending = {self._pool.submit(func, p) for p in payloads}
        while pending:
            check_stop()
            done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    result = fut.result()
                except BrokenProcessPool as exc:
                    raise BlisRuntimeError(f"a sweep worker process died ({exc}); finished "
                                           "configurations are kept, rerun with --resume"
                                           ) from None
                yield result

    def _map_ray(self, func: Callable[[Any], Any], payloads: list[Any]) -> Iterator[Any]:
        ray = self._ray
        if not ray.is_initialized():
            quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
            if self.ray_address:
                ray.init(address=self.ray_address, **quiet)
            else:
                ray.init(num_cpus=self.workers, include_dashboard=False, **quiet)
            self._ray_started = True
        remote = ray.remote(num_cpus=1, max_retries=0)(func)
        pending = [remote.remote(p) for p in payloads]
        try:
            while pending:
                check_stop()
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                if done:
                    try:
                        result = ray.get(done[0])
                    except ray.exceptions.RayError as exc:
                        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                        raise BlisRuntimeError(f"a Ray task failed ({type(exc).__name__}: "
                                               f"{first}); finished configurations are kept, "
                                               "rerun with --resume") from None
                    yield result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
