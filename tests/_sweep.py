"""Shared pieces of the sweep tests: a small spec, spec files, summary frames, child env."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
from _cli import invoke

import blis_fast

__all__ = ["MODEL", "REPO_ROOT", "SMALL_SPEC", "invoke", "subprocess_env", "summary",
           "write_spec"]

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
