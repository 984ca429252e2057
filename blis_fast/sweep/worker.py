"""The code a sweep worker runs: a chunk of configurations through ``blis_fast.run``, in-process.

A worker process (or Ray worker) imports this module once, so the compiled kernels are loaded
once and reused by every configuration it runs. A configuration that raises is recorded with
its error message; the others in the chunk still run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["STOP", "ChunkTask", "ConfigResult", "check_stop", "error_text", "init_worker_process",
           "raise_if_interrupted", "run_chunk"]


@dataclass
class ConfigResult:
    """What running one configuration produced: metrics (or an error) and optional requests."""

    config_id: str
    metrics: dict[str, Any] | None
    error: str | None = None
    requests: pa.Table | None = None
    pools: pa.Table | None = None  # a P/D configuration's pools.parquet (with the requests)
    adapters: pa.Table | None = None  # a LoRA configuration's adapters.parquet (always)


@dataclass
class ChunkTask:
    """Configurations to run in one task: ``(config_id, blis_fast.run keyword arguments)``."""

    configs: list[tuple[str, dict[str, Any]]]
    with_requests: bool = False


def error_text(exc: BaseException) -> str:
    """One line naming the exception type and its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


STOP = threading.Event()
"""Set by the sweep's SIGINT handler: stop at the next configuration boundary."""


def check_stop() -> None:
    """Raise ``KeyboardInterrupt`` if a stop was requested (a safe point between runs)."""
    if STOP.is_set():
        raise KeyboardInterrupt


def raise_if_interrupted(exc: BaseException) -> None:
    """Re-raise a Ctrl-C that compiled code reported as another error.

    A SIGINT arriving inside a Numba kernel surfaces as ``SystemError`` caused by the
    ``KeyboardInterrupt``; it must stop the sweep, not become a configuration's error.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        seen = seen.__cause__ or seen.__context__


def run_chunk(task: ChunkTask) -> list[ConfigResult]:
    """Run each configuration of ``task``; a failure becomes that configuration's error."""
    from blis_fast import api  # runs in the worker process only
    from blis_fast.output.parquet import summary_table  # runs in the worker process only

    results = []
    for config_id, kwargs in task.configs:
        check_stop()
        try:
            run = api.run(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a sweep records the failure and goes on
            raise_if_interrupted(exc)
            results.append(ConfigResult(config_id, None, error_text(exc)))
            continue
        metrics = summary_table(run.summary_row).to_pylist()[0]
        del metrics["instance_id"]
        results.append(ConfigResult(config_id, metrics, None,
                                    run.requests_table() if task.with_requests else None,
                                    run.pools_table() if task.with_requests else None,
                                    run.adapters_table()))
    return results


def init_worker_process(parent_pid: int, interval_s: float = 0.5) -> None:
    """Worker-process initializer: leave Ctrl-C to the sweep process (it stops the pool), and
    exit when that process is gone (killed with SIGKILL, it cannot stop its pool)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="blis-sweep-parent-watch", daemon=True).start()
