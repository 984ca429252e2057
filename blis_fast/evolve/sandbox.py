"""Contained evaluation of untrusted candidates; whatever goes wrong is a failure record
(worst fitness plus the reason), never an exception or a hang in the search that called it.

Layers: the candidate is a restricted module (``restricted``: its code runs only as Numba
nopython functions, which cannot reach files, sockets, processes or memory outside their
arrays), so the record is made by the evaluation harness, not by the candidate. Each
evaluation runs under a supervisor (the forkserver's child, which never runs candidate code):
it makes new PID, network and mount namespaces where Linux allows (``_isolate``; a private
``/dev/shm`` tmpfs), forks the evaluation as PID 1 of that namespace in its own session with
an address-space limit and stdout/stderr on a capture pipe, reads the record from a separate
result pipe until the timeout, kills the evaluation (and with it every process of the
namespace), and checks the record before returning it. Where a namespace cannot be made the
record's ``containment`` says why, and only the restricted language holds that promise.

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
import math
import multiprocessing
import os
import resource
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from blis_fast.errors import BlisConfigError
from blis_fast.evolve import WORST_FITNESS
from blis_fast.evolve.benchmark import Benchmark, benchmark_from_dict
from blis_fast.evolve.evaluate import evaluate_source, failure_record

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 2048
"""Address space a candidate may add on top of the child's start-up footprint."""
MAX_TIMEOUT_S = 7 * 86400.0
MIN_MEMORY_MB, MAX_MEMORY_MB = 64, 1 << 20
_WARM_MODULE = "blis_fast.evolve._warm"


def check_limits(timeout_s: Any, memory_mb: Any, flags: tuple[str, str] = ("timeout_s",
                                                                          "memory_mb")) -> None:
    """Refuse a timeout that is not a finite number of seconds in (0, 7 days] and a memory
    limit outside [64 MB, 1 TB] (BlisConfigError naming the flag)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) \
            or not math.isfinite(timeout_s) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise BlisConfigError(f"{flags[0]}: expected seconds in (0, {MAX_TIMEOUT_S:g}], "
                              f"got {timeout_s!r}")
    if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) \
            or not MIN_MEMORY_MB <= memory_mb <= MAX_MEMORY_MB:
        raise BlisConfigError(f"{flags[1]}: expected an integer number of MB in "
                              f"[{MIN_MEMORY_MB}, {MAX_MEMORY_MB}], got {memory_mb!r}")


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


# --------------------------------------------------------------------------- isolation

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x00020000, 0x10000000, 0x20000000, 0x40000000)
_MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x4000, 0x40000, 0x2, 0x4
_PR_SET_PDEATHSIG = 1
DEV_SHM_MB = 64
"""Size of the private tmpfs mounted on ``/dev/shm`` inside the sandbox (at most the
memory limit); it disappears with the sandbox's mount namespace."""
RESULT_LIMIT_BYTES = 16 << 20
"""The most bytes of result record the supervisor reads."""
OUTPUT_KEEP_CHARS = 2000
"""The candidate's captured stdout/stderr kept in a record (the rest is read and dropped)."""


def _libc() -> Any:
    import ctypes  # lazy: Linux isolation only
    import ctypes.util  # lazy: Linux isolation only

    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _isolate(memory_mb: int) -> dict[str, str]:
    """In the supervisor, before forking the evaluation: new PID, network and mount
    namespaces (as root, else inside a new user namespace), and a private ``/dev/shm``.

    Returns what holds per promise: ``{"pid": ..., "network": ..., "dev_shm": ...}``, each
    ``"namespace"``/``"private tmpfs"`` or the reason it does not hold here.
    """
    import ctypes  # lazy: Linux isolation only

    state = {"pid": "no PID namespace", "network": "no network namespace",
             "dev_shm": "the host's /dev/shm"}
    if not os.path.exists("/proc/self/ns/pid"):
        reason = "not available on this platform (no Linux namespaces)"
        return {k: f"{v}: {reason}" for k, v in state.items()}
    try:
        libc = _libc()
    except OSError as exc:
        return {k: f"{v}: no C library ({exc})" for k, v in state.items()}
    flags = _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWNS
    if libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(flags | _CLONE_NEWUSER) != 0:
            err2 = ctypes.get_errno()
            reason = (f"unshare refused ({os.strerror(err)}; in a user namespace: "
                      f"{os.strerror(err2)})")
            return {k: f"{v}: {reason}" for k, v in state.items()}
        try:  # map this user to root of the new user namespace (mounts need it)
            with open("/proc/self/setgroups", "w") as fh:
                fh.write("deny")
            with open("/proc/self/uid_map", "w") as fh:
                fh.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as fh:
                fh.write(f"0 {gid} 1")
        except OSError:
            pass
    state["pid"] = "namespace"
    state["network"] = "namespace"
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        state["dev_shm"] = (f"the host's /dev/shm: cannot make mounts private "
                            f"({os.strerror(ctypes.get_errno())})")
        return state
    size = f"size={min(DEV_SHM_MB, memory_mb)}m,mode=1777".encode()
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _MS_NOSUID | _MS_NODEV, size) != 0:
        state["dev_shm"] = (f"the host's /dev/shm: cannot mount a tmpfs "
                            f"({os.strerror(ctypes.get_errno())})")
    else:
        state["dev_shm"] = "private tmpfs"
    return state


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the supervisor) dies (Linux)."""
    try:
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _evaluate_body(payload: tuple) -> dict[str, Any]:
    """The evaluation process's work: score the candidate on the benchmark."""
    source, target, bench_data, stage, memory_mb = payload
    try:
        bench = benchmark_from_dict(bench_data, "benchmark")
        if stage == "tiny":
            bench = bench.tiny()
        return evaluate_source(source, target, bench, feedback=stage != "tiny")
    except MemoryError:
        return failure_record("memory", f"exceeded the memory limit of {memory_mb} MB", source)
    except BaseException as exc:  # noqa: BLE001 - anything the candidate provoked
        return failure_record("exception", f"{type(exc).__name__}: {exc}"[:500], source)


def _python_body(payload: tuple) -> dict[str, Any]:
    """Run trusted test code as if a candidate had escaped the restricted language (the
    tests of the OS-level containment use it); its result is whatever the code leaves in
    ``result``."""
    code, _memory_mb = payload
    namespace: dict[str, Any] = {"result": {}}
    exec(code, namespace)  # noqa: S102 - test code, never a candidate's
    return namespace["result"]


_BODIES = {"evaluate": _evaluate_body, "python": _python_body}


def _evaluation_process(body: str, payload: tuple, memory_mb: int, result_w: int,
                        output_w: int) -> None:
    """The forked evaluation (PID 1 of its namespace where there is one): its own session,
    stdout/stderr into the capture pipe, the memory limit, the body, the record as JSON on
    the result pipe. Never returns."""
    code = 0
    try:
        os.setsid()
        _die_with_parent()
        os.dup2(output_w, 1)
        os.dup2(output_w, 2)
        os.close(output_w)
        os.closerange(3, result_w)  # nothing of the parent's but the result pipe stays open
        os.closerange(result_w + 1, 1 << 16)
        limit = _vm_size_bytes() + memory_mb * (1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ValueError, OSError):
            pass
        record = _BODIES[body](payload)
        for stream in (sys.stdout, sys.stderr):  # what was printed goes to the capture pipe
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        try:
            data = json.dumps(record).encode()
        except MemoryError:
            data = json.dumps(failure_record(
                "memory", f"exceeded the memory limit of {memory_mb} MB")).encode()
        _write_all(result_w, data)
    except BaseException:  # noqa: BLE001 - the supervisor reports a missing record
        code = 1
    os._exit(code)


def _read_until(proc_pid: int, result_r: int, output_r: int,
                deadline: float) -> tuple[bytes, bytes, int | None]:
    """Read the result and the captured output until the evaluation exits or the deadline;
    (result bytes, first output bytes, wait status or None at the deadline)."""
    import selectors  # lazy: the supervisor only

    result, output = bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    sel.register(result_r, selectors.EVENT_READ)
    sel.register(output_r, selectors.EVENT_READ)
    status = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        for key, _ in sel.select(min(remaining, 0.05)):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fd)
            elif key.fd == result_r and len(result) < RESULT_LIMIT_BYTES:
                result += chunk
            elif key.fd == output_r and len(output) < 4 * OUTPUT_KEEP_CHARS:
                output += chunk
        pid, st = os.waitpid(proc_pid, os.WNOHANG)
        if pid:
            status = st
            for fd in (result_r, output_r):  # what is left in the pipes
                os.set_blocking(fd, False)
                try:
                    while (chunk := os.read(fd, 1 << 16)) and len(result) < RESULT_LIMIT_BYTES:
                        if fd == result_r:
                            result += chunk
                        elif len(output) < 4 * OUTPUT_KEEP_CHARS:
                            output += chunk
                except BlockingIOError:
                    pass
            break
    sel.close()
    return bytes(result), bytes(output), status


def _kill_tree(pid: int) -> None:
    """SIGKILL the evaluation (PID 1 of its namespace: the kernel kills the whole namespace)
    and its session's process group."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass


def _supervise(body: str, payload: tuple, timeout_s: float, memory_mb: int,
               source: str) -> dict[str, Any]:
    """The supervisor (the forkserver's child; never runs candidate code): isolate, fork the
    evaluation, read its record and output until the timeout, kill its whole tree, check
    the record. Returns the record to send to the caller."""
    started = time.monotonic()
    containment = _isolate(memory_mb)
    result_r, result_w = os.pipe()
    output_r, output_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(result_r)
        os.close(output_r)
        _evaluation_process(body, payload, memory_mb, result_w, output_w)
    os.close(result_w)
    os.close(output_w)
    try:
        data, output, status = _read_until(pid, result_r, output_r, started + timeout_s)
    finally:
        _kill_tree(pid)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        os.close(result_r)
        os.close(output_r)
    if status is None:
        record = failure_record("timeout", f"no result within {timeout_s:g} s", source)
    elif not data:
        how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit code {os.WEXITSTATUS(status)}")
        record = failure_record("crash", f"the evaluation process died ({how})", source)
    else:
        record = checked_record(data, body, source)
    if body == "evaluate":
        record["output"] = output.decode("utf-8", "replace")[:OUTPUT_KEEP_CHARS]
        record["containment"] = containment
        record.setdefault("seconds", round(time.monotonic() - started, 3))
    else:
        record = {"result": record, "output": output.decode("utf-8", "replace"),
                  "containment": containment, "timed_out": status is None}
    return record


_RECORD_KEYS = {"ok", "fitness", "error", "workloads", "feedback", "source_hash", "baseline",
                "seconds"}


def checked_record(data: bytes, body: str, source: str) -> dict[str, Any]:
    """Parse and check the evaluation's record: the keys of a record, a finite fitness, a
    failure at the worst fitness, a success in range (goodput in [0, 1]) and equal to the
    mean of its workloads' fitness. Anything else is a ``crash`` record."""
    def bad(why: str) -> dict[str, Any]:
        return failure_record("crash", f"the evaluation sent an invalid record: {why}", source)

    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return bad("not JSON")
    if body != "evaluate":
        return record
    if not isinstance(record, dict) or not set(record) <= _RECORD_KEYS:
        return bad("unexpected keys")
    fitness = record.get("fitness")
    if not isinstance(fitness, float | int) or isinstance(fitness, bool) \
            or not math.isfinite(fitness):
        return bad(f"fitness {fitness!r}")
    if record.get("ok") is False:
        return record if fitness == WORST_FITNESS else bad("a failure with a fitness")
    if record.get("ok") is not True or not isinstance(record.get("workloads"), dict) \
            or not record["workloads"]:
        return bad("no workloads")
    try:
        values = [float(m["fitness"]) for m in record["workloads"].values()]
    except (TypeError, KeyError, ValueError):
        return bad("a workload without fitness")
    if not all(math.isfinite(v) for v in values) \
            or abs(sum(values) / len(values) - fitness) > 1e-9 * max(1.0, abs(fitness)):
        return bad("fitness is not the mean of its workloads")
    return record


def _child(conn: Any, body: str, payload: tuple, timeout_s: float, memory_mb: int,
           source: str) -> None:
    """The forkserver's child: its own session, then the supervisor; sends one record."""
    os.setsid()
    try:
        record = _supervise(body, payload, timeout_s, memory_mb, source)
    except BaseException as exc:  # noqa: BLE001 - the supervisor itself failed
        record = failure_record("crash", f"the sandbox failed: {type(exc).__name__}: {exc}",
                                source)
    try:
        conn.send(record)
    finally:
        conn.close()


def run_contained(body: str, payload: tuple, *, source: str = "",
                  timeout_s: float = DEFAULT_TIMEOUT_S,
                  memory_mb: int = DEFAULT_MEMORY_MB) -> dict[str, Any]:
    """Run one sandboxed body (``evaluate``, or ``python`` for the containment tests) in a
    supervisor process forked from the warm forkserver; returns a record whatever the body
    does (BlisConfigError only for limits out of range)."""
    check_limits(timeout_s, memory_mb)
    ctx = _context()
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child_conn, body, payload, timeout_s, memory_mb,
                                            source), daemon=True)
    started = time.monotonic()
    try:
        proc.start()
    except Exception as exc:  # noqa: BLE001 - e.g. the forkserver could not start
        return failure_record("crash", f"cannot start the evaluation process: {exc}", source)
    child_conn.close()
    try:
        # the supervisor enforces the timeout; this one only covers a stuck supervisor
        if parent_conn.poll(timeout_s + 30.0):
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
            _kill_tree(proc.pid)
        proc.join(5)
        parent_conn.close()
    if body == "evaluate":
        record.setdefault("seconds", round(time.monotonic() - started, 3))
    return record


def evaluate_contained(source: str, target: str, bench: Benchmark, *, stage: str = "full",
                       timeout_s: float = DEFAULT_TIMEOUT_S,
                       memory_mb: int = DEFAULT_MEMORY_MB) -> dict[str, Any]:
    """Evaluate one candidate in the sandbox; always returns a record, whatever the
    candidate does (BlisConfigError only for ``timeout_s``/``memory_mb`` out of range).

    ``stage``: ``full`` (the whole benchmark, with feedback) or ``tiny`` (a few requests of
    the first workload: does it compile and run?). The record's ``output`` is what the
    candidate printed (first 2,000 characters), ``containment`` what isolated it here.
    """
    return run_contained("evaluate", (source, target, bench.to_dict(), stage, memory_mb),
                         source=source, timeout_s=timeout_s, memory_mb=memory_mb)


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


def _raise_bad_benchmark(record: dict[str, Any], bench: Benchmark) -> None:
    """BlisConfigError for a record whose benchmark the simulator refused."""
    if (record.get("error") or {}).get("kind") == "benchmark":
        raise BlisConfigError(f"benchmark {bench.name!r}: {record['error']['message']}")


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
        check_limits(timeout_s, memory_mb)
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
        """One candidate's record (from the cache when it was scored before). A benchmark
        the simulator refuses raises BlisConfigError: it is no candidate's failure, and a
        search scoring every candidate -1 would hide it."""
        bench = bench or self.bench
        key = EvalCache.key(source, self.target, bench, stage)
        record = self.cache.get(key)
        if record is None:
            record = evaluate_contained(source, self.target, bench, stage=stage,
                                        timeout_s=self.timeout_s, memory_mb=self.memory_mb)
            _raise_bad_benchmark(record, bench)
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
                _raise_bad_benchmark(record, self.bench)
                self.cache.put(keys[index], record)
                records[index] = record
        return [r if r is not None else records[todo[k]] for r, k in zip(records, keys,
                                                                          strict=True)]
