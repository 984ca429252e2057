"""Compare routing policies and scorer weights on the same workload (p99 TTFT, spread).

Counterpart of the reference's ``examples/routing-comparison.sh`` at inference-sim 9afd96ff;
the figures (4 instances, 1000 requests at 5000 req/s, the scorer mixes) come from it.

Part 1 runs the default synthetic workload at a very high rate. Which signal a scorer reads
matters there: a request routed to an instance counts in its queue-depth score at once, but
KV utilisation only changes when the instance next forms a batch, so dozens of decisions in
a row see the same stale KV figures and ``kv-utilization`` alone piles requests onto a few
instances (an uneven ``per_instance`` column and a much higher p99 TTFT).

Part 2 runs ``examples/prefix-affinity-demo.yaml``: prefix-dominant weights gather the
shared-prompt requests on the instance that caches the prompt, load-only weights spread them.

    python examples/routing_comparison.py [--num-requests 1000] [--rate 5000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import polars as pl

import blis_fast

MODEL = "meta-llama/llama-3.1-8b-instruct"
PREFIX_DEMO = Path(__file__).with_name("prefix-affinity-demo.yaml")

# (label, run options) of each configuration; "weighted" without scorers = default profile
SYNTHETIC_CONFIGS: list[tuple[str, dict]] = [
    ("round-robin", {"routing_policy": "round-robin"}),
    ("least-loaded", {"routing_policy": "least-loaded"}),
    ("weighted queue-depth:1", {"routing_policy": "weighted",
                                "routing_scorers": "queue-depth:1"}),
    ("weighted kv-utilization:1", {"routing_policy": "weighted",
                                   "routing_scorers": "kv-utilization:1"}),
    ("weighted (default profile)", {"routing_policy": "weighted"}),
]
PREFIX_CONFIGS: list[tuple[str, dict]] = [
    ("weighted prefix-affinity:5,queue-depth:1", {"routing_policy": "weighted",
                                                  "routing_scorers":
                                                      "prefix-affinity:5,queue-depth:1"}),
    ("weighted queue-depth:1", {"routing_policy": "weighted",
                                "routing_scorers": "queue-depth:1"}),
    ("round-robin", {"routing_policy": "round-robin"}),
    ("weighted (default profile)", {"routing_policy": "weighted"}),
]


def compare(configs: list[tuple[str, dict]], **workload) -> pl.DataFrame:
    """Run every configuration on the same workload; one row per configuration.

    ``workload`` holds the ``blis_fast.run`` options shared by all runs (``num_instances``
    included). Columns: ``config``, ``ttft_mean_ms``, ``ttft_p99_ms``, ``responses_per_sec``
    and ``per_instance`` (requests routed to each instance, in instance order, as a list).
    """
    rows = []
    for label, options in configs:
        result = blis_fast.run(**workload, **options)
        routed = result.simulation.instance
        spread = np.bincount(routed[routed >= 0], minlength=workload["num_instances"]).tolist()
        rows.append({"config": label, "ttft_mean_ms": result.summary["ttft_mean_ms"],
                     "ttft_p99_ms": result.summary["ttft_p99_ms"],
                     "responses_per_sec": result.summary["responses_per_sec"],
                     "per_instance": spread})
    return pl.DataFrame(rows)


def run_both(num_requests: int = 1000, rate: float = 5000.0, num_instances: int = 4,
             model: str = MODEL) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Part 1 (synthetic workload at ``rate``) and part 2 (the prefix demo spec)."""
    common = {"model": model, "num_instances": num_instances, "log": "error"}
    synthetic = compare(SYNTHETIC_CONFIGS, num_requests=num_requests, rate=rate, **common)
    prefix = compare(PREFIX_CONFIGS, workload_spec=str(PREFIX_DEMO), **common)
    return synthetic, prefix


def main(argv: list[str] | None = None) -> None:
    """Print both comparison tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=5000.0)
    ap.add_argument("--num-instances", type=int, default=4)
    ap.add_argument("--model", default=MODEL)
    args = ap.parse_args(argv)
    synthetic, prefix = run_both(args.num_requests, args.rate, args.num_instances, args.model)
    with pl.Config(tbl_rows=-1, tbl_width_chars=120, fmt_table_cell_list_len=-1, fmt_str_lengths=60):
        print(f"Part 1: {args.num_requests} requests at {args.rate:g} req/s, "
              f"{args.num_instances} instances")
        print(synthetic)
        print(f"\nPart 2: {PREFIX_DEMO.name}")
        print(prefix)


if __name__ == "__main__":
    main()
