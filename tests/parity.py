"""Run a reference case (tests/reference_cases/cases/<id>) through the blis CLI and compare its outputs.

Comparison rules are those of tests/reference_cases/README.md: stdout JSON objects and
``key: value`` lines must match (integers exactly, floats to a relative error of 1e-9, section
headers in order); the per-request results file must hold the same records (ties in
``arrived_at`` may come in any order); a case's extra ``outputs`` files (``calibrate --report``)
are compared too, less their ``ignore_keys``; a failing case needs a non-zero exit and no output
file.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import parity_observe

# The repository's copy of the reference cases (tests/reference_cases/README.md).
CASES_DIR = Path(__file__).resolve().parent / "reference_cases" / "cases"
REL_TOL = 1e-9

# Cases that wait for a later issue. The parity test marks them as strict expected failures,
# so a family whose cases start passing must leave this table.
PENDING_FAMILIES: dict[str, str] = {}
"""Case-id prefixes of families waiting for a feature (every case of the family except those
of ``ADOPTED_EARLY`` and ``PASSING_IN_PENDING``)."""
ADOPTED_EARLY: dict[str, tuple[str, ...]] = {}
"""Case-id prefixes, per pending family, of the cases that must already pass while the rest
of the family waits (a feature built in steps)."""
PASSING_IN_PENDING: frozenset[str] = frozenset()
"""Cases of a pending family that already pass: the parity test checks them like any other
case (the family's other tests, which rebuild inputs from whole families, still skip it)."""

HEAD_EXTRA_KEYS = frozenset({"cache_hit_rate", "round_index", "session_id", "adapter",
                             "kv_allocation_failures"})
"""JSON keys the August reference adds to every run (``head_extras`` cases): dropped from both
sides, since an ordinary blis_fast run prints what the April reference prints."""
HEAD_EXTRA_SECTIONS = frozenset({"=== Session Metrics ==="})
"""Stdout sections the August reference adds (dropped with their lines)."""
HEAD_EXTRA_LINES = ("ITL:", "trace_version:")
"""Line prefixes the August reference adds to stdout or the trace header."""


@dataclass
class CaseRun:
    """What the project's CLI did for one case."""

    exit_code: int
    stdout: str
    stderr: str
    workdir: Path


def load_case(case_id: str) -> dict:
    """The case.json of one case."""
    return json.loads((CASES_DIR / case_id / "case.json").read_text())


BOOL_FLAGS = frozenset({"--summarize-trace", "--pd-transfer-contention", "--no-streaming",
                        "--record-itl"})  # case flags that take no value


def case_flags(args: list[str]) -> dict[str, str]:
    """A case's ``args`` as ``{flag: value}`` (value-less flags map to ``"true"``)."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), flag
        if flag in BOOL_FLAGS:
            flags[flag] = "true"
            i += 1
        else:
            flags[flag] = args[i + 1]
            i += 2
    return flags


def run_case_params(spec_driven: bool, invalid_reason: str) -> list:
    """``pytest.param(name, case, flags)`` of every ``blis run`` case whose workload comes from a
    spec or ``--concurrency`` (``spec_driven``) or from the distribution/preset flags (not);
    invalid-input cases are skipped with ``invalid_reason``."""
    import pytest

    params = []
    for name in adopted_case_ids():
        case = load_case(name)
        if case["subcommand"] != "run":
            continue
        flags = case_flags(case["args"])
        if ("--workload-spec" in flags or "--concurrency" in flags) != spec_driven:
            continue
        marks = [pytest.mark.skip(reason=invalid_reason)] if case["exit_code"] != 0 else []
        if case.get("head_extras"):  # the August reference's trace/results carry its additions
            marks = [pytest.mark.skip(reason="August-reference case (head_extras): its files "
                                             "carry additions; test_parity compares it")]
        params.append(pytest.param(name, case, flags, id=name, marks=marks))
    return params


def case_distribution_params(flags: dict[str, str], **fields):
    """``DistributionParams`` from a case's length flags (``blis run`` defaults), plus
    ``fields`` (rate, num_requests) where the case's workload needs them."""
    from blis_fast.workload.synthesis import DistributionParams

    def flag(name: str, default: int) -> int:
        return int(flags.get(name, default))

    return DistributionParams(
        prefix_tokens=flag("--prefix-tokens", 0),
        prompt_tokens_mean=flag("--prompt-tokens", 512),
        prompt_tokens_stdev=flag("--prompt-tokens-stdev", 256),
        prompt_tokens_min=flag("--prompt-tokens-min", 2),
        prompt_tokens_max=flag("--prompt-tokens-max", 7000),
        output_tokens_mean=flag("--output-tokens", 512),
        output_tokens_stdev=flag("--output-tokens-stdev", 256),
        output_tokens_min=flag("--output-tokens-min", 2),
        output_tokens_max=flag("--output-tokens-max", 7000),
        **fields,
    )


def all_case_ids() -> list[str]:
    """Every case folder name, sorted."""
    return sorted(p.name for p in CASES_DIR.iterdir() if (p / "case.json").is_file())


def adopted_case_ids() -> list[str]:
    """Every case of a family blis_fast implements today (the pending families left out): the
    cases the output, workload and spec tests rebuild their inputs from."""
    return [c for c in all_case_ids() if family_pending_reason(c) is None]


def pending_reason(case_id: str) -> str | None:
    """The issue a case waits for, or None when it must pass today."""
    return None if case_id in PASSING_IN_PENDING else family_pending_reason(case_id)


def family_pending_reason(case_id: str) -> str | None:
    """The issue the case's family waits for, or None when the whole family is implemented."""
    for prefix, issue in PENDING_FAMILIES.items():
        if case_id.startswith(prefix) and not case_id.startswith(ADOPTED_EARLY.get(prefix, ())):
            return issue
    return None


def run_case(case_id: str, workdir: Path, args: list[str] | None = None,
             exclude: set[str] | frozenset[str] = frozenset()) -> CaseRun:
    """Copy the case's inputs into ``workdir`` and run ``blis <subcommand> <args>`` there.

    ``args`` replaces the case's arguments (e.g. with a server URL filled in); files named in
    ``exclude`` are expected outputs and are not copied.
    """
    from blis_fast.cli import main

    src = CASES_DIR / case_id
    case = load_case(case_id)
    outputs = {"stdout.txt", "stderr.txt", "results.json", "trace.yaml", "trace.csv", "case.json",
               *case.get("outputs", []), *exclude}
    for item in src.iterdir():
        if item.name not in outputs:
            if item.is_dir():
                shutil.copytree(item, workdir / item.name)
            else:
                shutil.copy(item, workdir / item.name)
    out, err = io.StringIO(), io.StringIO()
    code = 0
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([case["subcommand"], *(case["args"] if args is None else args)])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(cwd)
    return CaseRun(exit_code=code, stdout=out.getvalue(), stderr=err.getvalue(), workdir=workdir)


def _close(a, b, path: str, errors: list[str]) -> None:
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        if a != b:
            errors.append(f"{path}: {a!r} != {b!r}")
        return
    if isinstance(a, int) and isinstance(b, int):
        if a != b:
            errors.append(f"{path}: {a} != {b}")
        return
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if not math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=0.0):
            errors.append(f"{path}: {a!r} != {b!r}")
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            errors.append(f"{path}: keys {list(a)} != {list(b)}")
            return
        for k in a:
            _close(a[k], b[k], f"{path}.{k}", errors)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            errors.append(f"{path}: {len(a)} items != {len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]", errors)
        return
    if a != b:
        errors.append(f"{path}: {a!r} != {b!r}")


def _stdout_items(text: str) -> list[tuple[str, object]]:
    """Split stdout into ('json', obj), ('header', line) and ('line', line) items."""
    items: list[tuple[str, object]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("{"):
            depth = 0
            block = []
            while i < len(lines):
                block.append(lines[i])
                depth += lines[i].count("{") - lines[i].count("}")
                i += 1
                if depth == 0:
                    break
            items.append(("json", json.loads("\n".join(block))))
            continue
        if line.startswith("==="):
            items.append(("header", line))
        elif line.strip():
            items.append(("line", line))
        i += 1
    return items


def drop_head_extras(items: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Stdout items less what the August reference adds to every run (``head_extras``)."""
    kept: list[tuple[str, object]] = []
    skipping = False
    for kind, value in items:
        if kind == "header":
            skipping = value in HEAD_EXTRA_SECTIONS
            if skipping:
                continue
        elif skipping:
            continue
        if kind == "json":
            value = _drop_keys(value, set(HEAD_EXTRA_KEYS))
        elif kind == "line" and str(value).lstrip().startswith(HEAD_EXTRA_LINES):
            continue
        kept.append((kind, value))
    return kept


def _without_extra_lines(text: str) -> str:
    """A text file less the lines the August reference adds (``trace_version:``)."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not line.startswith(HEAD_EXTRA_LINES))


def _parse_value(text: str):
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def compare_stdout(actual: str, expected: str, head_extras: bool = False) -> list[str]:
    """Differences between two stdout texts under the parity rules (empty = equal); with
    ``head_extras`` what the August reference adds to every run is dropped from both."""
    errors: list[str] = []
    a_items, e_items = _stdout_items(actual), _stdout_items(expected)
    if head_extras:
        a_items, e_items = drop_head_extras(a_items), drop_head_extras(e_items)
    if len(a_items) != len(e_items):
        errors.append(f"stdout: {len(a_items)} items != {len(e_items)} expected")
    for n, (a, e) in enumerate(zip(a_items, e_items, strict=False)):
        if a[0] != e[0]:
            errors.append(f"stdout item {n}: {a} != {e}")
            continue
        if a[0] == "json":
            _close(a[1], e[1], f"stdout json #{n}", errors)
        elif a[0] == "header":
            if a[1] != e[1]:
                errors.append(f"stdout header {a[1]!r} != {e[1]!r}")
        else:
            la, le = str(a[1]), str(e[1])
            if ":" in le and ":" in la and la.split(":", 1)[0] == le.split(":", 1)[0]:
                va, ve = la.split(":", 1)[1].strip(), le.split(":", 1)[1].strip()
                _close(_parse_value(va), _parse_value(ve), le.split(":", 1)[0], errors)
            elif la != le:
                errors.append(f"stdout line {la!r} != {le!r}")
    return errors


def _request_key(rec: dict) -> tuple:
    return (rec.get("arrived_at"), rec.get("requestID", rec.get("request_id")))


def compare_results(actual: object, expected: object) -> list[str]:
    """Differences between two results files; records with equal arrival may be reordered."""
    errors: list[str] = []
    if isinstance(expected, dict) and isinstance(actual, dict):
        a = dict(actual)
        e = dict(expected)
        a_req = sorted(a.pop("requests", []), key=_request_key)
        e_req = sorted(e.pop("requests", []), key=_request_key)
        _close(a, e, "results", errors)
        _close(a_req, e_req, "results.requests", errors)
        return errors
    if isinstance(expected, list) and isinstance(actual, list):
        _close(sorted(actual, key=_request_key), sorted(expected, key=_request_key),
               "results", errors)
        return errors
    return [f"results: type {type(actual).__name__} != {type(expected).__name__}"]


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _drop_keys(obj: object, keys: set[str]) -> object:
    """``obj`` without the dict keys in ``keys``, at any depth."""
    if isinstance(obj, dict):
        return {k: _drop_keys(v, keys) for k, v in obj.items() if k not in keys}
    if isinstance(obj, list):
        return [_drop_keys(v, keys) for v in obj]
    return obj


def compare_lines(actual: str, expected: str, name: str, ignore_keys: set[str]) -> list[str]:
    """Differences between two text files, line by line: the text with numbers masked must be
    equal and the numbers equal (integers exactly, floats to REL_TOL); ``key: value`` lines of
    an ignored key are dropped from both sides."""

    def kept(text: str) -> list[str]:
        return [line for line in text.splitlines()
                if line.strip().split(":", 1)[0] not in ignore_keys]

    a_lines, e_lines = kept(actual), kept(expected)
    errors: list[str] = []
    if len(a_lines) != len(e_lines):
        errors.append(f"{name}: {len(a_lines)} lines != {len(e_lines)} expected")
    for n, (la, le) in enumerate(zip(a_lines, e_lines, strict=False), start=1):
        if _NUMBER.sub("#", la) != _NUMBER.sub("#", le):
            errors.append(f"{name} line {n}: {la!r} != {le!r}")
            continue
        for va, ve in zip(_NUMBER.findall(la), _NUMBER.findall(le), strict=True):
            _close(_parse_value(va), _parse_value(ve), f"{name} line {n}", errors)
    return errors


def compare_outputs(case: dict, src: Path, workdir: Path) -> list[str]:
    """Differences in the case's extra ``outputs`` files (tests/reference_cases/README.md,
    "Cases with more outputs"): a failing case must leave none of them behind; otherwise each
    must exist and match the case's copy, ``.json`` files like results.json and other files
    line by line, after dropping the ``ignore_keys`` from both sides."""
    names = case.get("outputs", [])
    if case["exit_code"] != 0:
        return [f"output file {name} written by a failing run" for name in names
                if (workdir / name).exists()]
    ignore = set(case.get("ignore_keys", []))
    errors: list[str] = []
    for name in names:
        actual_path = workdir / name
        if not actual_path.is_file():
            errors.append(f"{name} was not written")
            continue
        actual, expected = actual_path.read_text(), (src / name).read_text()
        if name.endswith(".json"):
            diffs = compare_results(_drop_keys(json.loads(actual), ignore),
                                    _drop_keys(json.loads(expected), ignore))
            errors += [f"{name}: {d}" for d in diffs]
        else:
            errors += compare_lines(actual, expected, name, ignore)
    return errors


MARCH_REFERENCE = "blis@9afd96ff"
# A failing case only counts when blis_fast refuses the input for the case's reason: the
# command and every flag must exist (click's messages for unknown ones are excluded).
UNKNOWN_INTERFACE = re.compile(r"No such (option|command)|a feature of the reference that blis_fast "
                               r"does not support")


def _adopt_march_metrics(obj: dict) -> dict:
    """A March metrics object as the adopted (April) reference would print it.

    Only DELTA-6 differs for the March cases: a normally completing request now counts all N
    output tokens instead of N - 1. The rewrite is exact when no request was length-capped,
    timed out, preempted or left running, which is asserted.
    """
    for key in ("still_running", "still_queued", "timed_out_requests", "length_capped_requests",
                "preemption_count", "dropped_unservable"):
        assert obj[key] == 0, f"March adaptation needs {key} == 0"
    out = dict(obj)
    out["total_output_tokens"] = obj["total_output_tokens"] + obj["completed_requests"]
    duration = obj["vllm_estimated_duration_s"]
    out["tokens_per_sec"] = out["total_output_tokens"] / duration if duration > 0 else 0
    return out


def _adopt_march_trace(yaml_text: str, csv_text: str, seed: int, timeout_s: int):
    """A March trace export as the adopted reference writes it (DELTA-28, DELTA-60, DELTA-61):
    a ``prefix_length`` column after ``prefix_group``, ``workload_seed`` in the header, and the
    default ``--timeout`` deadline on every synthesized request."""
    header = yaml_text + f"workload_seed: {seed}\n"
    lines = csv_text.splitlines()
    cols = lines[0].split(",")
    pg = cols.index("prefix_group")
    dl = cols.index("deadline_us")
    arr = cols.index("arrival_time_us")
    out = [",".join(cols[: pg + 1] + ["prefix_length"] + cols[pg + 1:])]
    for line in lines[1:]:
        f = line.split(",")
        assert f[pg] == "" and f[dl] == "0", "March adaptation needs no prefix and no deadline"
        f[dl] = str(int(f[arr]) + timeout_s * 1_000_000)
        out.append(",".join(f[: pg + 1] + ["0"] + f[pg + 1:]))
    return header, "\n".join(out) + "\n"


def check_case(case_id: str, workdir: Path) -> list[str]:
    """Run one case and return every difference from the reference's outputs."""
    case = load_case(case_id)
    if parity_observe.handles(case):
        return parity_observe.check_observe_case(case_id, workdir)
    src = CASES_DIR / case_id
    march = case["reference"].startswith(MARCH_REFERENCE)
    run = run_case(case_id, workdir)
    errors: list[str] = []
    if case["exit_code"] != 0:
        if run.exit_code == 0:
            errors.append("expected a non-zero exit code, got 0")
        for name in ("results.json", "trace.yaml", "trace.csv"):
            if (workdir / name).exists():
                errors.append(f"output file {name} written by a failing run")
        if run.stderr.count("\n") != 1:
            errors.append(f"stderr should be one line, got: {run.stderr!r}")
        if UNKNOWN_INTERFACE.search(run.stderr):
            errors.append(f"refused for a missing command or flag, not the case's reason: "
                          f"{run.stderr.strip()!r}")
        return errors + compare_outputs(case, src, workdir)
    if run.exit_code != 0:
        return [f"exit code {run.exit_code}: {run.stderr.strip()[-500:]}"]
    expected_stdout = (src / "stdout.txt").read_text()
    if march:
        items = _stdout_items(expected_stdout)
        assert len(items) == 2 and items[1][0] == "json", "March cases are single-instance"
        expected_stdout = "=== Simulation Metrics ===\n" + json.dumps(
            _adopt_march_metrics(items[1][1]), indent=2) + "\n"
    extras = bool(case.get("head_extras"))
    errors += compare_stdout(run.stdout, expected_stdout, head_extras=extras)
    if (src / "results.json").is_file():
        actual_path = workdir / "results.json"
        if not actual_path.is_file():
            errors.append("results.json was not written")
        else:
            expected = json.loads((src / "results.json").read_text())
            actual = json.loads(actual_path.read_text())
            if march:
                expected = _adopt_march_metrics(expected)
            if extras:
                expected = _drop_keys(expected, set(HEAD_EXTRA_KEYS))
                actual = _drop_keys(actual, set(HEAD_EXTRA_KEYS))
            errors += compare_results(actual, expected)
    errors += compare_outputs(case, src, workdir)
    if (src / "trace.csv").is_file():
        exp_yaml = (src / "trace.yaml").read_text()
        exp_csv = (src / "trace.csv").read_text()
        if march:
            exp_yaml, exp_csv = _adopt_march_trace(exp_yaml, exp_csv, 42, 300)
        for name, text in (("trace.yaml", exp_yaml), ("trace.csv", exp_csv)):
            if not (workdir / name).is_file():
                errors.append(f"{name} was not written")
                continue
            actual_text = (workdir / name).read_text()
            if extras:
                actual_text, text = _without_extra_lines(actual_text), _without_extra_lines(text)
            if actual_text != text:
                errors.append(f"{name} differs from the reference's export")
    return errors
