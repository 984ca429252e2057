"""Benchmark one evaluation of the default evolution benchmark (3 workloads x 2 seeds,
2,000 requests each, 4 instances) on this machine.

Two figures: ``in-process`` is ``evaluate_source`` in a warm process (candidate compiled,
six simulations, feedback; the baseline's runs are cached), ``contained`` is the whole
``Evaluator.evaluate`` of a new candidate (a supervisor forked from the warm forkserver
makes the namespaces and forks the evaluation: memory limit, captured output, result over a
pipe, the baseline's runs too). Each candidate differs by a comment, so neither the Numba
compilation nor the evaluation cache is skipped. Target: <= 2 s warm.

Usage::

    python bench/evolve_bench.py               # 5 repeats, prints min / median
    python bench/evolve_bench.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from blis_fast.evolve.adapters import INITIAL_PROGRAMS
from blis_fast.evolve.benchmark import default_benchmark
from blis_fast.evolve.evaluate import evaluate_source
from blis_fast.evolve.sandbox import Evaluator

MAX_WARM_S = 2.0


def _candidate(k: int) -> str:
    return INITIAL_PROGRAMS["scorer"] + f"\n# variant {k}\n"


def measure(repeat: int) -> dict[str, list[float]]:
    """Seconds per evaluation, in-process and contained, after one warm-up of each."""
    bench = default_benchmark()
    evaluate_source(_candidate(-1), "scorer", bench)  # warm: kernels, baseline runs
    evaluator = Evaluator("scorer", bench, timeout_s=120)
    evaluator.evaluate(_candidate(-2))  # warm: the forkserver
    times: dict[str, list[float]] = {"in-process": [], "contained": []}
    for k in range(repeat):
        started = time.perf_counter()
        record = evaluate_source(_candidate(k), "scorer", bench)
        times["in-process"].append(time.perf_counter() - started)
        assert record["ok"], record["error"]
        started = time.perf_counter()
        record = evaluator.evaluate(_candidate(1000 + k))
        times["contained"].append(time.perf_counter() - started)
        assert record["ok"], record["error"]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, values in measure(args.repeat).items():
        print(f"{name:>10}: min {min(values):.3f} s, median {statistics.median(values):.3f} s "
              f"({args.repeat} evaluations of 6 runs x 2,000 requests)")


if __name__ == "__main__":
    main()
