"""Refresh the repository's copy of the reference cases from a folder of case folders.

Usage: ``python tests/reference_cases/sync.py SOURCE_DIR [--dry-run]``

``SOURCE_DIR`` holds one folder per case, each with a ``case.json`` (the layout described in
``tests/reference_cases/README.md``). Every case folder found there replaces the copy of the same
name under ``tests/reference_cases/cases/``; new cases are added; cases the source no longer has
are listed and kept (delete them by hand if they were withdrawn). Prints one line per change.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import shutil
import sys
from pathlib import Path

CASES = Path(__file__).resolve().parent / "cases"


def _differs(a: Path, b: Path) -> bool:
    """True when two case folders do not hold the same files with the same bytes."""
    cmp = filecmp.dircmp(a, b)
    if cmp.left_only or cmp.right_only or cmp.funny_files:
        return True
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    if mismatch or errors:
        return True
    return any(_differs(a / d, b / d) for d in cmp.common_dirs)


def sync(source: Path, dry_run: bool = False) -> list[str]:
    """Copy every case folder of ``source`` over ``cases/``; return the changes made."""
    changes: list[str] = []
    found = sorted(p for p in source.iterdir() if (p / "case.json").is_file())
    for case in found:
        json.loads((case / "case.json").read_text())  # a broken case.json stops here
        target = CASES / case.name
        if not target.exists():
            changes.append(f"added   {case.name}")
        elif _differs(case, target):
            changes.append(f"updated {case.name}")
        else:
            continue
        if not dry_run:
            tmp = CASES / f".{case.name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(case, tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    names = {p.name for p in found}
    for kept in sorted(p.name for p in CASES.iterdir() if p.is_dir() and p.name not in names):
        changes.append(f"not in source (kept) {kept}")
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="folder holding one folder per case")
    parser.add_argument("--dry-run", action="store_true", help="list the changes, copy nothing")
    args = parser.parse_args(argv)
    if not args.source.is_dir():
        print(f"sync: {args.source} is not a folder", file=sys.stderr)
        return 2
    CASES.mkdir(exist_ok=True)
    for line in sync(args.source, args.dry_run):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
