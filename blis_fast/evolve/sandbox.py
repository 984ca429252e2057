"""Contained evaluation of untrusted candidates: each runs in its own child process with a
wall-clock timeout (the child's process group is killed), an address-space limit, and a
failure record (worst fitness plus the reason) for whatever goes wrong — never an exception
or a hang in the search that called it.

As with any ``multiprocessing`` use, a script that evaluates candidates needs the
``if __name__ == "__main__":`` guard (the forkserver imports the main module).

Children are forked from a ``forkserver`` that has imported blis_fast and run one tiny
simulation, so a child starts with the compiled kernels loaded (no Numba start-up per
candidate). Results are cached by (target, candidate source hash, benchmark digest, stage),
in memory and optionally in a directory of JSON files.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import resource
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from blis_fast.errors import BlisConfigError
from blis_fast.evolve.benchmark import Benchmark, benchmark_from_dict
from blis_fast.evolve.evaluate import evaluate_source, failure_record

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 2048
"""Address space a candidate may add on top of the child's start-up footprint."""
_WARM_MODULE = "blis_fast.evolve._warm"


def _context() -> Any:
    """The forkserver context (preloading the warmed-up simulator), else spawn."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([_WARM_MODULE])
        return ctx
    return multiprocessing.get_context("spawn")


def _vm_size_bytes() -> int:
    """This process's current virtual memory size (0 when unknown)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _child(conn: Any, source: str, target: str, bench_data: dict, stage: str,
           memory_mb: int) -> None:
    """Child process body: own process group, memory limit, evaluate, send the record."""
    os.setpgrp()
    limit = _vm_size_bytes() + memory_mb * (1 << 20)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass

    try:
        bench = benchmark_from_dict(bench_data, "benchmark")
        if stage == "tiny":
            bench = bench.tiny()
        record = evaluate_source(source, target, bench, feedback=stage != "tiny")
    except MemoryError:
        record = failure_record("memory", f"exceeded the memory limit of {memory_mb} MB",
                                source)
    except BaseException as exc:  # noqa: BLE001 - anything the candidate provoked
        record = failure_record("exception", f"{type(exc).__name__}: {exc}"[:500], source)
    try:
        conn.send(record)
    except MemoryError:
        conn.send(failure_record("memory", f"exceeded the memory limit of {memory_mb} MB",
                                 source))
    finally:
        conn.close()


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def evaluate_contained(source: str, target: str, bench: Benchmark, *, stage: str = "full",
                       timeout_s: float = DEFAULT_TIMEOUT_S,
                       memory_mb: int = DEFAULT_MEMORY_MB) -> dict[str, Any]:
    """Evaluate one candidate in a child process; always returns a record (never raises).

    ``stage``: ``full`` (the whole benchmark, with feedback) or ``tiny`` (a few requests of
    the first workload: does it compile and run?).
    """
    ctx = _context()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child_conn, source, target, bench.to_dict(), stage,
                                            memory_mb), daemon=True)
    started = time.monotonic()
    try:
        proc.start()
    except Exception as exc:  # noqa: BLE001 - e.g. the forkserver could not start
        return failure_record("crash", f"cannot start the evaluation process: {exc}", source)
    child_conn.close()
    try:
        if parent_conn.poll(timeout_s):
            try:
                record = parent_conn.recv()
            except (EOFError, OSError):
                record = None
            if record is None:
                proc.join(5)
                record = failure_record(
                    "crash", f"the evaluation process died (exit code {proc.exitcode})", source)
        else:
            record = failure_record("timeout", f"no result within {timeout_s:g} s", source)
    finally:
        if proc.pid is not None:
            _kill_group(proc.pid)
        proc.join(5)
        parent_conn.close()
    record.setdefault("seconds", round(time.monotonic() - started, 3))
    return record


class EvalCache:
    """Evaluation records keyed by (target, source hash, benchmark digest, stage)."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self._memory: dict[str, dict[str, Any]] = {}
        self._dir = Path(directory) if directory is not None else None
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def key(source: str, target: str, bench: Benchmark, stage: str) -> str:
        """The cache key of one evaluation."""
        text = "\0".join((target, hashlib.sha256(source.encode()).hexdigest(), bench.digest(),
                          stage))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get(self, key: str) -> dict[str, Any] | None:
        """The cached record, or None."""
        if key in self._memory:
            return self._memory[key]
        if self._dir is not None and (self._dir / f"{key}.json").exists():
            record = json.loads((self._dir / f"{key}.json").read_text())
            self._memory[key] = record
            return record
        return None

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Store a record (timeouts and crashes are not cached: the machine may be the cause)."""
        if (record.get("error") or {}).get("kind") in ("timeout", "crash"):
            return
        self._memory[key] = record
        if self._dir is not None:
            tmp = self._dir / f"{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(record, sort_keys=True))
            os.replace(tmp, self._dir / f"{key}.json")


def _contained_task(payload: tuple) -> tuple[int, dict[str, Any]]:
    """A sweep-runner task (Ray backend): one contained evaluation, tagged with its index."""
    index, source, target, bench_data, stage, timeout_s, memory_mb = payload
    bench = benchmark_from_dict(bench_data, "benchmark")
    return index, evaluate_contained(source, target, bench, stage=stage, timeout_s=timeout_s,
                                     memory_mb=memory_mb)


class Evaluator:
    """Contained, cached, parallel evaluation of candidates of one target on one benchmark.

    ``backend="local"``: at most ``workers`` child processes at a time on this machine;
    ``"ray"``: each evaluation is a Ray task of the sweep's task runner (a local Ray with
    ``workers`` CPUs, or the cluster at ``ray_address``), contained inside its Ray worker.
    """

    def __init__(self, target: str, bench: Benchmark, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_mb: int = DEFAULT_MEMORY_MB, workers: int | None = None,
                 cache: EvalCache | None = None, backend: str = "local",
                 ray_address: str | None = None) -> None:
        from blis_fast.sweep.execute import BACKENDS, default_workers  # lazy: an Evaluator only

        if backend not in BACKENDS:
            raise BlisConfigError(f"backend: unknown value {backend!r}. Valid: "
                                  + ", ".join(BACKENDS))
        self.backend = backend
        self.ray_address = ray_address
        self.target = target
        self.bench = bench
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.workers = workers or default_workers()
        self.cache = cache if cache is not None else EvalCache()

    def evaluate(self, source: str, *, stage: str = "full",
                 bench: Benchmark | None = None) -> dict[str, Any]:
        """One candidate's record (from the cache when it was scored before)."""
        bench = bench or self.bench
        key = EvalCache.key(source, self.target, bench, stage)
        record = self.cache.get(key)
        if record is None:
            record = evaluate_contained(source, self.target, bench, stage=stage,
                                        timeout_s=self.timeout_s, memory_mb=self.memory_mb)
            self.cache.put(key, record)
        return record

    def evaluate_many(self, sources: Sequence[str], *, stage: str = "full") -> list[dict]:
        """Records of several candidates, evaluated in parallel (one child process each, at
        most ``workers`` at a time), in the order given."""
        if self.backend == "ray":
            return self._evaluate_many_ray(sources, stage)
        with ThreadPoolExecutor(max_workers=max(1, self.workers)) as pool:
            return list(pool.map(lambda s: self.evaluate(s, stage=stage), sources))

    def _evaluate_many_ray(self, sources: Sequence[str], stage: str) -> list[dict]:
        from blis_fast.sweep.execute import TaskRunner  # lazy: the Ray backend only

        keys = [EvalCache.key(s, self.target, self.bench, stage) for s in sources]
        records: list[dict | None] = [self.cache.get(k) for k in keys]
        todo = {keys[i]: i for i, r in enumerate(records) if r is None}  # one task per key
        payloads = [(i, sources[i], self.target, self.bench.to_dict(), stage, self.timeout_s,
                     self.memory_mb) for i in todo.values()]
        with TaskRunner("ray", self.workers, self.ray_address) as runner:
            for index, record in runner.map(_contained_task, payloads):
                self.cache.put(keys[index], record)
                records[index] = record
        return [r if r is not None else records[todo[k]] for r, k in zip(records, keys,
                                                                          strict=True)]
