"""Bad input never reaches a kernel: ``blis run`` refuses it with one stderr line and exit 2.

Every case runs ``blis run --model meta-llama/llama-3.1-8b-instruct <bad flags>`` in-process
(``blis_fast.cli.main``) with ``--metrics-path``, ``--trace-output`` and ``--output-dir``
pointing into ``tmp_path`` and asserts: exit code 2, nothing on stdout, stderr is exactly one
line naming the flag (or the file / key), no traceback, and no output file or directory left
behind (nor anything written into the working directory).

Diagnostics (``level=WARNING ...`` lines) are silenced with ``--log error`` so the error line is
the only stderr line; the rules are CLU-9.3..9.8, ENG-10.4, WL-2.4 and DELTA-26/28 (rule ids:
``docs/architecture.md``, "Rule ids").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from _cli import invoke

import blis_fast
from blis_fast.data import data_path
from blis_fast.gonum import INT64_MAX

MODEL = "meta-llama/llama-3.1-8b-instruct"
BB = ("--alpha-coeffs", "100,1,100", "--beta-coeffs", "1000,10,5")  # blackbox, no model config


@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str
    outputs: Path
    cwd: Path


def run_cli(args: list[str], tmp_path: Path, *, log_error: bool = True) -> CliRun:
    """``blis run --model MODEL [--log error] <outputs> <args>``; the case's args come last so a
    repeated flag (``--model``, ``--log``) takes the case's value and a bare trailing flag has no
    value."""
    outputs = tmp_path / "outputs"
    cwd = tmp_path / "cwd"
    outputs.mkdir(parents=True, exist_ok=True)
    cwd.mkdir(parents=True, exist_ok=True)
    argv = ["run", "--model", MODEL]
    if log_error:
        argv += ["--log", "error"]
    argv += [
        "--metrics-path", str(outputs / "results.json"),
        "--trace-output", str(outputs / "trace"),
        "--output-dir", str(outputs / "parquet"),
        *args,
    ]
    old = os.getcwd()
    os.chdir(cwd)
    try:
        run = invoke(argv)
    finally:
        os.chdir(old)
    return CliRun(code=run.code, stdout=run.stdout, stderr=run.stderr, outputs=outputs, cwd=cwd)


def assert_refused(run: CliRun, names: tuple[str, ...]) -> None:
    """Exit 2, empty stdout, exactly one stderr line naming one of ``names``, no leftovers."""
    detail = f"exit={run.code}\nstderr={run.stderr!r}\nstdout={run.stdout[:300]!r}"
    assert "Traceback" not in run.stderr, detail
    assert run.code == 2, detail
    assert run.stdout == "", detail
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and run.stderr.endswith("\n"), detail
    assert any(name in lines[0] for name in names), f"error does not name any of {names}: {detail}"
    left = sorted(p.name for p in run.outputs.iterdir()) + sorted(p.name for p in run.cwd.iterdir())
    assert left == [], f"files left behind: {left}"


def case(args, names, *, bug: str | None = None, id: str | None = None):
    """One parametrized case: CLI args (a string split on spaces, or a tuple), accepted names."""
    if isinstance(args, str):
        args = tuple(args.split(" "))
    if isinstance(names, str):
        names = (names,)
    marks = [pytest.mark.xfail(strict=True, reason=f"bug: {bug}")] if bug else []
    return pytest.param(tuple(args), tuple(names), marks=marks, id=id or " ".join(args))


# ------------------------------------------------------------------ value checks (CLU-9, WL-2.4)

VALUE_CASES = [
    # workload: rate (WL-2.4.1), counts, token bounds (WL-2.4.2..5), timeout (DELTA-28)
    case("--rate 0", "--rate"),
    case("--rate -1", "--rate"),
    case("--rate -0", "--rate"),
    case("--rate NaN", "--rate"),
    case("--rate Inf", "--rate"),
    case("--rate +Inf", "--rate"),
    case("--rate 1e-400", "--rate"),  # underflows to 0
    case("--rate 1e400", "--rate"),  # overflows to +Inf
    case("--rate abc", "--rate"),
    case(("--rate", ""), "--rate", id="--rate <empty>"),
    case(("--rate", " "), "--rate", id="--rate <blank>"),
    case("--rate 1,2", "--rate"),
    case("--rate", "--rate", id="--rate <missing value>"),
    case("--num-requests -5", "--num-requests"),
    case("--num-requests 0", ("--num-requests", "num_requests", "--horizon")),  # unbounded
    case("--num-requests abc", "--num-requests"),
    case("--num-requests 1.5", "--num-requests"),
    case(("--num-requests", ""), "--num-requests", id="--num-requests <empty>"),
    case("--prefix-tokens -1", "--prefix-tokens"),
    case("--prompt-tokens-min 0", "--prompt-tokens-min"),
    case("--prompt-tokens-max 0", "--prompt-tokens-max"),
    case("--output-tokens-min 0", "--output-tokens-min"),
    case("--output-tokens-max 0", "--output-tokens-max"),
    case("--prompt-tokens-stdev -1", "prompt-tokens-stdev"),
    case("--output-tokens-stdev -1", "output-tokens-stdev"),
    case("--prompt-tokens-stdev 1", "prompt-tokens-stdev"),  # below min 2
    case("--prompt-tokens-stdev 8000", "prompt-tokens-stdev"),  # above max 7000
    case("--output-tokens-stdev 9000", "output-tokens-stdev"),
    case("--prompt-tokens 0", "prompt-tokens"),
    case("--output-tokens 7001", "output-tokens"),
    case("--prompt-tokens-min 10 --prompt-tokens-max 5", "--prompt-tokens-min"),
    case("--output-tokens-min 10 --output-tokens-max 5", "--output-tokens-min"),
    case("--concurrency -1", "--concurrency"),
    case("--think-time-ms -1", "--think-time-ms"),
    case("--timeout 0", "--timeout"),
    case("--timeout NaN", "--timeout"),
    case("--timeout 1.5", "--timeout"),
    case("--workload nosuchpreset", ("--workload", "nosuchpreset")),
    case(("--workload", ""), "--workload", id="--workload <empty>"),
    # simulation control (CLU-9.3)
    case("--horizon 0", "--horizon"),
    case("--horizon -5", "--horizon"),
    case("--horizon abc", "--horizon"),
    case("--horizon 99999999999999999999999", "--horizon"),
    case("--seed abc", "--seed"),
    case("--seed 99999999999999999999", "--seed"),
    case("--log loud", ("--log", "log level")),
    case(("--log", ""), ("--log", "log level"), id="--log <empty>"),
    # model, hardware, latency (CLU-9.4, ENG-10.4, DELTA-26)
    case(("--model", ""), "--model", id="--model <empty>"),
    case("--model unknown/model", ("--model", "unknown/model")),
    case("--model unknown/model --hardware H100 --tp 1", ("--model", "unknown/model")),
    case("--latency-model bogus", "--latency-model"),
    case("--latency-model ROOFLINE", "--latency-model"),
    case("--hardware NoSuchGPU", "--hardware"),
    case("--tp -1", "--tp"),
    case("--tp abc", "--tp"),
    case("--latency-model trained-physics --tp 7", "--tp"),
    case("--alpha-coeffs NaN,1,1 --beta-coeffs 1,1,1", "--alpha-coeffs"),
    case("--alpha-coeffs Inf,1,1 --beta-coeffs 1,1,1", "--alpha-coeffs"),
    case("--alpha-coeffs -1,1,1 --beta-coeffs 1,1,1", "--alpha-coeffs"),
    case("--alpha-coeffs 1,1,1 --beta-coeffs -1,1,1", "--beta-coeffs"),
    case("--alpha-coeffs 1,1,1 --beta-coeffs 1,NaN,1", "--beta-coeffs"),
    case("--alpha-coeffs 1,1,1", "--alpha-coeffs"),  # alone
    case("--beta-coeffs 1,1,1", "--beta-coeffs"),  # alone
    case("--alpha-coeffs 1,x,1 --beta-coeffs 1,1,1", "--alpha-coeffs"),
    case("--alpha-coeffs 1,,1 --beta-coeffs 1,1,1", "--alpha-coeffs"),
    case("--alpha-coeffs 1,1 --beta-coeffs 1,1,1", "--alpha-coeffs"),
    case("--alpha-coeffs 0,0,0 --beta-coeffs 0,0,0", ("--alpha-coeffs", "--beta-coeffs")),
    case(("--alpha-coeffs", "", "--beta-coeffs", ""), ("--alpha-coeffs", "--beta-coeffs"),
         id="--alpha-coeffs <empty> --beta-coeffs <empty>"),
    case("--alpha-coeffs 1,1,1 --beta-coeffs 1,1,1 --latency-model roofline", "--latency-model"),
    case("--max-model-len -1", "--max-model-len"),
    case("--max-model-len 1.5", "--max-model-len"),
    case(("--max-model-len", "999999999", *BB), "--max-model-len"),  # > KV capacity (ENG-3.5)
    case("--gpu-memory-utilization 0", "--gpu-memory-utilization"),
    case("--gpu-memory-utilization 1.5", "--gpu-memory-utilization"),
    case("--gpu-memory-utilization NaN", "--gpu-memory-utilization"),
    case("--gpu-memory-utilization Inf", "--gpu-memory-utilization"),
    case("--gpu-memory-utilization -Inf", "--gpu-memory-utilization"),
    # KV cache and batching (CLU-9.5)
    case("--total-kv-blocks 0", "--total-kv-blocks"),
    case(("--total-kv-blocks", "0", *BB), "--total-kv-blocks", id="--total-kv-blocks 0 blackbox"),
    case(("--total-kv-blocks", "-3", *BB), "--total-kv-blocks", id="--total-kv-blocks -3 blackbox"),
    case("--total-kv-blocks -3", "--total-kv-blocks", id="--total-kv-blocks -3 roofline"),
    case("--total-kv-blocks 1e6", "--total-kv-blocks"),
    case("--block-size-in-tokens 0", "--block-size-in-tokens"),
    case("--block-size-in-tokens -4", "--block-size-in-tokens"),
    case("--block-size-in-tokens NaN", "--block-size-in-tokens"),
    case("--max-num-running-reqs 0", "--max-num-running-reqs"),
    case("--max-num-running-reqs -1", "--max-num-running-reqs"),
    case("--max-num-scheduled-tokens 0", "--max-num-scheduled-tokens"),
    case("--max-num-scheduled-tokens -0", "--max-num-scheduled-tokens"),
    case("--long-prefill-token-threshold -1", "--long-prefill-token-threshold"),
    case("--kv-cpu-blocks -1", "--kv-cpu-blocks"),
    case("--kv-offload-threshold 2", "--kv-offload-threshold"),
    case("--kv-offload-threshold -0.5", "--kv-offload-threshold"),
    case("--kv-offload-threshold NaN", "--kv-offload-threshold"),
    case("--kv-transfer-bandwidth 0 --kv-cpu-blocks 10", "--kv-transfer-bandwidth"),
    case("--kv-transfer-bandwidth -1 --kv-cpu-blocks 10", "--kv-transfer-bandwidth"),
    case("--kv-transfer-bandwidth NaN --kv-cpu-blocks 10", "--kv-transfer-bandwidth"),
    case("--kv-transfer-bandwidth Inf --kv-cpu-blocks 10", "--kv-transfer-bandwidth"),
    case("--kv-transfer-base-latency -1", "--kv-transfer-base-latency"),
    # cluster and policies (CLU-9.6)
    case("--num-instances 0", "num-instances"),
    case("--num-instances -1", "num-instances"),
    case("--num-instances 1e3", "--num-instances"),
    case("--admission-latency -1", "--admission-latency"),
    case("--routing-latency -1", "--routing-latency"),
    case("--snapshot-refresh-interval -1", "--snapshot-refresh-interval"),
    case("--cache-signal-delay -1", "--cache-signal-delay"),
    case("--counterfactual-k -1", "--counterfactual-k"),
    case("--routing-policy fastest", ("routing policy", "--routing-policy")),
    case("--scheduler nope", ("scheduler", "--scheduler")),
    case("--scheduler FCFS", ("scheduler", "--scheduler")),
    case("--priority-policy nope", ("priority policy", "--priority-policy")),
    case("--admission-policy nope", ("admission policy", "--admission-policy")),
    case("--trace-level verbose", ("trace level", "--trace-level")),
    case("--admission-policy token-bucket --token-bucket-capacity 0", "--token-bucket-capacity"),
    case("--admission-policy token-bucket --token-bucket-capacity Inf", "--token-bucket-capacity"),
    case("--admission-policy token-bucket --token-bucket-refill-rate NaN",
         "--token-bucket-refill-rate"),
    case("--fitness-weights bogus:1", ("fitness", "bogus")),
    # unknown flags (CLU-9.2)
    case("--bogus 1", "--bogus"),
    case("--results-pathx r.json", "--results-pathx"),
    case("--Rate 1", "--Rate"),
]


@pytest.mark.parametrize(("args", "names"), VALUE_CASES)
def test_bad_flag_is_refused(args: tuple[str, ...], names: tuple[str, ...], tmp_path: Path) -> None:
    log_error = "--log" not in args
    assert_refused(run_cli(list(args), tmp_path, log_error=log_error), names)


def test_empty_latency_model_is_refused_or_the_default(tmp_path: Path) -> None:
    """CLU-9.4 makes any other name fatal; reading '' as the default backend is fine too
    (before 30c545d the run died with 'invalid roofline config: num_attention_heads must be
    > 0, got 0; ...', naming no flag)."""
    run = run_cli(["--latency-model", "", "--num-requests", "5"], tmp_path / "empty")
    if run.code == 0:
        default = run_cli(["--num-requests", "5"], tmp_path / "default")
        assert default.code == 0 and run.stdout == default.stdout
    else:
        assert_refused(run, ("--latency-model",))


# ------------------------------------------------------------------ values that crash or mislead

# Flags whose values pass every check but would overflow int64 event arithmetic or ask for
# arrays no machine holds. Before 30c545d they gave tracebacks (OverflowError, MemoryError,
# "array is too big") or, for the latencies, a "successful" run with negative step times.
EXTREME_CASES = [
    case(("--timeout", str(INT64_MAX), "--num-requests", "3"), "--timeout"),
    case(("--admission-latency", str(INT64_MAX), "--num-requests", "3"), "--admission-latency"),
    case(("--routing-latency", str(INT64_MAX - 1000), "--num-requests", "3"), "--routing-latency"),
    case(("--kv-transfer-bandwidth", "1e-300", "--kv-cpu-blocks", "10", "--num-requests", "3",
          *BB), "--kv-transfer-bandwidth"),
    case(("--total-kv-blocks", str(1 << 62), "--num-requests", "3", *BB), "--total-kv-blocks"),
    case(("--kv-cpu-blocks", str(1 << 62), "--num-requests", "3", *BB), "--kv-cpu-blocks"),
    case(("--num-instances", str(10**12), "--total-kv-blocks", "100", "--num-requests", "3", *BB),
         ("--num-instances", "instance(s)")),
]


@pytest.mark.parametrize(("args", "names"), EXTREME_CASES)
def test_extreme_value_is_refused_cleanly(args: tuple[str, ...], names: tuple[str, ...],
                                          tmp_path: Path) -> None:
    assert_refused(run_cli(list(args), tmp_path), names)


_HUGE_R = """
import json, sys
import blis_fast
base = dict(model="meta-llama/llama-3.1-8b-instruct", log="error", num_requests=3,
            alpha_coeffs=[100, 1, 100], beta_coeffs=[1000, 10, 5])
out = [blis_fast.run(**base, max_num_running_reqs=r).stdout for r in json.loads(sys.argv[1])]
print(json.dumps(out))
"""


def test_huge_max_num_running_reqs_runs_like_a_large_one() -> None:
    """--max-num-running-reqs only caps admissions (ENG-4.5), so any value above the number of
    requests behaves the same. Before 30c545d the step log reserved that many ITL runs per
    step: 10**12 died with MemoryError and 2**62 looped forever in _grow_log (int64 overflow of
    the doubling), hence the subprocess with a timeout."""
    root = str(Path(blis_fast.__file__).resolve().parents[1])  # the blis_fast under test
    values = [256, 10**12, 1 << 62, INT64_MAX]
    proc = subprocess.run([sys.executable, "-c", _HUGE_R, json.dumps(values)], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outs[0].startswith("=== Simulation Metrics ===")
    assert all(o == outs[0] for o in outs[1:])


# ------------------------------------------------------------------ numbers as Go reads them

# The reference's flag types (cmd/root.go at b563c440): pflag reads Float64Var with
# strconv.ParseFloat(s, 64), Float64SliceVar with ParseFloat per comma-separated item, and
# IntVar/Int64Var with strconv.ParseInt(s, 0, 64).
GO_FLOAT64_FLAGS = ("gpu-memory-utilization", "kv-offload-threshold", "kv-transfer-bandwidth",
                    "token-bucket-capacity", "token-bucket-refill-rate", "rate",
                    "pd-transfer-bandwidth", "pd-transfer-base-latency",  # P/D: f90a1e3a
                    "model-autoscaler-interval-us", "gpu-hour-cost",
                    # LoRA flags (cmd/root.go at f90a1e3a)
                    "lora-load-base-latency-us", "lora-load-bandwidth-bytes-us",
                    "lora-footprint-bytes-per-rank", "lora-scorer-weight")
GO_FLOAT64_SLICE_FLAGS = ("alpha-coeffs", "beta-coeffs")
GO_INT_FLAGS = (
    "tp", "max-model-len", "total-kv-blocks", "block-size-in-tokens", "max-num-running-reqs",
    "max-num-scheduled-tokens", "long-prefill-token-threshold", "kv-cpu-blocks",
    "kv-transfer-base-latency", "seed", "horizon", "num-instances", "admission-latency",
    "routing-latency", "counterfactual-k", "snapshot-refresh-interval", "cache-signal-delay",
    "num-requests", "concurrency", "think-time-ms", "prefix-tokens", "prompt-tokens",
    "prompt-tokens-stdev", "prompt-tokens-min", "prompt-tokens-max", "output-tokens",
    "output-tokens-stdev", "output-tokens-min", "output-tokens-max", "timeout",
    # P/D flags (cmd/root.go at f90a1e3a)
    "prefill-instances", "decode-instances", "prefill-decode-instances", "encode-instances",
    "pd-prefix-threshold", "prefill-tp", "decode-tp", "prefill-max-model-len",
    "decode-max-model-len", "lora-adapter-capacity")
NUMERIC_FLAGS = GO_FLOAT64_FLAGS + GO_FLOAT64_SLICE_FLAGS + GO_INT_FLAGS


def test_numeric_flags_have_the_reference_types() -> None:
    from blis_fast.options import RUN_OPTIONS

    kinds = {spec.flag: spec.kind for spec in RUN_OPTIONS}
    assert {f for f, k in kinds.items() if k == "float"} == set(GO_FLOAT64_FLAGS)
    assert {f for f, k in kinds.items() if k == "floats"} == set(GO_FLOAT64_SLICE_FLAGS)
    assert {f for f, k in kinds.items() if k == "int"} == set(GO_INT_FLAGS)


@pytest.mark.parametrize("value", [" 5", "5 ", "+-5", "\u0665", "1e400", "\uff15", "5\t"],
                         ids=["lead-space", "trail-space", "plus-minus", "arabic-indic-5",
                              "1e400", "fullwidth-5", "trail-tab"])
@pytest.mark.parametrize("flag", NUMERIC_FLAGS)
def test_numeric_flag_refuses_what_go_refuses(flag: str, value: str, tmp_path: Path) -> None:
    """ParseFloat/ParseInt reject spaces, doubled signs and non-ASCII digits; 1e400 overflows
    float64 (a range error, not +Inf) and is no integer. Before the gonum parsers Python's
    float()/int() accepted all but 1e400 (which became +Inf)."""
    args = [f"--{flag}", value]
    if flag in GO_FLOAT64_SLICE_FLAGS:
        args += ["--beta-coeffs" if flag == "alpha-coeffs" else "--alpha-coeffs", "1,1,1"]
    run = run_cli(args, tmp_path)
    assert_refused(run, (f"--{flag}",))
    assert "strconv.Parse" in run.stderr


_HEX_CASES = [
    # (flag args written with Go-only spellings, the same values in plain decimal)
    (("--rate", "0x1p-1"), ("--rate", "0.5")),
    (("--gpu-memory-utilization", "0x1.8p-1"), ("--gpu-memory-utilization", "0.75")),
    (("--alpha-coeffs", "0x1.9p6,0x1p0,0x1.9p6", "--beta-coeffs", "0x3.e8p8,1_0,0x5p0"),
     ("--alpha-coeffs", "100,1,100", "--beta-coeffs", "1000,10,5")),
    (("--num-requests", "0x5", "--seed", "0o17", "--max-num-scheduled-tokens", "0b1_0000_0000"),
     ("--num-requests", "5", "--seed", "15", "--max-num-scheduled-tokens", "256")),
    (("--alpha-coeffs", "100", "--alpha-coeffs", "1,100", "--beta-coeffs", "1000,10,5"),
     ("--alpha-coeffs", "100,1,100", "--beta-coeffs", "1000,10,5")),  # Float64Slice appends
    (("--prompt-tokens", "0100", "--think-time-ms", "0X0a", "--concurrency", "+2"),
     ("--prompt-tokens", "64", "--think-time-ms", "10", "--concurrency", "2")),
]


@pytest.mark.parametrize(("go_args", "plain_args"), _HEX_CASES, ids=lambda a: " ".join(a))
def test_go_number_spellings_are_accepted(go_args: tuple[str, ...], plain_args: tuple[str, ...],
                                          tmp_path: Path) -> None:
    """Hex floats, base prefixes, digit separators and inf spellings mean what they mean to
    the reference's pflag flags: the run equals the one with plain decimals."""
    base = ["--num-requests", "5"]
    go_run = run_cli([*base, *go_args], tmp_path / "go")
    plain_run = run_cli([*base, *plain_args], tmp_path / "plain")
    assert go_run.code == 0, go_run.stderr
    assert plain_run.code == 0, plain_run.stderr
    assert go_run.stdout == plain_run.stdout and "=== Simulation Metrics ===" in go_run.stdout


# ------------------------------------------------------------------ input files


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _defaults_copy(tmp_path: Path, at: str, line: str, *, after: bool) -> tuple[Path, int]:
    """A copy of the bundled defaults.yaml (with the hardware file and model configs beside it,
    where the defaults file's folder is searched) with ``line`` inserted before or after the
    first line equal to ``at``; returns the file and the 1-based number of the inserted line."""
    src = data_path("defaults.yaml").read_text(encoding="utf-8").splitlines()
    idx = src.index(at) + (1 if after else 0)
    inputs = tmp_path / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    shutil.copy(data_path("hardware_config.json"), inputs / "hardware_config.json")
    shutil.copytree(data_path("model_configs"), inputs / "model_configs")
    text = "\n".join(src[:idx] + [line] + src[idx:]) + "\n"
    return _write(inputs / "defaults.yaml", text), idx + 1


@pytest.mark.parametrize(("at", "line", "after", "key"), [
    ("defaults:", "bogus_section: 1", False, "bogus_section"),
    (f"  {MODEL}:", "    bogus_field: 7", True, "bogus_field"),
], ids=["top-level", "nested"])
def test_defaults_unknown_key_names_key_and_line(at: str, line: str, after: bool, key: str,
                                                 tmp_path: Path) -> None:
    path, lineno = _defaults_copy(tmp_path, at, line, after=after)
    run = run_cli(["--defaults-filepath", str(path)], tmp_path)
    assert_refused(run, (key,))
    assert re.search(rf"(:{lineno}\b|line {lineno}\b)", run.stderr), (lineno, run.stderr)


FILE_CASES = [
    # before 30c545d: "--latency-model roofline needs --hardware ... defaults.yaml has no
    # defaults for model=...", blaming the model instead of the missing file
    case("--defaults-filepath /nonexistent.yaml", ("--defaults-filepath", "/nonexistent.yaml")),
    case("--model-config-folder {empty}", ("--model-config-folder", "{empty}")),
    case("--model-config-folder /nonexistent", ("--model-config-folder", "/nonexistent")),
    case("--model-config-folder {badjson}", ("--model-config-folder", "{badjson}")),
    case("--hardware-config /nonexistent.json", ("--hardware-config", "/nonexistent.json")),
    case("--hardware-config {hwbad}", ("--hardware-config", "{hwbad}")),
    # before 30c545d the PyYAML message (source excerpt, caret lines) made this 8 lines long
    case("--defaults-filepath {garbage}", ("--defaults-filepath", "{garbage}")),
    case("--defaults-filepath {empty}", ("--defaults-filepath", "{empty}")),
    case("--workload-spec /nonexistent.yaml",
         ("--workload-spec", "/nonexistent.yaml", "workload spec")),
]


@pytest.mark.parametrize(("args", "names"), FILE_CASES)
def test_bad_input_file_is_refused(args: tuple[str, ...], names: tuple[str, ...],
                                   tmp_path: Path) -> None:
    inputs = tmp_path / "inputs"
    empty = inputs / "empty"
    empty.mkdir(parents=True)
    badjson = _write(inputs / "badjson" / "config.json", "{not json\n").parent
    hwbad = _write(inputs / "hw.json", '{"H100": 1}\n')
    garbage = _write(inputs / "garbage.yaml", ":::: [ not yaml\n")
    subst = {"{empty}": str(empty), "{badjson}": str(badjson), "{hwbad}": str(hwbad),
             "{garbage}": str(garbage)}

    def fill(s: str) -> str:
        for key, value in subst.items():
            s = s.replace(key, value)
        return s

    run = run_cli([fill(a) for a in args], tmp_path)
    assert_refused(run, tuple(fill(n) for n in names))


WORKLOAD_SPEC = """\
version: "2"
seed: 42
category: language
aggregate_rate: 10.0
num_requests: 50
clients:
  - id: "c1"
    rate_fraction: 1.0
    arrival:
      process: poisson
    input_distribution:
      type: gaussian
      params: {mean: 100, std_dev: 10, min: 10, max: 200}
    output_distribution:
      type: exponential
      params: {mean: 50}
"""


@pytest.mark.parametrize(("extra", "key"), [
    ("    burstiness: 3.0\n", "burstiness"),  # unknown client field (strict YAML)
    ("sessions_per_user: 4\n", "sessions_per_user"),  # unknown top-level field
], ids=["client-key", "top-level-key"])
def test_workload_spec_unknown_key_names_key_and_line(extra: str, key: str,
                                                      tmp_path: Path) -> None:
    spec = _write(tmp_path / "inputs" / "spec.yaml", WORKLOAD_SPEC + extra)
    line = WORKLOAD_SPEC.count("\n") + 1  # the appended line
    run = run_cli(["--workload-spec", str(spec)], tmp_path)
    assert_refused(run, (key,))
    assert re.search(rf"(:{line}\b|line {line}\b)", run.stderr), (line, run.stderr)


@pytest.mark.parametrize(("text", "names"), [
    (":::: [ not yaml\n", ("--workload-spec", "workload spec")),
    ('version: "2"\nseed: 42\naggregate_rate: 5\nnum_requests: 10\nclients: []\n',
     ("--workload-spec", "workload spec")),
], ids=["not-yaml", "no-clients"])
def test_bad_workload_spec_is_refused(text: str, names: tuple[str, ...], tmp_path: Path) -> None:
    spec = _write(tmp_path / "inputs" / "spec.yaml", text)
    run = run_cli(["--workload-spec", str(spec)], tmp_path)
    assert_refused(run, names)


# ------------------------------------------------------------------ diagnostics in-process


def test_diagnostics_follow_the_current_stderr(tmp_path: Path) -> None:
    """Each in-process call's level= diagnostics land on that call's sys.stderr (before
    30c545d the handler kept the stream of the first call)."""
    for k in ("a", "b"):
        run = run_cli(["--num-requests", "2"], tmp_path / k, log_error=False)
        assert run.code == 0, run.stderr
        lines = run.stderr.splitlines()
        assert lines and all(line.startswith("level=") for line in lines), run.stderr
        assert any(line.startswith("level=WARNING") for line in lines), run.stderr


def test_refused_run_prints_only_its_error(tmp_path: Path) -> None:
    """Without ``--log error`` too: a refused run's diagnostics are not printed."""
    run = run_cli(["--num-requests", "-5"], tmp_path, log_error=False)
    assert_refused(run, ("--num-requests",))


def test_refused_run_on_a_cold_cache_prints_only_its_error(tmp_path: Path) -> None:
    root = str(Path(blis_fast.__file__).resolve().parents[1])  # the blis_fast under test
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    code = ("from blis_fast.cli import main; "
            "main(['run', '--model', 'meta-llama/llama-3.1-8b-instruct', '--rate', '0'])")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["blis: error: --rate must be a finite value > 0, got 0"]
