"""Benchmark a 1,000-configuration ``blis sweep`` process on this machine.

The sweep: the quick start's model on 4 instances, 1,000 requests per configuration (roofline),
grid rate (5) x routing policy (4) x max-num-running-reqs (5) x 10 seeds = 1,000
configurations, run with ``--workers 2``. Wall time is measured around the whole ``blis sweep``
process, peak RSS is the largest ``ru_maxrss`` of it and its worker processes (``os.wait4``).
The result must have 1,000 summary rows with no null metric.

Usage::

    python bench/sweep_bench.py               # 3 repeats, prints min / median
    python bench/sweep_bench.py --repeat 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from run_bench import MB, find_blis, run_blis

SPEC = """\
base:
  model: meta-llama/llama-3.1-8b-instruct
  num_instances: 4
  num_requests: 1000
grid:
  rate: [5, 10, 20, 40, 80]
  routing_policy: [round-robin, least-loaded, weighted, always-busiest]
  max_num_running_reqs: [16, 32, 64, 128, 256]
seeds: 10
"""
NUM_CONFIGS = 1000
WORKERS = 2
MAX_WALL_S = 60.0


@dataclass
class SweepRun:
    """One measured sweep process and what it wrote."""

    wall_s: float
    peak_rss_mb: float
    rows: int
    null_metrics: int
    errors: int


def metric_columns(frame: pl.DataFrame) -> list[str]:
    """The summary metric columns of a sweep frame (everything after the option columns)."""
    from blis_fast.sweep.store import metric_fields

    return [f.name for f in metric_fields() if f.name in frame.columns]


def run_once(workdir: Path, blis: str) -> SweepRun:
    """Write the spec, run the sweep into a fresh directory, read its summary back."""
    spec = workdir / "sweep.yaml"
    spec.write_text(SPEC)
    out = workdir / f"out-{len(list(workdir.glob('out-*')))}"
    run = run_blis(blis, [str(spec), "--out", str(out), "--workers", str(WORKERS)],
                   cwd=workdir, command="sweep", timeout_s=600.0)
    if run.exit_code != 0:
        raise RuntimeError(f"blis sweep exited {run.exit_code}: {run.stderr[-2000:]}")
    frame = pl.read_parquet(str(out / "summary" / "*.parquet"))
    metrics = metric_columns(frame)
    nulls = int(frame.select(pl.col(metrics).null_count()).sum_horizontal().item())
    return SweepRun(wall_s=run.wall_s, peak_rss_mb=run.peak_rss_bytes / MB, rows=frame.height,
                    null_metrics=nulls, errors=int(frame["error"].is_not_null().sum()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    blis = find_blis()
    with tempfile.TemporaryDirectory(prefix="blis-sweep-bench-") as tmp:
        runs = [run_once(Path(tmp), blis) for _ in range(args.repeat)]
    walls = [r.wall_s for r in runs]
    print(f"1,000-config sweep, --workers {WORKERS}: wall min {min(walls):.1f} s, "
          f"median {statistics.median(walls):.1f} s "
          f"({NUM_CONFIGS / statistics.median(walls):.1f} configs/s); "
          f"peak RSS {max(r.peak_rss_mb for r in runs):.0f} MB; rows {runs[-1].rows}, "
          f"null metrics {runs[-1].null_metrics}, errors {runs[-1].errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
