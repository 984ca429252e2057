"""Benchmark workload generation from a multi-client spec (issue 4: 1,000,000 requests < 10 s).

Two measurements, each in its own process so that peak RSS (``ru_maxrss`` from ``os.wait4``)
belongs to that process alone:

  gen  ``generate_workload`` of the spec below with ``num_requests`` = N (default 1,000,000):
       wall time of the generation call and the process's peak RSS;
  run  the whole ``blis run --workload-spec`` of the same spec on 16 instances (generation,
       simulation and outputs): wall time and peak RSS. Token ids exist only inside the
       generation kernel (per-request block digests are kept), so memory grows with the
       number of requests, not tokens.

The spec has four clients with different arrival processes (poisson, gamma, weibull,
constant) and length distributions (gaussian, exponential, pareto-lognormal, empirical),
two prefix groups, SLO classes and tenants.

Usage::

    python bench/workload_bench.py                 # N = 1,000,000, writes bench/workload_results.json
    python bench/workload_bench.py --requests 200000 --skip-run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BENCH_DIR = Path(__file__).resolve().parent
MB = 1_000_000
TARGET_GEN_S = 10.0

SPEC = {
    "version": "2", "seed": 2026, "aggregate_rate": 2000.0,
    "clients": [
        {"id": "chat", "tenant_id": "t-chat", "slo_class": "critical", "rate_fraction": 0.4,
         "prefix_group": "system-a", "prefix_length": 256,
         "arrival": {"process": "poisson"},
         "input_distribution": {"type": "gaussian", "params": {
             "mean": 512, "std_dev": 128, "min": 16, "max": 2048}},
         "output_distribution": {"type": "exponential", "params": {"mean": 200}}},
        {"id": "batch", "tenant_id": "t-batch", "slo_class": "batch", "rate_fraction": 0.3,
         "arrival": {"process": "gamma", "cv": 2.5},
         "input_distribution": {"type": "pareto_lognormal", "params": {
             "alpha": 1.5, "xm": 100, "mu": 6.0, "sigma": 0.8, "mix_weight": 0.3}},
         "output_distribution": {"type": "gaussian", "params": {
             "mean": 300, "std_dev": 100, "min": 10, "max": 1000}}},
        {"id": "agents", "tenant_id": "t-chat", "slo_class": "standard", "rate_fraction": 0.2,
         "prefix_group": "system-b", "prefix_length": 1024,
         "arrival": {"process": "weibull", "cv": 1.5},
         "input_distribution": {"type": "empirical", "params": {
             "128": 0.2, "512": 0.5, "1024": 0.2, "4096": 0.1}},
         "output_distribution": {"type": "constant", "params": {"value": 64}}},
        {"id": "probe", "slo_class": "sheddable", "rate_fraction": 0.1,
         "arrival": {"process": "constant"},
         "input_distribution": {"type": "constant", "params": {"value": 32}},
         "output_distribution": {"type": "constant", "params": {"value": 8}}},
    ],
}

GEN_SNIPPET = """
import sys, time, resource
from blis_fast.workload.spec_yaml import load_workload_spec
from blis_fast.workload.generator import generate_workload
spec = load_workload_spec(sys.argv[1])
n = int(sys.argv[2])
generate_workload(spec, horizon=2**63 - 1, max_requests=1000, block_size=16)  # warm kernels
t0 = time.perf_counter()
wl = generate_workload(spec, horizon=2**63 - 1, max_requests=n, block_size=16)
dt = time.perf_counter() - t0
print(dt, wl.table.n, int(wl.table.chunk_digests.shape[0]))
"""


def _run_with_rusage(argv: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB, the child's own ``ru_maxrss``) and stdout of a process."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out_f, tempfile.TemporaryFile("w+") as err_f:
        proc = subprocess.Popen(argv, stdout=out_f, stderr=err_f, text=True)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out_f.seek(0)
        err_f.seek(0)
        out, err = out_f.read(), err_f.read()
    if proc.returncode != 0:
        raise SystemExit(f"workload_bench: {argv[:3]} failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss * 1024 / MB, out


def main() -> None:
    """Run the measurements, print a table and write bench/workload_results.json."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--skip-run", action="store_true", help="measure generation only")
    args = ap.parse_args()
    results: dict = {"requests": args.requests, "target_generation_s": TARGET_GEN_S}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(SPEC))
        _wall, rss, out = _run_with_rusage(
            [sys.executable, "-c", GEN_SNIPPET, str(spec_path), str(args.requests)])
        gen_s, n, digests = out.split()
        results["generation"] = {"seconds": round(float(gen_s), 3), "requests": int(n),
                                 "block_digests": int(digests), "peak_rss_mb": round(rss, 1),
                                 "meets_target": float(gen_s) < TARGET_GEN_S}
        print(f"generation: {int(n):,} requests in {float(gen_s):.2f} s "
              f"(target < {TARGET_GEN_S:.0f} s), peak RSS {rss:.0f} MB")
        if not args.skip_run:
            blis = Path(sys.executable).with_name("blis")
            wall, rss, _out = _run_with_rusage(
                [str(blis), "run", "--model", "meta-llama/llama-3.1-8b-instruct",
                 "--workload-spec", str(spec_path), "--num-requests", str(args.requests),
                 "--num-instances", "16"])
            results["run"] = {"wall_s": round(wall, 2), "peak_rss_mb": round(rss, 1)}
            print(f"blis run (16 instances): {wall:.1f} s wall, peak RSS {rss:.0f} MB")
    (BENCH_DIR / "workload_results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
