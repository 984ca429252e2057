"""Benchmark whole ``blis run`` processes on this machine; print a table, write bench/results.json.

Each measurement is one ``blis run`` process started with :mod:`subprocess`: wall time is
``time.perf_counter()`` around the process, CPU time is the user + system time and peak RSS the
``ru_maxrss`` that ``os.wait4`` returns for that process (the same figures ``/usr/bin/time -v``
prints, counted over the process and the children it waited for, e.g. the cold start's
engine-compiling second process). Each case runs ``--repeat`` times (default 3) and the median
is reported, with the 1-minute load average before the case: on a machine shared with other
work, wall time follows the load and CPU time is the figure to compare (it still grows by up to
~10% under heavy load).

Cases:

  a  quick start, warm kernel cache         ``--model meta-llama/llama-3.1-8b-instruct``
  b  10k requests, 4 instances, 50 req/s    (roofline, the quick start's model)
  c  100k requests, 16 instances, 400 req/s (same model; the Go reference: 197 s, 7.4 GB)

``--model`` is required by ``blis run`` (there is no default model), so b and c use the quick
start's ``meta-llama/llama-3.1-8b-instruct`` with every other flag at its default.
  d  cold compile: the quick start with NUMBA_CACHE_DIR in a fresh empty temp dir; its stderr
     should carry a one-line notice that the kernels are being compiled

Warm cases (a, b, c) get one untimed warm-up run first, so the kernel cache is filled.

Usage::

    python bench/run_bench.py              # a, b, c, d; 3 repeats each
    python bench/run_bench.py --quick      # a and d only
    python bench/run_bench.py --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
QUICKSTART_STDOUT = (
    REPO_ROOT / "tests" / "reference_cases" / "cases" / "quickstart-llama31-8b" / "stdout.txt"
)
MB = 1_000_000  # peak RSS is reported in MB (10^6 bytes)

QUICKSTART_ARGS = ["--model", "meta-llama/llama-3.1-8b-instruct"]
COMPILE_NOTICE = re.compile(r"compil", re.IGNORECASE)


@dataclass
class Case:
    key: str
    title: str
    args: list[str]
    cold: bool = False
    max_wall_s: float | None = None
    max_rss_mb: float | None = None
    check_quickstart_stdout: bool = False
    timeout_s: float = 600.0


CASES: dict[str, Case] = {
    "a": Case("a", "quick start (warm cache)", QUICKSTART_ARGS, max_wall_s=1.5,
              check_quickstart_stdout=True),
    "b": Case("b", "10k req, 4 inst, 50 req/s",
              [*QUICKSTART_ARGS, "--num-requests", "10000", "--num-instances", "4",
               "--rate", "50"]),
    "c": Case("c", "100k req, 16 inst, 400 req/s",
              [*QUICKSTART_ARGS, "--num-requests", "100000", "--num-instances", "16",
               "--rate", "400"],
              max_wall_s=4.0, max_rss_mb=600.0),
    "d": Case("d", "cold compile (quick start)", QUICKSTART_ARGS, cold=True, max_wall_s=60.0,
              check_quickstart_stdout=True, timeout_s=900.0),
}


@dataclass
class ProcessRun:
    """One ``blis run`` process."""

    exit_code: int
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    stdout: str
    stderr: str


@dataclass
class CaseResult:
    key: str
    title: str
    argv: list[str]
    runs: list[dict] = field(default_factory=list)
    median_wall_s: float | None = None
    median_cpu_s: float | None = None
    load_average: float | None = None
    median_peak_rss_mb: float | None = None
    target: str = ""
    meets_target: bool | None = None
    errors: list[str] = field(default_factory=list)
    compile_notice_lines: list[str] | None = None


def find_blis() -> str:
    """The ``blis`` console script of this interpreter (skipping shims such as pyenv's)."""
    beside = Path(sys.executable).with_name("blis")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("blis")
    if found is None:
        raise SystemExit("run_bench: no `blis` executable found (pip install -e . first)")
    return found


def run_blis(blis: str, args: list[str], *, env: dict[str, str] | None = None,
             cwd: str | Path | None = None, timeout_s: float = 600.0,
             command: str = "run") -> ProcessRun:
    """Run ``blis <command> <args>`` as a process; wall time and peak RSS of that process (the
    largest of it and the children it waited for, e.g. a sweep's workers)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([blis, command, *args], stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, env=env, cwd=cwd)
        deadline = start + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.005)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return ProcessRun(exit_code=proc.returncode, wall_s=wall,
                          cpu_s=usage.ru_utime + usage.ru_stime,
                          peak_rss_bytes=usage.ru_maxrss * 1024,  # Linux: KiB
                          stdout=out.read(), stderr=err.read())


def _target_text(case: Case) -> str:
    parts = []
    if case.max_wall_s is not None:
        parts.append(f"< {case.max_wall_s:g} s")
    if case.max_rss_mb is not None:
        parts.append(f"< {case.max_rss_mb:g} MB")
    return ", ".join(parts) or "-"


def measure(case: Case, blis: str, repeat: int, workdir: Path) -> CaseResult:
    """Run one case ``repeat`` times (after a warm-up for warm cases)."""
    result = CaseResult(case.key, case.title, ["blis", "run", *case.args],
                        target=_target_text(case))
    expected = QUICKSTART_STDOUT.read_text() if QUICKSTART_STDOUT.is_file() else None
    base_env = dict(os.environ)
    result.load_average = round(os.getloadavg()[0], 2)
    if not case.cold:
        warm = run_blis(blis, case.args, env=base_env, cwd=workdir, timeout_s=case.timeout_s)
        if warm.exit_code != 0:
            result.errors.append(f"warm-up exited {warm.exit_code}: {warm.stderr.strip()[-500:]}")
            return result
    notices: list[str] = []
    for i in range(repeat):
        env = dict(base_env)
        cache_dir = None
        if case.cold:
            cache_dir = tempfile.mkdtemp(prefix="blis-bench-numba-cache-")
            env["NUMBA_CACHE_DIR"] = cache_dir
        try:
            run = run_blis(blis, case.args, env=env, cwd=workdir, timeout_s=case.timeout_s)
        finally:
            if cache_dir is not None:
                shutil.rmtree(cache_dir, ignore_errors=True)
        entry = {"wall_s": round(run.wall_s, 4), "cpu_s": round(run.cpu_s, 3),
                 "peak_rss_mb": round(run.peak_rss_bytes / MB, 1),
                 "exit_code": run.exit_code}
        if run.exit_code != 0:
            result.errors.append(f"run {i + 1} exited {run.exit_code}: "
                                 f"{run.stderr.strip()[-500:]}")
        if case.check_quickstart_stdout and expected is not None:
            entry["stdout_matches_reference"] = run.stdout == expected
            if run.stdout != expected:
                result.errors.append(f"run {i + 1}: stdout differs from {QUICKSTART_STDOUT}")
        if case.cold:
            lines = [ln for ln in run.stderr.splitlines() if COMPILE_NOTICE.search(ln)]
            entry["compile_notice_lines"] = lines
            notices = lines
        result.runs.append(entry)
    walls = [r["wall_s"] for r in result.runs]
    rsss = [r["peak_rss_mb"] for r in result.runs]
    result.median_wall_s = round(statistics.median(walls), 4)
    result.median_cpu_s = round(statistics.median(r["cpu_s"] for r in result.runs), 3)
    result.median_peak_rss_mb = round(statistics.median(rsss), 1)
    ok = True
    if case.max_wall_s is not None:
        ok &= result.median_wall_s < case.max_wall_s
    if case.max_rss_mb is not None:
        ok &= result.median_peak_rss_mb < case.max_rss_mb
    result.meets_target = ok if (case.max_wall_s or case.max_rss_mb) else None
    if case.cold:
        result.compile_notice_lines = notices
    return result


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: list[CaseResult]) -> None:
    head = ["case", "what", "median wall s", "min..max s", "median cpu s", "load",
            "median peak RSS MB", "target", "ok"]
    rows = []
    for r in results:
        walls = [x["wall_s"] for x in r.runs]
        spread = f"{min(walls):.2f}..{max(walls):.2f}" if walls else "-"
        ok = {True: "yes", False: "NO", None: "-"}[r.meets_target]
        if r.errors:
            ok = "ERROR"
        rows.append([r.key, r.title, _fmt(r.median_wall_s, ".2f"), spread,
                     _fmt(r.median_cpu_s, ".2f"), _fmt(r.load_average, ".1f"),
                     _fmt(r.median_peak_rss_mb, ".0f"), r.target, ok])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    for r in results:
        if r.compile_notice_lines is not None:
            if len(r.compile_notice_lines) == 1:
                print(f"({r.key}) compile notice on stderr: {r.compile_notice_lines[0]}")
            elif not r.compile_notice_lines:
                print(f"({r.key}) compile notice on stderr: MISSING")
            else:
                print(f"({r.key}) compile notice on stderr: {len(r.compile_notice_lines)} lines "
                      f"(expected one): {r.compile_notice_lines}")
        for err in r.errors:
            print(f"({r.key}) error: {err}")


def machine_info(blis: str) -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "blis": Path(blis).name,  # the executable's name only: no machine path in the results
    }
    try:
        import numba
        import numpy

        info["numba"] = numba.__version__
        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            info["mem_total"] = fh.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        info["git_commit"] = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
            check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only cases a and d")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median reported)")
    parser.add_argument("--cases", default=None, help="comma-separated subset, e.g. a,c")
    parser.add_argument("--blis", default=None, help="path of the blis executable")
    parser.add_argument("--output", type=Path, default=BENCH_DIR / "results.json")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a target is missed (errors always exit 1)")
    ns = parser.parse_args(argv)
    if ns.repeat < 1:
        parser.error("--repeat must be >= 1")
    keys = ["a", "d"] if ns.quick else list(CASES)
    if ns.cases:
        keys = [k.strip() for k in ns.cases.split(",") if k.strip()]
        unknown = [k for k in keys if k not in CASES]
        if unknown:
            parser.error(f"unknown case(s) {unknown}; known: {list(CASES)}")
    blis = ns.blis or find_blis()

    results = []
    with tempfile.TemporaryDirectory(prefix="blis-bench-") as workdir:
        for key in keys:
            case = CASES[key]
            print(f"[{key}] {case.title}: blis run {' '.join(case.args)} "
                  f"(x{ns.repeat}{', cold' if case.cold else ', after a warm-up'})",
                  file=sys.stderr, flush=True)
            results.append(measure(case, blis, ns.repeat, Path(workdir)))

    print_table(results)
    report = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "repeat": ns.repeat,
        "machine": machine_info(blis),
        "rss_unit": "MB (10^6 bytes), from ru_maxrss of os.wait4",
        "cases": [asdict(r) for r in results],
    }
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    ns.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {ns.output}")
    if any(r.errors for r in results):
        return 1
    if ns.strict and any(r.meets_target is False for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
