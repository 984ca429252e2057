"""The code a sweep worker runs: a chunk of configurations through ``blis_fast.run``, in-process.

A worker process (or Ray worker) imports this module once, so the compiled kernels are loaded
once and reused by every configuration it runs. A configuration that raises is recorded with
its error message; the others in the chunk still run.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from blis_fast.sweep.store import ConfigResult

__all__ = ["ChunkTask", "error_text", "run_chunk", "watch_parent"]


@dataclass
class ChunkTask:
    """Configurations to run in one task: ``(config_id, blis_fast.run keyword arguments)``."""

    configs: list[tuple[str, dict[str, Any]]]
    with_requests: bool = False


def error_text(exc: BaseException) -> str:
    """One line naming the exception type and its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def run_chunk(task: ChunkTask) -> list[ConfigResult]:
    """Run each configuration of ``task``; a failure becomes that configuration's error."""
    from blis_fast import api
    from blis_fast.output.parquet import summary_table

    results = []
    for config_id, kwargs in task.configs:
        try:
            run = api.run(**kwargs)
        except Exception as exc:  # noqa: BLE001 - a sweep records the failure and goes on
            results.append(ConfigResult(config_id, None, error_text(exc)))
            continue
        metrics = summary_table(run.summary).to_pylist()[0]
        del metrics["instance_id"]
        results.append(ConfigResult(config_id, metrics, None,
                                    run.requests_table() if task.with_requests else None))
    return results


def watch_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Worker-process initializer: exit when the sweep process that started us is gone.

    A sweep killed with SIGKILL cannot stop its pool; its workers notice and leave on their own.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="blis-sweep-parent-watch", daemon=True).start()
