"""Benchmark an autoscaled run against the fixed fleet it scales up to (issue 15's speed
target: a 100,000-request ramp scaling between 2 and 16 instances within 1.3x of the fixed
16-instance run on the same workload).

Both are whole ``blis run`` processes (wall time around the process, warm kernel cache after
one untimed run each): 16 single-GPU H100 nodes, 2 warm start-up instances, a tick every
second, no scale-up window, a 30 s scale-down window, 1 s loading delay, 4000 KV blocks per
instance (so the ramp drives the fleet up to all 16 nodes); the fixed run is
``--num-instances 16`` without the bundle. Writes ``bench/autoscale_results.json``.

Usage::

    python bench/autoscale_bench.py [--repeat 3] [--requests 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent

SPEC = """\
version: "2"
seed: 7
category: language
aggregate_rate: {rate}
num_requests: {n}
clients:
  - id: base
    rate_fraction: 0.3
    arrival: {{process: poisson}}
    input_distribution: {{type: gaussian, params: {{mean: 512, std_dev: 128, min: 64, max: 1024}}}}
    output_distribution: {{type: gaussian, params: {{mean: 256, std_dev: 64, min: 16, max: 512}}}}
  - id: ramp
    rate_fraction: 0.7
    arrival: {{process: poisson}}
    input_distribution: {{type: gaussian, params: {{mean: 512, std_dev: 128, min: 64, max: 1024}}}}
    output_distribution: {{type: gaussian, params: {{mean: 256, std_dev: 64, min: 16, max: 512}}}}
    lifecycle:
      windows:
        - {{start_us: 60000000, end_us: 240000000}}
"""

BUNDLE = """\
node_pools:
  - {name: h100, gpu_type: H100, gpus_per_node: 1, gpu_memory_gib: 80,
     initial_nodes: 16, max_nodes: 16}
instance_lifecycle:
  loading_delay: {mean: 1.0}
  warm_start_initial_instances: true
autoscaler:
  interval_us: 1000000
  scale_down_stabilization_window_us: 30000000
"""


def _time_run(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "blis_fast.cli", "run", *args, "--log", "error"],
                   check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    """Run both cases ``--repeat`` times (after a warm-up each) and report the medians."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=400.0)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "ramp.yaml"
        spec.write_text(SPEC.format(rate=ns.rate, n=ns.requests))
        bundle = Path(tmp) / "autoscale.yaml"
        bundle.write_text(BUNDLE)
        common = ["--model", "meta-llama/llama-3.1-8b-instruct", "--workload-spec", str(spec),
                  "--total-kv-blocks", "4000"]
        cases = {
            "fixed-16": common + ["--num-instances", "16"],
            "autoscaled-2-16": common + ["--num-instances", "2", "--policy-config", str(bundle)],
        }
        results = {}
        for name, args in cases.items():
            _time_run(args)  # warm-up: kernels cached, files in the page cache
            times = [_time_run(args) for _ in range(ns.repeat)]
            results[name] = {"median_s": statistics.median(times), "runs_s": times}
            print(f"{name:>16}: {statistics.median(times):.2f} s  {times}")
    ratio = results["autoscaled-2-16"]["median_s"] / results["fixed-16"]["median_s"]
    results["ratio"] = ratio
    results["requests"] = ns.requests
    print(f"autoscaled / fixed: {ratio:.2f} (target <= 1.3)")
    (BENCH_DIR / "autoscale_results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
