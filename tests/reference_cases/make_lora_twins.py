"""Build the LoRA-free twin of every valid ``lora-*`` run/replay case with the reference binaries.

Usage (by hand, never from the tests: it needs the Go reference builds)::

    python tests/reference_cases/make_lora_twins.py --april PATH/blis --august PATH/blis \
        [--only CASE_ID ...] [--dry-run]

``--april`` is a ``blis`` of blis@b563c440+819aff6c, ``--august`` one of blis@f90a1e3a (each a
wrapper that points ``--defaults-filepath`` at its own tree, as the cases expect). For each
``lora-*`` case with ``exit_code`` 0 whose subcommand is ``run`` or ``replay`` (the calibrate
mode exists only for LoRA, so it has no twin), the twin is the same command and inputs with
every LoRA setting removed: the ``--lora-*`` flags and ``--lora-config`` (and its file),
``lora-affinity`` from ``--routing-scorers`` and from a ``--policy-config`` bundle's
``routing.scorers`` (a list left empty drops the flag or key), the ``adapter:`` keys of a
``--workload-spec`` and the ``adapter`` column of a replayed ``--trace-data`` file.

Each twin runs with both builds in fresh folders holding only its inputs. Why both: the LoRA
case's note claims the LoRA-free run is unchanged between April and August, which makes the
April output a fair expectation for blis_fast (which prints what April prints). The two must
agree under the checker's rules for August cases (tests/parity.py, ``head_extras``); then the
April run is written as ``cases/twin-<case id>`` (reference ``blis@b563c440+819aff6c``). A
disagreement or a non-zero exit is reported and no folder is written for that case. Exit
status: 0 when every twin was written (or would be, with ``--dry-run``), 1 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
sys.path.insert(0, str(HERE.parent))  # tests/, for the parity rules

from parity import (  # noqa: E402
    BOOL_FLAGS,
    HEAD_EXTRA_KEYS,
    _drop_keys,
    _without_extra_lines,
    compare_lines,
    compare_results,
    compare_stdout,
)

APRIL_REFERENCE = "blis@b563c440+819aff6c"
AUGUST_REFERENCE = "blis@f90a1e3a"
CASE_OUTPUTS = frozenset({"case.json", "stdout.txt", "stderr.txt", "results.json", "trace.yaml",
                          "trace.csv"})
LORA_SCORER = "lora-affinity"
RUN_TIMEOUT_S = 600


def _split_args(args: list[str]) -> list[list[str]]:
    """A case's ``args`` as ``[flag]`` / ``[flag, value]`` groups, in order."""
    groups: list[list[str]] = []
    i = 0
    while i < len(args):
        if args[i] in BOOL_FLAGS:
            groups.append([args[i]])
            i += 1
        else:
            groups.append(args[i:i + 2])
            i += 2
    return groups


def _without_adapter_keys(text: str) -> str:
    """A workload spec's text less its ``adapter:`` lines (block-style keys of clients and
    cohorts), checked against the parsed spec with those keys dropped."""
    kept = "".join(line for line in text.splitlines(keepends=True)
                   if not line.strip().startswith("adapter:"))
    if yaml.safe_load(kept) != _drop_keys(yaml.safe_load(text), {"adapter"}):
        raise SystemExit("workload spec: an adapter key is not a plain block-style line")
    return kept


def _without_lora_scorer(text: str) -> tuple[str, bool]:
    """A policy bundle's text less the ``lora-affinity`` entries of ``routing.scorers`` (the
    ``scorers:`` key too when nothing is left); True when anything was removed. Checked
    against the parsed bundle with the same change."""
    data = yaml.safe_load(text)
    routing = data.get("routing") if isinstance(data, dict) else None
    scorers = routing.get("scorers") if isinstance(routing, dict) else None
    if not isinstance(scorers, list) or not any(
            isinstance(s, dict) and s.get("name") == LORA_SCORER for s in scorers):
        return text, False
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    skip_indent: int | None = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if line.strip() and indent > skip_indent and not line.lstrip().startswith("- "):
                continue
            skip_indent = None
        body = line.strip()
        if body.startswith("- ") and LORA_SCORER in body:
            item = yaml.safe_load(body[2:]) if body.startswith("- {") else None
            if item is None or item.get("name") == LORA_SCORER:
                skip_indent = indent if item is None else None
                continue
        out.append(line)
    expected = dict(data)
    left = [s for s in scorers if not (isinstance(s, dict) and s.get("name") == LORA_SCORER)]
    expected["routing"] = {k: v for k, v in routing.items() if k != "scorers"}
    if left:
        expected["routing"]["scorers"] = left
    else:
        out = [line for line in out if line.strip() != "scorers:"]
    new = "".join(out)
    if yaml.safe_load(new) != expected:
        raise SystemExit("policy bundle: could not remove the lora-affinity scorer by lines")
    return new, True


def _without_adapter_column(text: str) -> str:
    """A trace v2 CSV less its ``adapter`` column."""
    rows = list(csv.reader(io.StringIO(text)))
    if "adapter" not in rows[0]:
        return text
    col = rows[0].index("adapter")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in rows:
        writer.writerow(row[:col] + row[col + 1:])
    return buf.getvalue()


def build_twin(case: dict, src: Path, dest: Path) -> tuple[list[str], list[str]]:
    """Write the twin's input files into ``dest``; return its args and what was removed."""
    groups = _split_args(case["args"])
    flags = {g[0]: g[1] if len(g) > 1 else None for g in groups}
    removed_flags = sorted({g[0] for g in groups if g[0].startswith("--lora-")})
    dropped_files = {flags["--lora-config"]} if "--lora-config" in flags else set()
    for item in src.iterdir():
        if item.name not in CASE_OUTPUTS and item.name not in dropped_files:
            shutil.copy(item, dest / item.name)
    removed_other: list[str] = []
    args: list[str] = []
    for group in groups:
        flag = group[0]
        if flag.startswith("--lora-"):
            continue
        if flag == "--routing-scorers":
            left = [s for s in group[1].split(",") if s.split(":")[0].strip() != LORA_SCORER]
            if len(left) != len(group[1].split(",")):
                removed_other.append("`lora-affinity` from --routing-scorers"
                                     + ("" if left else " (the flag with it: no scorer left)"))
            if not left:
                continue
            group = [flag, ",".join(left)]
        args += group
    if "--workload-spec" in flags:
        path = dest / flags["--workload-spec"]
        text = path.read_text()
        new = _without_adapter_keys(text)
        if new != text:
            path.write_text(new)
            removed_other.append("the `adapter:` fields of the workload spec")
    if "--policy-config" in flags:
        path = dest / flags["--policy-config"]
        new, changed = _without_lora_scorer(path.read_text())
        if changed:
            path.write_text(new)
            removed_other.append("`lora-affinity` from the policy bundle's routing.scorers")
    if "--trace-data" in flags:
        path = dest / flags["--trace-data"]
        text = path.read_text()
        new = _without_adapter_column(text)
        if new != text:
            path.write_text(new)
            removed_other.append("the `adapter` column of the input trace")
    return args, [", ".join(removed_flags)] + removed_other if removed_flags else removed_other


def run_reference(blis: str, subcommand: str, args: list[str], inputs: Path,
                  workdir: Path) -> tuple[int, str, str, dict[str, str]]:
    """Run ``blis`` on a copy of ``inputs``; return exit code, stdout, stderr and the files it
    wrote (name -> text)."""
    shutil.copytree(inputs, workdir)
    before = {p.name for p in workdir.iterdir()}
    proc = subprocess.run([blis, subcommand, *args], cwd=workdir, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, check=False)
    written = {p.name: p.read_text() for p in sorted(workdir.iterdir())
               if p.name not in before and p.is_file()}
    return proc.returncode, proc.stdout, proc.stderr, written


def compare_builds(april: tuple, august: tuple) -> list[str]:
    """Differences between the April and August runs under the August-case rules of
    tests/parity.py (the keys, lines and sections August adds dropped from both sides)."""
    a_code, a_out, _, a_files = april
    h_code, h_out, _, h_files = august
    errors: list[str] = []
    if a_code != 0 or h_code != 0:
        return [f"exit codes april={a_code} august={h_code}"]
    errors += compare_stdout(a_out, h_out, head_extras=True)
    if sorted(a_files) != sorted(h_files):
        return errors + [f"written files april={sorted(a_files)} august={sorted(h_files)}"]
    keys = set(HEAD_EXTRA_KEYS)
    for name in a_files:
        a_text, h_text = a_files[name], h_files[name]
        if name.endswith(".json"):
            errors += [f"{name}: {d}" for d in compare_results(
                _drop_keys(json.loads(a_text), keys), _drop_keys(json.loads(h_text), keys))]
        elif name.startswith("trace."):
            if _without_extra_lines(a_text) != _without_extra_lines(h_text):
                errors.append(f"{name} differs")
        else:
            errors += compare_lines(a_text, h_text, name, set())
    return errors


def twin_notes(case_id: str, removed: list[str], objects: int) -> str:
    """The twin's ``notes``: where it comes from, what was removed, and the August check."""
    return (f"Twin of {case_id} (issue 31): the same command and inputs with every LoRA setting "
            f"removed ({'; '.join(removed)}). The April run is the expectation; {AUGUST_REFERENCE} "
            f"gives the same stdout metrics JSON ({objects} object{'s' * (objects != 1)}) and the "
            "same other stdout lines and output files, apart from the newer reference's added "
            f"keys and lines. It pins the LoRA-free baseline of {case_id}, so that what differs "
            "between the two cases comes from LoRA alone. Written by "
            "tests/reference_cases/make_lora_twins.py.")


def make_twin(case_dir: Path, april_blis: str, august_blis: str, dry_run: bool) -> list[str]:
    """Build, run, check and (unless ``dry_run``) write one twin; return its problems."""
    case = json.loads((case_dir / "case.json").read_text())
    with tempfile.TemporaryDirectory(prefix="lora-twin-") as tmp:
        inputs = Path(tmp) / "inputs"
        inputs.mkdir()
        args, removed = build_twin(case, case_dir, inputs)
        april = run_reference(april_blis, case["subcommand"], args, inputs, Path(tmp) / "april")
        august = run_reference(august_blis, case["subcommand"], args, inputs, Path(tmp) / "aug")
        errors = compare_builds(april, august)
        if errors or dry_run:
            return errors
        objects = sum(1 for line in april[1].splitlines() if line.startswith("{"))
        twin = {
            "id": f"twin-{case['id']}",
            "reference": APRIL_REFERENCE,
            "subcommand": case["subcommand"],
            "args": args,
            "exit_code": 0,
            "notes": twin_notes(case["id"], removed, objects),
            "needs": [n for n in case.get("needs", []) if n != "lora"],
        }
        target = CASES / twin["id"]
        staging = CASES / f".{twin['id']}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(inputs, staging)
        (staging / "stdout.txt").write_text(april[1])
        (staging / "stderr.txt").write_text(april[2])
        for name, text in april[3].items():
            (staging / name).write_text(text)
        (staging / "case.json").write_text(json.dumps(twin, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return []


def lora_cases() -> list[Path]:
    """The valid ``lora-*`` run/replay case folders (the ones with a twin)."""
    out = []
    for d in sorted(CASES.glob("lora-*")):
        case = json.loads((d / "case.json").read_text())
        if case["exit_code"] == 0 and case["subcommand"] in ("run", "replay"):
            out.append(d)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--april", required=True, help=f"blis of {APRIL_REFERENCE}")
    parser.add_argument("--august", required=True, help=f"blis of {AUGUST_REFERENCE}")
    parser.add_argument("--only", nargs="*", default=None, help="case ids (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="check only, write nothing")
    opts = parser.parse_args(argv)
    failed = 0
    for d in lora_cases():
        if opts.only and d.name not in opts.only:
            continue
        errors = make_twin(d, opts.april, opts.august, opts.dry_run)
        status = "ok" if not errors else "DIFFERS"
        print(f"{status:8} twin-{d.name}")
        for err in errors[:20]:
            print(f"    {err}")
        failed += bool(errors)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
