"""Hostile input never crashes, hangs, prints a traceback, clobbers a file or runs wrongly.

Every refused case asserts: exit code 2, exactly one stderr line naming the culprit (flag,
file or key), no traceback, no file left behind and no pre-existing file changed, within a
bounded time. Cases that used to crash the interpreter (libyaml's C stack) or block forever
(FIFOs, saturate's bisection) run ``blis`` in a subprocess with a timeout; the rest run
in-process (``tests/_cli.py``). Fixtures are made here: nested YAML, control bytes, FIFOs
(``os.mkfifo``), a symlink and a FIFO standing in for device nodes (the real ``/dev`` is only
read, as ``/dev/zero``), paths under ``/proc`` for a folder no file can be created in (the
tests run as root, so a chmod-ed folder would not stop them).
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _cli import invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_errors import WORKLOAD_SPEC

import blis_fast
from blis_fast.data import data_path
from blis_fast.errors import BlisError

MODEL = "meta-llama/llama-3.1-8b-instruct"
BB = ["--alpha-coeffs", "100,1,100", "--beta-coeffs", "1000,10,5"]  # blackbox: no model config
RUN = ["run", "--model", MODEL, "--log", "error", *BB, "--num-requests", "3"]
ROOT = Path(blis_fast.__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NESTED = "[" * 200_000  # ~200 KB of nested flow sequences

SWEEP_SPEC = "base:\n  model: meta-llama/llama-3.1-8b-instruct\n  num_requests: 3\n" \
             "  alpha_coeffs: [100, 1, 100]\n  beta_coeffs: [1000, 10, 5]\n"


# ------------------------------------------------------------------------------------ helpers


def snapshot(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every entry under ``root``: its type and (for files and links) its content."""
    out: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st_ = os.lstat(p)
            if stat.S_ISLNK(st_.st_mode):
                out[str(p)] = ("link", os.readlink(p).encode())
            elif stat.S_ISREG(st_.st_mode):
                out[str(p)] = ("file", p.read_bytes())
            elif stat.S_ISFIFO(st_.st_mode):
                out[str(p)] = ("fifo", b"")
            else:
                out[str(p)] = ("dir" if stat.S_ISDIR(st_.st_mode) else "other", b"")
    return out


def blis_subprocess(args: list[str], cwd: Path, timeout: float = 180) -> tuple[int, str, str]:
    """``python -m blis_fast.cli <args>``; a hang fails the test instead of blocking it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "blis_fast.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def blis(args: list[str], cwd: Path, *, subprocess_: bool = False) -> tuple[int, str, str]:
    if subprocess_:
        return blis_subprocess(args, cwd)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        run = invoke(args)
    finally:
        os.chdir(old)
    return run.code, run.stdout, run.stderr


def assert_refused(result: tuple[int, str, str], names: tuple[str, ...] | str) -> str:
    code, _out, err = result
    names = (names,) if isinstance(names, str) else names
    detail = f"exit={code}\nstderr={err[-2000:]!r}"
    assert "Traceback" not in err, detail
    assert code == 2, detail
    lines = err.splitlines()
    assert len(lines) == 1, detail
    assert any(n in lines[0] for n in names), f"{names} not named: {detail}"
    return lines[0]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder holding the case's inputs and receiving its outputs (also the cwd)."""
    d = tmp_path / "work"
    d.mkdir()
    return d


def refused_cleanly(args: list[str], work: Path, names, *, subprocess_: bool = False) -> str:
    """Run, assert the refusal, and that the folder is exactly as it was."""
    before = snapshot(work)
    line = assert_refused(blis(args, work, subprocess_=subprocess_), names)
    assert snapshot(work) == before, "a file was left behind or changed"
    return line


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


# --------------------------------------------------------------- destructive writes (device nodes)


def test_symlink_output_keeps_the_link_and_replaces_its_target(work: Path) -> None:
    """An output naming a symlink (as /dev/stdout is) writes the link's target; the link stays."""
    target = write(work / "real.json", "old")
    link = work / "link.json"
    link.symlink_to(target)
    code, _, err = blis([*RUN, "--metrics-path", str(link)], work)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["completed_requests"] == 3


def test_fifo_output_is_written_in_place_not_replaced(work: Path) -> None:
    """A FIFO stands in for a device node: it is written through, and is still a FIFO after."""
    fifo = work / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader exists before the write
    try:
        code, _, err = blis([*RUN, "--metrics-path", str(fifo)], work)
        data = os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert json.loads(data)["completed_requests"] == 3


def test_fifo_output_without_reader_is_refused_not_blocked(work: Path) -> None:
    fifo = work / "out.fifo"
    os.mkfifo(fifo)
    line = refused_cleanly([*RUN, "--metrics-path", str(fifo)], work, "--metrics-path",
                           subprocess_=True)
    assert "fifo" in line.lower()


@pytest.mark.parametrize("flag", ["--policy-config", "--workload-spec", "--defaults-filepath"])
def test_output_naming_an_input_is_refused(flag: str, work: Path) -> None:
    src = {"--policy-config": EXAMPLES / "policy-config.yaml",
           "--workload-spec": None, "--defaults-filepath": data_path("defaults.yaml")}[flag]
    inp = write(work / "input.yaml", src.read_bytes() if src else WORKLOAD_SPEC)
    args = [*RUN, flag, str(inp), "--metrics-path", str(inp)]
    line = refused_cleanly(args, work, "--metrics-path")
    assert flag in line


def test_trace_output_naming_an_input_is_refused(work: Path) -> None:
    spec = write(work / "t.yaml", WORKLOAD_SPEC)
    refused_cleanly([*RUN, "--workload-spec", str(spec), "--trace-output", str(work / "t")],
                    work, "--trace-output")


# -------------------------------------------------------------------- crashes: deep YAML


def _nested(work: Path) -> Path:
    return write(work / "nested.yaml", NESTED)


@pytest.mark.parametrize("flag", ["--policy-config", "--defaults-filepath", "--workload-spec"])
def test_deeply_nested_yaml_run_input_is_refused(flag: str, work: Path) -> None:
    line = refused_cleanly([*RUN, flag, str(_nested(work))], work, ("nested.yaml",),
                           subprocess_=True)
    assert "deeper than" in line


def test_deeply_nested_yaml_in_other_consumers_is_refused(work: Path) -> None:
    nested = _nested(work)
    csv_file = write(work / "t.csv", "request_id\n")
    for args in (["sweep", str(nested), "--out", str(work / "o")],
                 ["replay", "--model", MODEL, *BB, "--trace-header", str(nested),
                  "--trace-data", str(csv_file)],
                 ["compose", "--from", str(nested)],
                 ["convert", "inference-perf", "--spec", str(nested)]):
        refused_cleanly(args, work, ("nested.yaml",), subprocess_=True)


def test_alias_bomb_is_refused(work: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    bomb = write(work / "bomb.yaml", "\n".join(levels) + "\n")
    line = refused_cleanly([*RUN, "--policy-config", str(bomb)], work, "bomb.yaml",
                           subprocess_=True)
    assert "aliases" in line


# ------------------------------------------------------------------------------ hangs


@pytest.mark.parametrize("flag", ["--policy-config", "--workload-spec", "--defaults-filepath",
                                  "--hardware-config"])
def test_fifo_input_is_refused_not_blocked(flag: str, work: Path) -> None:
    fifo = work / "in.fifo"
    os.mkfifo(fifo)
    base = RUN if flag != "--hardware-config" else [a for a in RUN if a not in BB]  # roofline
    line = refused_cleanly([*base, flag, str(fifo)], work, "in.fifo", subprocess_=True)
    assert "fifo" in line.lower()


def test_fifo_trace_data_and_sweep_spec_are_refused(work: Path) -> None:
    fifo = work / "in.fifo"
    os.mkfifo(fifo)
    header = write(work / "h.yaml", "trace_version: 2\ntime_unit: microseconds\n")
    refused_cleanly(["replay", "--model", MODEL, *BB, "--trace-header", str(header),
                     "--trace-data", str(fifo)], work, "in.fifo", subprocess_=True)
    refused_cleanly(["sweep", str(fifo), "--out", str(work / "o")], work, "in.fifo",
                    subprocess_=True)


_BISECT = """
import json, sys
from blis_fast import api
from blis_fast.sweep import saturate as S
template = api.run(model="meta-llama/llama-3.1-8b-instruct", log="error", num_requests=3,
                   alpha_coeffs=[100, 1, 100], beta_coeffs=[1000, 10, 5]).summary_row

class Fake:
    def __init__(self, rate):
        self.summary_row = {**template, "ttft_p99_ms": rate}  # the metric grows with the rate

api.run = lambda **kw: Fake(kw["rate"])
task = S.SaturationTask("c", {}, (S.parse_slo("ttft_p99_ms<=3.3"),), 1.0, 100.0, 1e-300)
res = S.bisect_rate(task)
print(json.dumps([res.max_rate, res.min_failing_rate, res.runs]))
"""


def test_saturate_bisection_stops_at_float_resolution() -> None:
    """--tolerance 1e-300 once looped forever: the bracket stops shrinking at one ulp."""
    proc = subprocess.run([sys.executable, "-c", _BISECT], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    low, high, runs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert low <= 3.3 < high and math.nextafter(low, math.inf) == high  # adjacent floats
    assert runs < 120


# ------------------------------------------------------------------------- memory blow-ups


@pytest.mark.parametrize("flag", ["--policy-config", "--workload-spec", "--defaults-filepath"])
def test_dev_zero_input_is_refused(flag: str, work: Path) -> None:
    line = refused_cleanly([*RUN, flag, "/dev/zero"], work, "/dev/zero", subprocess_=True)
    assert "character device" in line


def test_input_over_the_size_limit_is_refused(work: Path) -> None:
    big = work / "big.yaml"
    with open(big, "wb") as fh:
        fh.truncate(65 << 20)  # sparse: costs no disk
    line = refused_cleanly([*RUN, "--policy-config", str(big)], work, "big.yaml")
    assert "limit" in line


@pytest.mark.parametrize(("args", "flag"), [
    (["--num-requests", str(10**12)], "--num-requests"),
    (["--kv-cpu-blocks", str(10**9)], "--kv-cpu-blocks"),
    (["--prefix-tokens", str(10**9), "--num-requests", "100"], "--prefix-tokens"),
    (["--tp", "1000"], "--tp"),
])
def test_sizes_beyond_available_memory_are_refused(args, flag, work: Path) -> None:
    refused_cleanly(["run", "--model", MODEL, "--log", "error", *args], work, flag)


def test_counterfactual_k_is_capped_at_the_instance_count(work: Path) -> None:
    code, out, err = blis([*RUN, "--num-instances", "2", "--trace-level", "decisions",
                           "--counterfactual-k", str(10**12)], work)
    assert code == 0, err
    code2, out2, _ = blis([*RUN, "--num-instances", "2", "--trace-level", "decisions",
                           "--counterfactual-k", "2"], work)
    assert code2 == 0 and out == out2


def test_sweep_axes_are_counted_before_expansion(work: Path) -> None:
    spec = write(work / "s.yaml", SWEEP_SPEC + "seeds: 1000000000000\n")
    line = refused_cleanly(["sweep", str(spec), "--out", str(work / "o")], work, "s.yaml")
    assert "1000000000000" in line
    grid = write(work / "g.yaml", SWEEP_SPEC + "grid:\n  rate: [" + ",".join(
        str(i + 1) for i in range(400)) + "]\n  num_instances: [" + ",".join(
        str(i + 1) for i in range(400)) + "]\n")
    line = refused_cleanly(["sweep", str(grid), "--out", str(work / "o")], work, "g.yaml")
    assert "160000" in line


# -------------------------------------------------------------- tracebacks: output paths


@pytest.mark.parametrize("flag", ["--metrics-path", "--trace-output", "--output-dir"])
@pytest.mark.parametrize("where", ["missing-folder", "directory", "proc"])
def test_unusable_output_path_is_refused_before_the_run(flag: str, where: str,
                                                        work: Path) -> None:
    if where == "directory" and flag == "--output-dir":
        target = str(write(work / "file", "x"))  # a file where a folder is expected
    elif where == "directory" and flag == "--trace-output":
        (work / "t.yaml").mkdir()
        target = str(work / "t")
    else:
        target = {"missing-folder": str(work / "no" / "such" / "out"),
                  "directory": str(work), "proc": "/proc/blis-hostile/out"}[where]
        if where == "missing-folder" and flag == "--output-dir":
            target = "/proc/blis-hostile/out"  # --output-dir makes missing folders
    refused_cleanly([*RUN, "--num-requests", "200000", flag, target], work, flag)


def test_saturate_and_sweep_out_paths_are_checked_first(work: Path) -> None:
    spec = write(work / "s.yaml", SWEEP_SPEC)
    refused_cleanly(["saturate", str(spec), "--slo", "ttft_p99_ms<=500", "--out",
                     "/proc/blis-hostile.parquet"], work, "--out")
    refused_cleanly(["sweep", str(spec), "--out", "/proc/blis-hostile"], work, "--out")


def test_failed_output_removes_everything_the_run_wrote(work: Path, monkeypatch) -> None:
    """A full disk while writing the Parquet files: the metrics file and the trace written
    before it are removed too (the outputs are all or nothing)."""
    import pyarrow.parquet as pq

    def full(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    line = refused_cleanly([*RUN, "--metrics-path", str(work / "m.json"), "--trace-output",
                            str(work / "t"), "--output-dir", str(work / "pq")], work,
                           "--output-dir")
    assert "no space left" in line


def test_existing_outputs_survive_a_failed_run(work: Path, monkeypatch) -> None:
    import pyarrow.parquet as pq

    metrics = write(work / "m.json", "previous")
    monkeypatch.setattr(pq, "write_table",
                        lambda *_a, **_k: (_ for _ in ()).throw(OSError(30, "Read-only file "
                                                                           "system")))
    refused_cleanly([*RUN, "--metrics-path", str(metrics), "--output-dir", str(work / "pq")],
                    work, "--output-dir")
    assert metrics.read_text() == "previous"


# ---------------------------------------------------------- tracebacks: malformed input files


@pytest.mark.parametrize("bad", [b"\x00", b"\x07", b"\x1b"])
@pytest.mark.parametrize("flag", ["--policy-config", "--workload-spec", "--defaults-filepath"])
def test_control_bytes_in_yaml_are_refused_with_a_line(flag: str, bad: bytes,
                                                       work: Path) -> None:
    f = write(work / "c.yaml", b"a: 1\nb: x" + bad + b"y\n")
    line = refused_cleanly([*RUN, flag, str(f)], work, "c.yaml")
    assert "line 2" in line


def test_control_bytes_in_sweep_spec_and_trace_header(work: Path) -> None:
    f = write(work / "c.yaml", b"trace_version: 2\nx: \x00\n")
    data = write(work / "t.csv", "request_id\n")
    refused_cleanly(["sweep", str(f), "--out", str(work / "o")], work, "c.yaml")
    refused_cleanly(["replay", "--model", MODEL, *BB, "--trace-header", str(f), "--trace-data",
                     str(data)], work, "c.yaml")


def _spec_with(work: Path, old: str, new: str) -> Path:
    assert old in WORKLOAD_SPEC
    return write(work / "w.yaml", WORKLOAD_SPEC.replace(old, new))


@pytest.mark.parametrize(("old", "new", "key"), [
    ("type: exponential\n      params: {mean: 50}",
     "type: pareto_lognormal\n      params: {alpha: 0, xm: 1, mu: 1, sigma: 1, mix_weight: 0.5}",
     "alpha"),
    ("std_dev: 10", "std_dev: -10", "std_dev"),
    ("mean: 50", "mean: -50", "mean"),
    ("version: \"2\"", "version: \"9\"", "version"),
    ("    rate_fraction: 1.0\n", "    rate_fraction: 1.0\n    network: {rtt_ms: -5}\n",
     "rtt_ms"),
    ("    rate_fraction: 1.0\n", "    rate_fraction: 1.0\n    reasoning:\n      multi_turn: "
     "{max_rounds: 2, think_time_us: -1}\n", "think_time_us"),
])
def test_workload_spec_values_without_meaning_are_refused(old, new, key, work: Path) -> None:
    spec = _spec_with(work, old, new)
    line = refused_cleanly([*RUN, "--workload-spec", str(spec)], work, key)
    assert "w.yaml" in line


def test_huge_distribution_mean_is_refused_not_a_memory_error(work: Path) -> None:
    spec = _spec_with(work, "mean: 50", "mean: 1.0e15")
    refused_cleanly(["run", "--model", MODEL, "--log", "error", "--workload-spec", str(spec)],
                    work, ("--workload-spec", "memory", "params.mean"), subprocess_=True)


def test_integers_outside_int64_are_refused(work: Path) -> None:
    pol = write(work / "p.yaml", "admission:\n  policy: tier-shed\n  tier_shed_threshold: "
                                 "99999999999999999999\n")
    line = refused_cleanly([*RUN, "--policy-config", str(pol)], work, "p.yaml")
    assert "64-bit" in line
    spec = write(work / "s.yaml", SWEEP_SPEC + "seeds: [99999999999999999999]\n")
    refused_cleanly(["sweep", str(spec), "--out", str(work / "o")], work, "s.yaml")
    for flag in ("--think-time-ms", "--prefix-tokens"):
        refused_cleanly([*RUN, flag, "99999999999999999999"], work, flag)


def test_int64_edge_values_that_would_overflow_are_refused(work: Path) -> None:
    """Values inside int64 whose µs conversion or event arithmetic would overflow
    (--think-time-ms INT64_MAX once raised OverflowError)."""
    big = str((1 << 63) - 1)
    refused_cleanly([*RUN, "--concurrency", "2", "--think-time-ms", big], work,
                    "--think-time-ms")
    refused_cleanly([*RUN, "--prefix-tokens", big], work, "--prefix-tokens")
    spec = _spec_with(work, "    rate_fraction: 1.0\n",
                      f"    rate_fraction: 1.0\n    reasoning:\n      multi_turn: "
                      f"{{max_rounds: 2, think_time_us: {big}}}\n")
    refused_cleanly([*RUN, "--workload-spec", str(spec)], work, "think_time_us")


def test_corrupt_manifest_on_resume_is_refused(work: Path) -> None:
    spec = write(work / "s.yaml", SWEEP_SPEC)
    out = work / "o"
    (out / "summary").mkdir(parents=True)
    write(out / "manifest.json", "{not json")
    line = refused_cleanly(["sweep", str(spec), "--out", str(out), "--resume"], work,
                           "manifest.json")
    assert "--resume" in line


def test_plot_given_a_csv_is_refused(work: Path) -> None:
    src = write(work / "data.csv", "a,b\n1,2\n")
    refused_cleanly(["plot", str(src), "--x", "a", "--y", "b", "-o", str(work / "p.png")],
                    work, "data.csv")


# ------------------------------------------------------------------- trace files (replay)

HEADER = "trace_version: 2\ntime_unit: microseconds\nmode: generated\nwarm_up_requests: 0\n"


def _trace(work: Path) -> tuple[Path, Path]:
    """A real trace v2 pair exported by ``blis run --trace-output``."""
    code, _, err = blis([*RUN, "--trace-output", str(work / "src")], work)
    assert code == 0, err
    return work / "src.yaml", work / "src.csv"


def _replay(header: Path, data: Path) -> list[str]:
    return ["replay", "--model", MODEL, "--log", "error", *BB, "--trace-header", str(header),
            "--trace-data", str(data)]


def test_trace_csv_without_header_row_is_refused(work: Path) -> None:
    header, data = _trace(work)
    rows = data.read_text().splitlines(keepends=True)
    write(data, "".join(rows[1:]))
    line = refused_cleanly(_replay(header, data), work, "--trace-data")
    assert "header row" in line


@pytest.mark.parametrize(("old", "new", "key"), [
    ("trace_version: 2", "trace_version: 3", "trace_version"),
    ("time_unit: microseconds", "time_unit: seconds", "time_unit"),
])
def test_trace_header_of_another_version_or_unit_is_refused(old, new, key, work: Path) -> None:
    header, data = _trace(work)
    write(header, header.read_text().replace(old, new))
    line = refused_cleanly(_replay(header, data), work, key)
    assert ":1:" in line or ":2:" in line


@pytest.mark.parametrize(("column", "value", "what"), [
    (5, "-1", "round_index"),
    (9, "99999999999999999999", "input_tokens"),
    (19, "-99999999999999999999", "arrival_time_us"),
])
def test_trace_csv_field_out_of_range_is_refused(column, value, what, work: Path) -> None:
    header, data = _trace(work)
    rows = data.read_text().splitlines()
    fields = rows[1].split(",")
    fields[column] = value
    rows[1] = ",".join(fields)
    write(data, "\n".join(rows) + "\n")
    line = refused_cleanly(_replay(header, data), work, what)
    assert "row 2" in line


# ------------------------------------------------------------------ flags that contradict

@pytest.mark.parametrize(("args", "names"), [
    (["--metrics-path", "a.json", "--results-path", "b.json"], "--results-path"),
    (["--think-time-ms", "5"], ("--think-time-ms", "--concurrency")),
    (["--workload", "chatbot", "--workload-spec", "w.yaml"], ("--workload-spec",)),
    (["--tp", "1000", "--latency-model", "roofline", "--num-requests", "3"], "--tp"),
    (["--log", ""], "--log"),
    (["--rate", "--seed", "5"], "--rate"),
])
def test_contradictions_and_messages_name_the_flags(args, names, work: Path) -> None:
    write(work / "w.yaml", WORKLOAD_SPEC)
    base = ["run", "--model", MODEL] + ([] if "--log" in args else ["--log", "error"])
    if "--tp" not in args:
        base += BB
    refused_cleanly(base + args, work, names)


# ------------------------------------------------------------------------------ user hooks

HOOK_BASE = dict(model=MODEL, log="error", num_requests=10, num_instances=3,
                 alpha_coeffs=[100, 1, 100], beta_coeffs=[1000, 10, 5])


def _scorer_raises(snapshots, request, out):
    raise ValueError("scorer exploded")


def _scorer_nan(snapshots, request, out):
    for i in range(out.shape[0]):
        out[i] = np.nan


def _key_inf(features):
    return np.inf


@pytest.mark.parametrize(("kwargs", "name"), [
    (dict(routing_policy="weighted", routing_scorers="custom:1", custom_scorer=_scorer_raises),
     "custom_scorer"),
    (dict(routing_policy="weighted", routing_scorers="custom:1", custom_scorer=_scorer_nan),
     "custom_scorer"),
    (dict(scheduler="custom", custom_scheduler_key=_key_inf), "custom_scheduler_key"),
], ids=["raises", "nan-score", "inf-key"])
def test_failing_user_hook_stops_the_run_without_output(kwargs, name, work: Path) -> None:
    out = work / "m.json"
    with pytest.raises(BlisError, match=name):
        blis_fast.run(**HOOK_BASE, metrics_path=str(out), **kwargs)
    assert not out.exists()


# ------------------------------------------------------------ property: every YAML/CSV reader


def _consumers():
    """Each YAML/CSV reader of blis, called on a path; raises BlisError on bad input."""
    from blis_fast.config.defaults import load_defaults
    from blis_fast.config.policy_bundle import load_policy_bundle
    from blis_fast.sweep.spec import load_sweep_plan
    from blis_fast.workload.replay import load_trace_header, load_trace_records
    from blis_fast.workload.spec_yaml import load_workload_spec
    from blis_fast.workload.validate import validate_spec

    def spec(p):
        validate_spec(load_workload_spec(p))

    return {"defaults": load_defaults, "policy": load_policy_bundle,
            "sweep": lambda p: load_sweep_plan(p, validate=False), "spec": spec,
            "trace-header": load_trace_header, "trace-data": load_trace_records}


_EXAMPLE_TEXTS = [p.read_bytes() for p in sorted(EXAMPLES.glob("*.yaml"))]
_TRACE_CSVS = sorted((ROOT / "tests" / "reference_cases" / "cases").glob("*/trace.csv"))[:5]
_EXAMPLE_TEXTS += [p.read_bytes()[:4000] for p in _TRACE_CSVS]  # trace v2 data, cut short


def _mutate(data: st.DataObject) -> bytes:
    base = bytearray(data.draw(st.sampled_from(_EXAMPLE_TEXTS)))
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "dup"]))
        pos = data.draw(st.integers(0, max(len(base) - 1, 0)))
        if op == "flip" and base:
            base[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            base[pos:pos] = data.draw(st.sampled_from(
                [b"[", b"{", b"&a ", b"*a", b"- ", b": ", b"\x00", b"\t", b"'", b'"', b"!!int ",
                 b"99999999999999999999", b"-1", b"\n  ", b"#", b"\xff"]))
        elif op == "delete":
            del base[pos:pos + data.draw(st.integers(1, 40))]
        else:
            chunk = base[pos:pos + data.draw(st.integers(1, 200))]
            base[pos:pos] = chunk
    return bytes(base)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_readers_survive_random_and_mutated_input(data: st.DataObject, tmp_path: Path) -> None:
    """Random bytes and mutations of examples/*.yaml and of reference trace CSVs: every reader
    returns or raises BlisError (never another exception, a crash or a hang)."""
    import time

    if data.draw(st.booleans()):
        blob = data.draw(st.binary(max_size=2000))
    else:
        blob = _mutate(data)
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(blob)
    for name, consume in _consumers().items():
        started = time.perf_counter()
        try:
            consume(str(path))
        except BlisError:
            pass
        except Exception as exc:  # noqa: BLE001 - the property under test
            pytest.fail(f"{name}: {type(exc).__name__}: {exc}\ninput={blob[:300]!r}")
        assert time.perf_counter() - started < 20, f"{name} took too long"


# ------------------------------------------- read-only and full file systems (private mounts)


def _in_private_mount(mount_opts: str, blis_args: list[str], folder: Path) -> tuple[int, str, str]:
    """Run ``blis`` with a fresh tmpfs (``mount_opts``) on ``folder`` in a private mount
    namespace (``unshare -m``), then list what is left in the folder; skipped where the
    namespace cannot be made (root alone would ignore a chmod-ed folder)."""
    import shlex
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed: no private mount to make read-only or full")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare -m is not permitted here: no private mount namespace")
    folder.mkdir()
    cmd = (f"mount -t tmpfs -o {mount_opts} tmpfs {shlex.quote(str(folder))} || exit 99; "
           f"{shlex.quote(sys.executable)} -m blis_fast.cli "
           + " ".join(shlex.quote(a) for a in blis_args)
           + f"; echo \"rc=$?\" >&3; ls -A {shlex.quote(str(folder))} >&3")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f"exec 3>&1 1>/dev/null; {cmd}"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 99, proc.stderr
    lines = proc.stdout.splitlines()
    return int(lines[0].removeprefix("rc=")), "\n".join(lines[1:]), proc.stderr


def test_read_only_file_system_output_is_refused_before_the_run(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    code, left, err = _in_private_mount("ro", [*RUN, "--metrics-path", str(ro / "m.json")], ro)
    assert_refused((code, "", err), "--metrics-path")
    assert "read-only file system" in err and left == ""


def test_full_file_system_leaves_no_partial_output(tmp_path: Path) -> None:
    """A 64 KiB file system fills while the outputs are written: exit 2, one line, and none of
    the files (metrics, trace .yaml/.csv) is left, truncated or not."""
    full = tmp_path / "full"
    args = [*RUN, "--num-requests", "2000", "--rate", "1000", "--metrics-path",
            str(full / "m.json"), "--trace-output", str(full / "t")]
    code, left, err = _in_private_mount("size=64k", args, full)
    line = assert_refused((code, "", err), ("--metrics-path", "--trace-output"))
    assert "no space left on device" in line and left == ""
