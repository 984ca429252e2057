"""Differential testing of blis_fast against a reference ``blis`` binary on random configurations.

Each configuration (``config_generator.py``, or a JSONL file of them) is run by blis_fast (its
CLI in a persistent worker process, ``blis_worker.py``, under ``--memory-limit-mb`` and
``--timeout``) and by ``--reference PATH`` (any executable taking ``run <flags>``), each
in its own folder with ``--metrics-path results.json --trace-output trace``; the outputs are
compared with the parity rules of ``tests/parity.py``. Not collected by pytest (no ``test_``
prefix); see tests/differential/README.md.

    python tests/differential/run_differential.py --reference /path/to/blis --seed 1 --count 50
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import functools
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
for _path in (str(HERE), str(HERE.parent)):  # config_generator, and tests/parity.py
    if _path not in sys.path:
        sys.path.insert(0, _path)

from config_generator import FAMILIES, OFFLOAD_TIER_MODES, generate_configs  # noqa: E402
from parity import (  # noqa: E402
    BOOL_FLAGS,
    HEAD_EXTRA_KEYS,
    _drop_keys,
    _without_extra_lines,
    case_flags,
    compare_results,
    compare_stdout,
)

OUTPUT_ARGS = ["--metrics-path", "results.json", "--trace-output", "trace"]
"""Output flags added to every run (both sides), relative to the run's folder."""
OUTPUT_FILES = ("results.json", "trace.yaml", "trace.csv")
EXACT_OUTPUT_ARGS = ["--output-dir", "out"]
EXACT = {"on": False}
"""``--exact`` (set by :func:`main`): the other side is an earlier build of blis_fast, so stdout
and every output file must be identical, not merely within the parity rules; Parquet files are
compared by data, on the other side's columns (a newer build may add columns and metadata)."""

_INVERSIONS_REASON = ("the reference counts priority inversions while iterating a Go map, so "
                      "the same command gives different counts from run to run (e.g. 123-129)")
KNOWN_NOISE: dict[str, str] = {
    "Priority Inversions": _INVERSIONS_REASON,  # the stdout anomaly line
    "priority_inversions": _INVERSIONS_REASON,  # the same count under its JSON name
}
"""Fields (as ``field_name`` reports them) whose differences alone do not make a configuration
'differ', with the reason."""

AUGUST_KNOWN_NOISE: dict[str, str] = {
    name: ("the August reference counts priority inversions under the priority schedulers "
           "(priority-fcfs, reverse-priority) where the April reference, which blis_fast "
           "follows, does not; and it draws them in Go map order")
    for name in ("Priority Inversions", "priority_inversions")}
"""KNOWN_NOISE of the August family (``--family august``)."""

LORA_KNOWN_NOISE: dict[str, str] = {**AUGUST_KNOWN_NOISE}
"""KNOWN_NOISE of the LoRA family (``--family lora``, also against the August reference)."""
OFFLOAD_KNOWN_NOISE: dict[str, str] = {**AUGUST_KNOWN_NOISE}
"""KNOWN_NOISE of the KV offload family (``--family offload``, the August reference)."""
FAMILY_NOISE: dict[str, dict[str, str]] = {
    "april": KNOWN_NOISE, "august": AUGUST_KNOWN_NOISE, "lora": LORA_KNOWN_NOISE,
    "offload": OFFLOAD_KNOWN_NOISE}
HEAD_FAMILIES = frozenset({"august", "lora", "offload"})
"""Families run against the August reference (its additions to every run are dropped)."""

STATUSES = ("agree", "known-noise", "both-refused", "differ", "blis_fast-refused",
            "reference-refused", "invalid-accepted", "reference-timeout", "both-timeout",
            "blis_fast-timeout", "blis_fast-oom", "blis_fast-error")
BAD_STATUSES = frozenset({"differ", "blis_fast-refused", "reference-refused",
                          "invalid-accepted", "blis_fast-timeout", "blis_fast-oom",
                          "blis_fast-error"})
"""Statuses that make the tool's exit code 1 (a finding)."""
HEAD_EXTRAS = {"on": False, "family": "april"}
"""``--family august`` or ``lora`` (set by :func:`main`): the reference is the August build, so
what it adds to every run (tests/parity.py's HEAD_EXTRA_*) is dropped from both sides before
comparing; ``family`` names the known-noise list (FAMILY_NOISE)."""

_PRINT_LOCK = threading.Lock()
"""Progress lines of parallel checks are printed one at a time."""

WORKER = HERE / "blis_worker.py"
DEFAULT_MEMORY_LIMIT_MB = 4096
LIMITS = {"memory_mb": DEFAULT_MEMORY_LIMIT_MB}
"""``--memory-limit-mb`` (set by :func:`main`): the address-space limit (RLIMIT_AS) of every
blis_fast worker process."""
WORKER_START_TIMEOUT = 300.0
"""Seconds a fresh worker may take to import blis_fast (not counted in ``--timeout``)."""
_OOM_MARKS = ("MemoryError", "Cannot allocate memory", "bad_alloc", "out of memory")


def _limit_memory(limit_mb: int) -> None:
    """``preexec_fn`` of a worker: cap its address space (the child then raises MemoryError,
    or dies, instead of taking the machine)."""
    import resource

    if limit_mb > 0:  # 0: no limit (the probe of _starts_unlimited)
        limit = int(limit_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


class BlisWorker:
    """One ``blis_worker.py`` process under the memory limit: runs configurations one after
    another; killed and replaced when it overruns the time limit or dies."""

    def __init__(self, memory_mb: int) -> None:
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: Any = None

    def _start(self) -> str | None:
        """Start the process and wait for its ready line; an error text if it never came (it
        starts with 'MemoryError' when the memory limit was the cause)."""
        self.close()
        self.log = tempfile.TemporaryFile()
        self.lines = queue.Queue()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, env=env, cwd=str(HERE.parents[1]),
            preexec_fn=functools.partial(_limit_memory, self.memory_mb))
        lines, stdout = self.lines, self.proc.stdout
        threading.Thread(target=_pump, args=(stdout, lines), daemon=True).start()
        try:
            first = lines.get(timeout=WORKER_START_TIMEOUT)
        except queue.Empty:
            first = None
        hello = json.loads(first) if first is not None else {}
        if not hello.get("ready"):
            why = (("MemoryError (address-space limit) " if hello.get("oom") else "")
                   + str(hello.get("stderr", "")) + "\n" + self._death_note())
            self.close()
            return why
        return None

    def _death_note(self) -> str:
        """The tail of the worker's stderr log (why it died)."""
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-2000:]

    def run(self, args: list[str], workdir: Path, timeout: float) -> dict[str, Any]:
        """``blis run <args>`` in ``workdir``; ``limit`` is 'timeout' or 'oom' when the run was
        stopped by a limit (exit code None)."""
        if self.proc is None or self.proc.poll() is not None:
            why = self._start()
            if why is not None:
                # imports and the warm-up run do not depend on the configuration: a worker that
                # cannot start under the memory limit but starts without one is stopped by it
                limit = "oom" if self.memory_mb > 0 and _starts_unlimited() else None
                return {"exit_code": None, "stdout": "", "limit": limit, "seconds": 0.0,
                        "stderr": f"blis_fast worker did not start: {_tail(why)}"}
        assert self.proc is not None and self.proc.stdin is not None
        start = time.perf_counter()
        try:
            self.proc.stdin.write(json.dumps({"args": args, "cwd": str(workdir)}) + "\n")
            self.proc.stdin.flush()
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.close()
            return {"exit_code": None, "stdout": "", "limit": "timeout",
                    "stderr": f"timed out after {timeout} s",
                    "seconds": time.perf_counter() - start}
        except OSError:  # the pipe closed: the worker died while reading
            line = None
        if line is None:  # the worker died mid-run
            code = self.proc.wait()
            why = self._death_note()
            self.close()
            oom = code == -9 or any(m in why for m in _OOM_MARKS)
            return {"exit_code": None, "stdout": "", "limit": "oom" if oom else None,
                    "stderr": f"blis_fast worker died (exit {code}): {_tail(why)}",
                    "seconds": time.perf_counter() - start}
        record = json.loads(line)
        if record.pop("oom", False):
            record["limit"] = "oom"
            self.close()
        return record

    def close(self) -> None:
        """Kill the process (if any) and drop its log."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None


_PROBED: dict[str, bool] = {}


def _starts_unlimited() -> bool:
    """Whether a worker starts without a memory limit (tells a limit too small for blis_fast's
    imports and warm-up from a broken installation); probed once per worker script."""
    key = str(WORKER)
    if key not in _PROBED:
        probe = BlisWorker(0)
        try:
            _PROBED[key] = probe._start() is None
        finally:
            probe.close()
    return _PROBED[key]


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    """Move a worker's protocol lines into ``lines`` (None at end of file)."""
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)


_IDLE: dict[int, list[BlisWorker]] = {}
_IDLE_LOCK = threading.Lock()


def close_workers() -> None:
    """End every idle worker (``run_all`` leaves them running for the next call)."""
    with _IDLE_LOCK:
        workers = [w for pool in _IDLE.values() for w in pool]
        _IDLE.clear()
    for worker in workers:
        worker.close()


atexit.register(close_workers)


def run_blis_fast(args: list[str], workdir: Path, timeout: float = 300.0) -> dict[str, Any]:
    """``blis run <args>`` by a blis_fast worker process inside ``workdir``, under the memory
    limit (``LIMITS``) and ``timeout`` seconds (exit code None and ``limit`` set when either
    stopped it; None without ``limit`` for a crash)."""
    memory_mb = LIMITS["memory_mb"]
    with _IDLE_LOCK:
        pool = _IDLE.setdefault(memory_mb, [])
        worker = pool.pop() if pool else BlisWorker(memory_mb)
    try:
        return worker.run(args, workdir, timeout)
    finally:
        with _IDLE_LOCK:
            _IDLE.setdefault(memory_mb, []).append(worker)


def run_reference(reference: str, args: list[str], workdir: Path,
                  timeout: float) -> dict[str, Any]:
    """``<reference> run <args>`` as a subprocess inside ``workdir`` (exit code None on timeout)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([reference, "run", *args], cwd=workdir, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "stdout": "", "stderr": f"timed out after {timeout} s",
                "seconds": time.perf_counter() - start}
    return {"exit_code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr,
            "seconds": time.perf_counter() - start}


def field_name(difference: str) -> str:
    """The field a parity difference line is about: ``'results.requests[3].ttft_ms: 1 != 2'``
    gives ``ttft_ms``; a difference not about one field gives its leading word."""
    path = difference.split(":", 1)[0]
    if path in OUTPUT_FILES:
        return path
    path = re.sub(r"\[\d+\]", "", path)
    return path.rsplit(".", 1)[-1].strip()


def trace_csv_differences(mine: str, theirs: str, limit: int = 10) -> list[str]:
    """Differences between two trace CSV exports, cell by cell (``trace.csv.<column>[row]``)."""
    a_rows, b_rows = mine.splitlines(), theirs.splitlines()
    if not b_rows or not a_rows or a_rows[0] != b_rows[0]:
        return [f"trace.csv: header {a_rows[:1]} != {b_rows[:1]}"]
    errors = []
    if len(a_rows) != len(b_rows):
        errors.append(f"trace.csv: {len(a_rows) - 1} rows != {len(b_rows) - 1}")
    columns = a_rows[0].split(",")
    for row, (a, b) in enumerate(zip(a_rows[1:], b_rows[1:], strict=False)):
        if a == b:
            continue
        a_cells, b_cells = a.split(","), b.split(",")
        for n, column in enumerate(columns):
            x = a_cells[n] if n < len(a_cells) else ""
            y = b_cells[n] if n < len(b_cells) else ""
            if x != y:
                errors.append(f"trace.csv.{column}[{row}]: {x!r} != {y!r}")
        if len(errors) >= limit:
            break
    return errors or ["trace.csv: text differs"]


def exact_differences(blis_dir: Path, blis_stdout: str, ref_dir: Path,
                      ref_stdout: str) -> list[str]:
    """Every difference between two builds' stdout and output files, byte for byte (Parquet:
    the data of the earlier build's columns)."""
    import pyarrow.parquet as pq

    errors = [] if blis_stdout == ref_stdout else ["stdout: text differs"]
    mine = sorted(p.relative_to(blis_dir) for p in blis_dir.rglob("*") if p.is_file())
    theirs = sorted(p.relative_to(ref_dir) for p in ref_dir.rglob("*") if p.is_file())
    if mine != theirs:
        errors.append(f"files: {[str(p) for p in mine]} != {[str(p) for p in theirs]}")
    for rel in sorted(set(mine) & set(theirs)):
        a, b = blis_dir / rel, ref_dir / rel
        if rel.suffix == ".parquet":
            old = pq.read_table(b).replace_schema_metadata(None)
            new = pq.read_table(a)
            if not set(old.column_names) <= set(new.column_names) or not new.select(
                    old.column_names).replace_schema_metadata(None).equals(old):
                errors.append(f"{rel}: data differs")
        elif a.read_bytes() != b.read_bytes():
            errors.append(f"{rel}: bytes differ")
    return errors


ANOMALY_HEADER = "=== Anomaly Counters ==="


def without_inversions(stdout: str) -> tuple[str, str]:
    """``stdout`` less its priority-inversion line, and that count ('' if absent); the anomaly
    section goes too when every other counter in it is 0 (blis_fast, like the April reference,
    prints the section only when a counter is non-zero, and the August reference counts
    inversions where April does not, so the section can exist on one side only)."""
    lines = stdout.splitlines(keepends=True)
    try:
        start = next(n for n, line in enumerate(lines) if line.strip() == ANOMALY_HEADER)
    except StopIteration:
        return stdout, ""
    end = start + 1
    while end < len(lines) and ":" in lines[end] and not lines[end].startswith("==="):
        end += 1
    section = lines[start + 1:end]
    count = ""
    rest = []
    for line in section:
        name, _, value = line.partition(":")
        if name.strip() == "Priority Inversions":
            count = value.strip()
        else:
            rest.append(line)
    if all(line.partition(":")[2].strip() in ("0", "0.0") for line in rest):
        return "".join(lines[:start] + lines[end:]), count
    return "".join(lines[:start + 1] + rest + lines[end:]), count


def compare_outputs(blis_dir: Path, blis_stdout: str, ref_dir: Path, ref_stdout: str) -> list[str]:
    """Every parity difference between the two runs' stdout and output files."""
    if EXACT["on"]:
        return exact_differences(blis_dir, blis_stdout, ref_dir, ref_stdout)
    inversions: tuple[str, str] = ("", "")
    if HEAD_EXTRAS["on"]:
        (blis_stdout, mine_inv), (ref_stdout, theirs_inv) = (
            without_inversions(blis_stdout), without_inversions(ref_stdout))
        inversions = (mine_inv, theirs_inv)
    try:
        errors = compare_stdout(blis_stdout, ref_stdout, head_extras=HEAD_EXTRAS["on"])
    except (ValueError, json.JSONDecodeError) as exc:
        errors = [f"stdout: not comparable ({exc})"]
    if inversions[0] != inversions[1]:
        errors.append(f"Priority Inversions: {inversions[0] or 0} != {inversions[1] or 0}")
    for name in OUTPUT_FILES:
        mine, theirs = blis_dir / name, ref_dir / name
        if mine.is_file() != theirs.is_file():
            errors.append(f"{name}: written by {'blis_fast' if mine.is_file() else 'reference'} "
                          "only")
        elif not mine.is_file():
            continue
        elif name == "results.json":
            a, b = json.loads(mine.read_text()), json.loads(theirs.read_text())
            if HEAD_EXTRAS["on"]:
                a, b = (_drop_keys(x, set(HEAD_EXTRA_KEYS)) for x in (a, b))
            errors += compare_results(a, b)
        elif _text(mine) == _text(theirs):
            continue
        elif name == "trace.csv":
            errors += trace_csv_differences(_text(mine), _text(theirs))
        else:
            errors.append(f"{name}: text differs")
    return errors


def _text(path: Path) -> str:
    """A text output file, less the lines the August reference adds (``--family august``)."""
    text = path.read_text()
    return _without_extra_lines(text) if HEAD_EXTRAS["on"] else text


def classify(blis: dict[str, Any], ref: dict[str, Any], errors: list[str],
             invalid: bool = False, noise: dict[str, str] | None = None) -> str:
    """The status of one configuration (one of STATUSES); ``invalid``: the configuration is
    deliberately wrong, so both sides must refuse it."""
    noise = KNOWN_NOISE if noise is None else noise
    if blis["exit_code"] is None and blis.get("limit") == "timeout":
        return "both-timeout" if ref["exit_code"] is None else "blis_fast-timeout"
    if blis["exit_code"] is None:
        return "blis_fast-oom" if blis.get("limit") == "oom" else "blis_fast-error"
    if ref["exit_code"] is None:
        return "reference-timeout"
    if blis["exit_code"] != 0 and ref["exit_code"] != 0:
        return "both-refused"
    if invalid and blis["exit_code"] == 0 and ref["exit_code"] == 0:
        return "invalid-accepted"
    if blis["exit_code"] != 0:
        return "blis_fast-refused"
    if ref["exit_code"] != 0:
        return "reference-refused"
    if not errors:
        return "agree"
    if all(field_name(e) in noise for e in errors):
        return "known-noise"
    return "differ"


def check_config(config: dict[str, Any], reference: str, timeout: float,
                 keep_dir: Path | None = None) -> dict[str, Any]:
    """Run one configuration on both sides and return its report record."""
    root = Path(tempfile.mkdtemp(prefix=f"diff-{config['id']}-"))
    try:
        dirs = {side: root / side for side in ("blis_fast", "reference")}
        for folder in dirs.values():
            folder.mkdir()
            for name, text in config.get("files", {}).items():
                (folder / name).write_text(text)
        args = [*config["args"], *OUTPUT_ARGS, *(EXACT_OUTPUT_ARGS if EXACT["on"] else [])]
        ref = run_reference(reference, args, dirs["reference"], timeout)
        # an opt-in only blis_fast takes (the August rule the reference applies unasked)
        blis = run_blis_fast([*args, *config.get("blis_fast_args", [])], dirs["blis_fast"],
                             timeout)
        errors: list[str] = []
        if blis["exit_code"] == 0 and ref["exit_code"] == 0:
            errors = compare_outputs(dirs["blis_fast"], blis["stdout"], dirs["reference"],
                                     ref["stdout"])
        status = classify(blis, ref, errors, bool(config.get("invalid")), _noise())
        fields = list(dict.fromkeys(field_name(e) for e in errors))
        record = {"id": config["id"], "status": status, "fields": fields[:10],
                  "differences": errors[:10], "num_differences": len(errors),
                  "blis_fast_exit": blis["exit_code"], "reference_exit": ref["exit_code"],
                  "blis_fast_stderr": _tail(blis["stderr"]),
                  "reference_stderr": _tail(ref["stderr"]),
                  "reference_seconds": round(ref["seconds"], 3),
                  "blis_fast_seconds": round(blis["seconds"], 3),
                  "family": config.get("family", "april"),
                  **({"invalid": True} if config.get("invalid") else {}),
                  **({"invalid_kind": config["invalid_kind"]} if "invalid_kind" in config
                     else {}),
                  "args": config["args"], "files": config.get("files", {}),
                  **({"blis_fast_args": config["blis_fast_args"]} if config.get("blis_fast_args")
                     else {})}
        if keep_dir is not None:
            shutil.copytree(root, keep_dir / config["id"], dirs_exist_ok=True)
        return record
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _noise() -> dict[str, str]:
    """The known-noise list of the family being run."""
    return FAMILY_NOISE.get(HEAD_EXTRAS["family"], KNOWN_NOISE)


def _tail(text: str, limit: int = 400) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-3:])[-limit:]


def _still_differs(original: dict[str, Any], record: dict[str, Any]) -> bool:
    """True when ``record`` shows the difference ``original`` found (same status; for 'differ',
    at least one of the same fields)."""
    if record["status"] != original["status"]:
        return False
    if original["status"] == "differ":
        return bool(set(record["fields"]) & set(original["fields"]))
    return True


def _without(config: dict[str, Any], pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """``config`` with its flags replaced by ``pairs`` (spec files no flag names are dropped)."""
    args: list[str] = []
    for flag, value in pairs:
        args += [flag] if flag in BOOL_FLAGS else [flag, value]
    files = {name: text for name, text in config.get("files", {}).items()
             if name in args or (name == "config.json" and "--model-config-folder" in args)}
    return {**config, "args": args, "files": files}


def shrink(config: dict[str, Any], record: dict[str, Any], reference: str, timeout: float,
           jobs: int = 1) -> dict[str, Any]:
    """A smaller configuration showing the same difference: flags dropped one by one (each
    single-flag removal is tried in parallel first, then kept greedily), ``--num-requests``
    halved while the difference remains, then the workload spec reduced (``_shrink_spec``)."""
    pairs = list(case_flags(config["args"]).items())
    # the August families keep the flags whose defaults the two references disagree on: a
    # "smaller" configuration without them would differ for that reason alone
    keep = SHRINK_KEEP | (HEAD_SHRINK_KEEP if HEAD_EXTRAS["on"] else frozenset())
    removable = [i for i, (flag, _) in enumerate(pairs) if flag not in keep]

    def attempt(candidate: list[tuple[str, str]]) -> bool:
        trial = _without(config, candidate)
        return _still_differs(record, check_config(trial, reference, timeout))

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        alone = list(pool.map(
            lambda i: attempt([p for j, p in enumerate(pairs) if j != i]), removable))
    droppable = {i for i, ok in zip(removable, alone, strict=True) if ok}
    kept = [p for j, p in enumerate(pairs) if j not in droppable]
    if droppable and not attempt(kept):  # the removals interact: drop them one at a time
        kept = list(pairs)
        for i in sorted(droppable, reverse=True):
            trial = kept[:i] + kept[i + 1:]
            if attempt(trial):
                kept = trial
    for n, (flag, value) in enumerate(kept):
        if flag == "--num-requests":
            count = int(value)
            while count >= 10:
                trial = kept[:n] + [(flag, str(count // 2))] + kept[n + 1:]
                if not attempt(trial):
                    break
                count //= 2
                kept = trial
    small = _without(config, kept)
    spec_name = dict(kept).get("--workload-spec")
    if spec_name in small["files"]:
        small = _shrink_spec(small, spec_name, record, reference, timeout)
    return small


SPEC_OPTIONAL_KEYS = ("lifecycle", "prefix_group", "prefix_length", "closed_loop", "spike",
                      "diurnal", "drain", "tenant_id", "slo_class", "streaming", "adapter",
                      "model")
"""Keys of a client or cohort that ``--shrink`` tries to delete."""
MAX_SPEC_ATTEMPTS = 40


def spec_reductions(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Smaller variants of a workload spec: one client or cohort fewer (while another remains),
    one optional key of a client or cohort fewer, no ``horizon``, half the ``num_requests``."""
    variants: list[dict[str, Any]] = []
    groups = [key for key in ("clients", "cohorts") if spec.get(key)]
    total = sum(len(spec[key]) for key in groups)
    for key in groups:
        for i in range(len(spec[key])):
            if total > 1:
                variant = copy.deepcopy(spec)
                del variant[key][i]
                if not variant[key]:
                    del variant[key]
                variants.append(variant)
            for name in SPEC_OPTIONAL_KEYS:
                if name in spec[key][i]:
                    variant = copy.deepcopy(spec)
                    del variant[key][i][name]
                    variants.append(variant)
    if "horizon" in spec:
        variants.append({k: v for k, v in spec.items() if k != "horizon"})
    if int(spec.get("num_requests", 0)) >= 10:
        variants.append({**spec, "num_requests": int(spec["num_requests"]) // 2})
    return variants


def _shrink_spec(config: dict[str, Any], name: str, record: dict[str, Any], reference: str,
                 timeout: float) -> dict[str, Any]:
    """``config`` with its workload spec reduced greedily (``spec_reductions``) while the
    difference remains, within MAX_SPEC_ATTEMPTS runs."""
    spec = yaml.safe_load(config["files"][name])
    attempts = 0
    reduced = True
    while reduced and attempts < MAX_SPEC_ATTEMPTS:
        reduced = False
        for variant in spec_reductions(spec):
            attempts += 1
            trial = {**config, "files": {**config["files"],
                                         name: yaml.safe_dump(variant, sort_keys=False)}}
            if _still_differs(record, check_config(trial, reference, timeout)):
                spec, config, reduced = variant, trial, True
                break
            if attempts >= MAX_SPEC_ATTEMPTS:
                break
    return config


SHRINK_KEEP = frozenset({"--model"})
"""Flags ``--shrink`` never drops."""
HEAD_SHRINK_KEEP = frozenset({"--latency-model", "--snapshot-refresh-interval"})
"""Flags ``--shrink`` keeps against the August reference: its defaults for them changed after
April (trained-physics, a 50000 µs snapshot refresh), blis_fast keeps April's."""
SHRINKABLE = frozenset({"differ", "blis_fast-refused", "reference-refused", "blis_fast-error"})
"""Statuses ``--shrink`` minimises (not the limits: each attempt would run into them again)."""


def run_all(configs: list[dict[str, Any]], reference: str, timeout: float, jobs: int,
            do_shrink: bool = False, report: Path | None = None,
            keep_dir: Path | None = None, quiet: bool = False) -> list[dict[str, Any]]:
    """Check every configuration (``jobs`` at a time); append records to ``report`` (JSONL)."""
    reference = str(Path(reference).resolve()) if os.sep in reference else reference
    records: list[dict[str, Any]] = []
    out = report.open("w") if report is not None else None
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            futures = [pool.submit(check_config, cfg, reference, timeout, keep_dir)
                       for cfg in configs]
            for cfg, future in zip(configs, futures, strict=True):
                record = future.result()
                if do_shrink and record["status"] in SHRINKABLE:
                    small = shrink(cfg, record, reference, timeout, jobs)
                    record["shrunk_args"] = small["args"]
                    record["shrunk_files"] = small["files"]
                records.append(record)
                if out is not None:
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                if not quiet:
                    with _PRINT_LOCK:
                        detail = ", ".join(record["fields"][:3])
                        print(f"{record['id']}: {record['status']}"
                              + (f" ({detail})" if detail else ""), flush=True)
    finally:
        if out is not None:
            out.close()
    return records


def summary_table(records: list[dict[str, Any]]) -> str:
    """Counts per status, then one line per configuration that needs a look."""
    counts = Counter(r["status"] for r in records)
    lines = [f"{'status':<20} {'count':>6}", "-" * 27]
    lines += [f"{status:<20} {counts[status]:>6}" for status in STATUSES if counts[status]]
    lines += ["-" * 27, f"{'total':<20} {len(records):>6}"]
    for r in records:
        if r["status"] in ("agree", "known-noise", "both-refused"):
            continue
        what = ", ".join(r["fields"][:5]) or r["blis_fast_stderr"] or r["reference_stderr"]
        lines.append(f"  {r['id']} {r['status']}: {what}")
        if "shrunk_args" in r:
            lines.append(f"    shrunk: {' '.join(r['shrunk_args'])}")
    if counts["known-noise"]:
        reasons: dict[str, list[str]] = {}
        for name, reason in _noise().items():
            reasons.setdefault(reason, []).append(name)
        lines += [f"known noise ({', '.join(names)}): {reason}"
                  for reason, names in reasons.items()]
    return "\n".join(lines)


def load_configs(path: Path) -> list[dict[str, Any]]:
    """Configurations from a JSONL file (a report of this tool can be re-run as is)."""
    configs = []
    for n, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            obj = json.loads(line)
            configs.append({"id": obj.get("id", f"c{n}"), "args": obj["args"],
                            "files": obj.get("files", {}),
                            "family": obj.get("family", "april"),
                            **({"blis_fast_args": obj["blis_fast_args"]}
                               if obj.get("blis_fast_args") else {}),
                            **({"invalid": True} if obj.get("invalid") else {}),
                            **({"invalid_kind": obj["invalid_kind"]} if "invalid_kind" in obj
                               else {})})
    return configs


def main(argv: list[str] | None = None) -> int:
    """Command line: generate (or load) configurations, check them, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True,
                        help="the reference blis binary (any executable taking 'run <flags>')")
    parser.add_argument("--seed", type=int, default=1, help="generator seed")
    parser.add_argument("--count", type=int, default=20, help="number of configurations")
    parser.add_argument("--max-requests", type=int, default=200,
                        help="largest request count a generated configuration asks for")
    parser.add_argument("--configs", type=Path,
                        help="JSONL of configurations ({id, args, files}) instead of generating")
    parser.add_argument("--jobs", type=int, default=1, help="configurations run in parallel")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a run (either side) may take")
    parser.add_argument("--memory-limit-mb", type=int, default=DEFAULT_MEMORY_LIMIT_MB,
                        help="address-space limit of the blis_fast worker processes (MiB)")
    parser.add_argument("--family", choices=FAMILIES, default="april",
                        help="configuration family: 'april' (the April reference b563c440), "
                             "'august' (P/D and autoscaler), 'lora' (LoRA adapters) or "
                             "'offload' (KV offload tier chain), the last three for the August "
                             "reference f90a1e3a: its stdout/file additions are ignored, its "
                             "noise listed")
    parser.add_argument("--offload-tiers", choices=OFFLOAD_TIER_MODES, default="all",
                        help="--family offload: 'cpu' draws only the chain's CPU tier (no "
                             "secondary_tiers), 'all' also NVMe/SATA/S3-class tiers")
    parser.add_argument("--shrink", action="store_true",
                        help="minimise each configuration that differs or is refused by one side")
    parser.add_argument("--report", type=Path, default=Path("differential-report.jsonl"),
                        help="JSONL report written here")
    parser.add_argument("--keep-dirs", type=Path,
                        help="copy every run's folder (inputs and outputs) under this folder")
    parser.add_argument("--exact", action="store_true",
                        help="the other side is an earlier blis_fast build: stdout and files "
                             "must be identical (Parquet by data, on its columns)")
    opts = parser.parse_args(argv)
    EXACT["on"] = opts.exact
    HEAD_EXTRAS["on"] = opts.family in HEAD_FAMILIES
    HEAD_EXTRAS["family"] = opts.family
    if opts.memory_limit_mb < 64:
        parser.error(f"--memory-limit-mb must be >= 64, got {opts.memory_limit_mb}")
    LIMITS["memory_mb"] = opts.memory_limit_mb
    configs = (load_configs(opts.configs) if opts.configs
               else generate_configs(opts.seed, opts.count, opts.max_requests, opts.family,
                                     opts.offload_tiers))
    if opts.keep_dirs:
        opts.keep_dirs.mkdir(parents=True, exist_ok=True)
    records = run_all(configs, opts.reference, opts.timeout, opts.jobs, opts.shrink,
                      opts.report, opts.keep_dirs)
    print(summary_table(records))
    print(f"report: {opts.report}")
    close_workers()
    return 1 if any(r["status"] in BAD_STATUSES for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
