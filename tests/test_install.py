"""The wheel installs into a fresh virtual environment and its ``blis`` runs the quick start.

Marked ``install`` and so excluded from the default run (it builds the wheel and downloads the
dependencies; pip's cache is used). Run it with::

    python -m pytest tests/test_install.py -m install -q

It creates a venv in ``tmp_path`` without system site-packages (so the developer's editable
install is invisible), runs ``pip install <repo root>`` (not editable), checks that the bundled
data files are installed under ``blis_fast/data/``, then runs
``blis run --model meta-llama/llama-3.1-8b-instruct`` from an unrelated directory and compares
its stdout with the parity case ``quickstart-llama31-8b``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from parity import CASES_DIR, compare_stdout

pytestmark = pytest.mark.install

REPO_ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = CASES_DIR / "quickstart-llama31-8b"
PIP_TIMEOUT_S = 15 * 60
RUN_TIMEOUT_S = 10 * 60  # the first run compiles the Numba kernels


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE"):
        env.pop(name, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd: list, *, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, (
        f"{cmd} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
        f"--- stderr\n{proc.stderr[-4000:]}")
    return proc


def test_wheel_installs_and_runs_quickstart(tmp_path):
    venv = tmp_path / "venv"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    bindir = venv / "bin"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path, timeout=300)
    _run([bindir / "python", "-m", "pip", "install", REPO_ROOT], cwd=tmp_path,
         timeout=PIP_TIMEOUT_S)

    # The package comes from the venv's site-packages, not from the source tree.
    where = _run([bindir / "python", "-c", "import blis_fast; print(blis_fast.__file__)"],
                 cwd=elsewhere, timeout=300)
    pkg_dir = Path(where.stdout.strip()).parent
    assert pkg_dir.is_relative_to(venv), f"blis_fast imported from {pkg_dir}, not the venv"
    assert pkg_dir.parent.name == "site-packages", pkg_dir

    # The bundled data files.
    data = pkg_dir / "data"
    assert (data / "defaults.yaml").is_file()
    assert (data / "hardware_config.json").is_file()
    installed_models = {p.parent.name for p in data.glob("model_configs/*/config.json")}
    source_models = {p.parent.name for p in REPO_ROOT.glob("model_configs/*/config.json")}
    assert installed_models, "no model_configs/*/config.json in the installed package"
    assert installed_models == source_models
    assert "llama-3.1-8b-instruct" in installed_models
    installed_schemas = {p.name for p in data.glob("schemas/*.json")}
    assert installed_schemas, "no schemas/*.json in the installed package"
    assert installed_schemas == {p.name for p in REPO_ROOT.glob("schemas/*.json")}

    # The quick start from an unrelated directory.
    run = _run([bindir / "blis", "run", "--model", "meta-llama/llama-3.1-8b-instruct"],
               cwd=elsewhere, timeout=RUN_TIMEOUT_S)
    expected = (QUICKSTART / "stdout.txt").read_text()
    if run.stdout != expected:
        errors = compare_stdout(run.stdout, expected)
        assert not errors, "\n".join(errors[:30])
