"""Run sweep tasks: in this process, on a pool of local worker processes, or as Ray tasks.

Each backend takes a picklable top-level function and its payloads and yields the results in
completion order. Worker processes are started with ``spawn`` and live for the whole sweep, so
each loads the compiled kernels once. Leaving the ``with`` block early (an error, Ctrl-C)
cancels what has not run and stops the workers.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from types import TracebackType
from typing import Any

from blis_fast.errors import BlisConfigError
from blis_fast.sweep.worker import watch_parent

__all__ = ["BACKENDS", "TaskRunner", "default_workers"]

BACKENDS = ("local", "ray")


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

    def __enter__(self) -> TaskRunner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=exc_type is None, cancel_futures=True)
            if exc_type is not None:
                # stop chunks already running too (ProcessPoolExecutor has no public way before
                # Python 3.14's terminate_workers)
                for proc in list(getattr(self._pool, "_processes", {}).values()):
                    proc.terminate()
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
            return map(func, payloads)
        return self._map_pool(func, payloads)

    def _map_pool(self, func: Callable[[Any], Any], payloads: list[Any]) -> Iterator[Any]:
        self._pool = ProcessPoolExecutor(
            max_workers=min(self.workers, len(payloads)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=watch_parent, initargs=(os.getpid(),))
        pending = {self._pool.submit(func, p) for p in payloads}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()

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
                done, pending = ray.wait(pending, num_returns=1)
                yield ray.get(done[0])
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
