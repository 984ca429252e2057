"""Shared pieces of the sweep tests: a small spec, an in-process CLI call, frame comparison."""

from __future__ import annotations

import contextlib
import io
import os
import traceback
from dataclasses import dataclass
from pathlib import Path

import polars as pl

import blis_fast
from blis_fast.cli import main

MODEL = "meta-llama/llama-3.1-8b-instruct"
REPO_ROOT = Path(blis_fast.__file__).resolve().parent.parent

SMALL_SPEC = f"""\
base:
  model: {MODEL}
  num_instances: 2
  num_requests: 300
grid:
  rate: [10, 40]
  routing_policy: [round-robin, least-loaded]
seeds: 2
"""
"""8 configurations of 300 requests: runs in well under a second once the kernels are loaded."""


@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str


def invoke(argv: list[str]) -> CliRun:
    """``blis <argv>`` in this process (``blis_fast.cli.main``), with its exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # what the console script would print before exiting 1
            err.write(traceback.format_exc())
            code = 1
    return CliRun(code, out.getvalue(), err.getvalue())


def write_spec(directory: Path, text: str = SMALL_SPEC, name: str = "sweep.yaml") -> Path:
    """Write a spec file and return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def summary(out_dir: Path) -> pl.DataFrame:
    """A sweep's summary rows sorted by configuration id."""
    return pl.read_parquet(str(out_dir / "summary" / "*.parquet")).sort("config_id")


def subprocess_env() -> dict[str, str]:
    """Environment for a ``python -m blis_fast.cli`` child that imports this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env
