"""Interrupted sweeps: ``blis sweep`` killed halfway (SIGINT or SIGKILL) and rerun with
``--resume`` ends with exactly the rows of an uninterrupted run.

The sweep runs as a child process (``python -m blis_fast.cli``) and is signalled once a few
configurations have been written.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _sweep import MODEL, invoke, subprocess_env, summary, write_spec

from blis_fast.sweep.run import run_sweep

SPEC = f"""\
base:
  model: {MODEL}
  num_instances: 2
  num_requests: 1000
grid:
  rate: [10, 20, 30, 40, 50]
  max_num_running_reqs: [32, 256]
seeds: 4
"""
TOTAL = 40


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume-ref")
    out = root / "out"
    run_sweep(write_spec(root, SPEC), out, workers=1)
    return out


def _start(spec: Path, out: Path, workers: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "blis_fast.cli", "sweep", str(spec), "--out", str(out),
         "--workers", str(workers), "--chunk-size", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())


def _wait_for_rows(proc: subprocess.Popen, out: Path, rows: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(list((out / "summary").glob("*.parquet"))) < rows:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep wrote no rows in time"
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (from /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _resume_and_compare(spec: Path, out: Path, uninterrupted: Path) -> None:
    partial = summary(out).height
    assert 3 <= partial < TOTAL
    run = invoke(["sweep", str(spec), "--out", str(out), "--workers", "1", "--resume"])
    assert run.code == 0, run.stderr
    assert f"{TOTAL - partial} configuration(s) run (0 failed), {partial} already done" \
        in run.stdout
    assert summary(out).equals(summary(uninterrupted))
    assert not list((out / "summary").glob(".*"))  # no temporary file left
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["configs_to_run"] for r in manifest["runs"]] == [TOTAL, TOTAL - partial]
    assert manifest["runs"][-1]["interrupted"] is False


@pytest.mark.parametrize("workers", [1, 2])
def test_sigint_then_resume_gives_the_uninterrupted_rows(tmp_path, uninterrupted, workers):
    spec = write_spec(tmp_path, SPEC)
    out = tmp_path / "out"
    proc = _start(spec, out, workers=workers)
    _wait_for_rows(proc, out, 3)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "rerun with --resume" in stderr and stderr.rstrip().endswith("blis: interrupted")
    assert json.loads((out / "manifest.json").read_text())["runs"][0]["interrupted"] is True
    _resume_and_compare(spec, out, uninterrupted)


def test_sigkill_then_resume_gives_the_uninterrupted_rows(tmp_path, uninterrupted):
    spec = write_spec(tmp_path, SPEC)
    out = tmp_path / "out"
    proc = _start(spec, out, workers=2)
    _wait_for_rows(proc, out, 3)
    workers = _children(proc.pid) if Path("/proc").is_dir() else []
    assert len(workers) >= 2 or not Path("/proc").is_dir()  # the two pool workers at least
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # the pool's workers notice that the sweep is gone and exit by themselves
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)
    assert json.loads((out / "manifest.json").read_text())["runs"][0]["finished_at"] is None
    _resume_and_compare(spec, out, uninterrupted)


def test_resume_refuses_another_sweeps_directory(tmp_path, uninterrupted):
    spec = write_spec(tmp_path, SPEC.replace("seeds: 4", "seeds: 2"))
    run = invoke(["sweep", str(spec), "--out", str(uninterrupted), "--resume"])
    assert run.code == 2 and run.stderr.count("\n") == 1
    assert "another sweep" in run.stderr
    assert summary(uninterrupted).height == TOTAL


def test_resume_refuses_files_of_another_schema_version(tmp_path, uninterrupted):
    """A sweep started by a blis_fast whose summary schema differs (its files say so in their
    provenance) is not resumed into: one line, exit 2, nothing written."""
    import shutil

    import pyarrow.parquet as pq

    out = tmp_path / "old"
    shutil.copytree(uninterrupted, out)
    first = sorted((out / "summary").glob("*.parquet"))[0]
    table = pq.read_table(first)
    meta = dict(table.schema.metadata)
    meta[b"blis_fast.schema_version"] = b"1"
    pq.write_table(table.replace_schema_metadata(meta), first)
    before = sorted(p.name for p in (out / "summary").iterdir())
    run = invoke(["sweep", str(write_spec(tmp_path, SPEC)), "--out", str(out), "--resume",
                  "--workers", "1"])
    assert run.code == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "summary schema version 1" in run.stderr and first.name in run.stderr
    assert sorted(p.name for p in (out / "summary").iterdir()) == before


def test_resume_of_a_finished_sweep_runs_nothing(tmp_path, uninterrupted):
    before = {p.name: p.stat().st_mtime_ns for p in (uninterrupted / "summary").iterdir()}
    run = invoke(["sweep", str(write_spec(tmp_path, SPEC)), "--out", str(uninterrupted),
                  "--resume", "--workers", "1"])
    assert run.code == 0 and f"0 configuration(s) run (0 failed), {TOTAL} already done" \
        in run.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (uninterrupted / "summary").iterdir()} == before
    assert os.path.exists(uninterrupted / "manifest.json")


def test_an_interrupt_reported_by_compiled_code_stops_the_sweep():
    """Numba reports a Ctrl-C inside a kernel as a SystemError caused by KeyboardInterrupt."""
    from blis_fast.sweep.worker import raise_if_interrupted

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as cause:
            raise SystemError("returned a result with an exception set") from cause
    except SystemError as exc:
        with pytest.raises(KeyboardInterrupt):
            raise_if_interrupted(exc)
    raise_if_interrupted(ValueError("an ordinary failure"))  # not an interrupt: no raise
