"""The repository stands alone: no tracked file names a path outside it.

A lone clone has no sibling folders, so a test, benchmark or document that reads or cites
the steering folder beside it (or any ``../`` path climbing out of the repository, or an absolute path on a
developer's machine) breaks for every user. This scans every text file git tracks.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# ``../x/y`` style references, and absolute paths that only exist on a developer's machine.
RELATIVE_UP = re.compile(r"(?:\.\./)+[A-Za-z0-9_.-]+")
MACHINE_PATHS = re.compile(r"(?<![\w.])/(?:work|root|home|Users)/[A-Za-z0-9_.-]+")
SHARED_NAMES = re.compile(r"\bshared/(?:parity|spec|seeds|DESIGN\.md|STYLE\.md|hooks)\b")
# the same folder built in code: ``... / "shared" / "parity"`` or ``.parent / "shared"``
SHARED_IN_CODE = re.compile(r"""(?:parent|parents\[\d\])\s*/\s*["']shared["']|["']shared["']\s*/\s*["'](?:parity|spec|seeds)["']""")


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked-file list is unavailable")
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def _outside(file: Path, reference: str) -> bool:
    """True when ``reference`` (a ``../`` path) resolves outside the repository, read from the
    file's folder or from the repository root."""
    for base in (file.parent, ROOT):
        target = (base / reference).resolve()
        if target == ROOT or ROOT in target.parents:
            return False
    return True


def escaping_references(file: Path, text: str) -> list[str]:
    """Every path-like reference in ``text`` that points outside the repository."""
    found = [m.group(0) for m in RELATIVE_UP.finditer(text) if _outside(file, m.group(0))]
    found += [m.group(0) for m in MACHINE_PATHS.finditer(text)]
    found += [m.group(0) for m in SHARED_NAMES.finditer(text)]
    found += [m.group(0) for m in SHARED_IN_CODE.finditer(text)]
    return found


def test_no_tracked_file_names_a_path_outside_the_repository():
    offenders = []
    for file in _tracked_files():
        if not file.is_file() or file == Path(__file__).resolve():
            continue  # this file spells the patterns out in its own checks
        data = file.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (PNG, Parquet)
        text = data.decode("utf-8", errors="replace")
        for ref in escaping_references(file, text):
            offenders.append(f"{file.relative_to(ROOT)}: {ref}")
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders[:50])


def test_the_scanner_sees_what_it_must(tmp_path):
    """The patterns catch the references a lone clone cannot follow, and only those."""
    inside = ROOT / "tests" / "x.py"
    up = "../" + "shared"  # spelled in two pieces so this file does not name the folder itself
    assert escaping_references(inside, f"read {up}/parity/cases/x") == ["shared/parity"]
    assert escaping_references(ROOT / "README.md", f"see {up}/x") == [up]
    assert escaping_references(inside, "see ../../elsewhere/file.txt") == ["../../elsewhere"]
    assert escaping_references(inside, "open /work/main/tests") == ["/work/main"]
    assert escaping_references(inside, "in shared/spec/engine.md") == ["shared/spec"]
    assert escaping_references(inside, "the repo's ../README.md, /tmp/x, ../docs/a.md") == []
    assert escaping_references(ROOT / "a.md", "the shared prefix, a shared/other") == []
    built = 'CASES = ROOT.parent / "shared" / "parity" / "cases"'
    assert escaping_references(inside, built) == ['parent / "shared"']
    assert escaping_references(inside, 'x = "shared" / "spec"') == ['"shared" / "spec"']
    assert escaping_references(inside, 'client.prefix_group = "shared"') == []
