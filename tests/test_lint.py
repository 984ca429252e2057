"""The code base is ``ruff`` clean (the rules in ``pyproject.toml``): checked with the tests so
that ``python -m pytest`` (and so CI) fails on a lint error, not only a developer's editor."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINTED = ("blis_fast", "tests", "bench", "examples")


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed (it comes with the [dev] extra)")
    return [found]


def test_ruff_check_is_clean():
    res = subprocess.run([*_ruff(), "check", "--no-cache", *LINTED], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
