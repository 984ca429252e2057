"""Evolving a routing scorer: the evaluator an LLM-driven search (OpenEvolve, GEPA) would call.

The workload is bursty and prefix-heavy (half the traffic shares a 512-token prompt and
arrives in gamma bursts, a quarter shares a 384-token prompt). The starting point is a
least-loaded scorer; the hand-written candidate also follows cached prefixes while the load
allows it. Each candidate is scored in a contained child process (timeout, memory limit) on
the SLO goodput (TTFT <= 50 ms and E2E <= 4 s); the feedback says where it lost.

    python examples/evolve_scorer.py
"""

from __future__ import annotations

import copy

from blis_fast.evolve.adapters import INITIAL_PROGRAMS
from blis_fast.evolve.benchmark import DEFAULT_BENCHMARK, Benchmark, benchmark_from_dict
from blis_fast.evolve.sandbox import Evaluator

LEAST_LOADED = INITIAL_PROGRAMS["scorer"]

PREFIX_AND_LOAD = '''
from blis_fast.kernels.cluster import hooks as H


def custom_scorer(snapshots, request, out):
    """Follow the cached prefix unless that instance is clearly busier than the others."""
    n = snapshots.shape[0]
    least = 1e18
    for i in range(n):
        least = min(least, snapshots[i, H.SNAP_QUEUE] + snapshots[i, H.SNAP_IN_FLIGHT])
    for i in range(n):
        load = snapshots[i, H.SNAP_QUEUE] + snapshots[i, H.SNAP_IN_FLIGHT]
        cached = snapshots[i, H.SNAP_CACHED_BLOCKS] / max(1.0, request[H.REQ_INPUT_BLOCKS])
        out[i] = 0.5 / (1.0 + 0.25 * (load - least)) + 0.5 * cached
'''


def bursty_prefix_benchmark(num_requests: int = 2000, seeds: tuple[int, ...] = (1, 2)
                            ) -> Benchmark:
    """The default benchmark's bursty prefix-heavy workload alone."""
    data = copy.deepcopy(DEFAULT_BENCHMARK)
    data["name"] = "bursty-prefix"
    data["workloads"] = [dict(data["workloads"][0], options={"num_requests": num_requests})]
    data["seeds"] = list(seeds)
    return benchmark_from_dict(data, "bursty-prefix benchmark")


def main(num_requests: int = 2000) -> dict[str, dict]:
    """Score both candidates; print their fitness and the better one's feedback."""
    evaluator = Evaluator("scorer", bursty_prefix_benchmark(num_requests), timeout_s=120)
    baseline, better = evaluator.evaluate_many([LEAST_LOADED, PREFIX_AND_LOAD])
    print(f"least-loaded (starting point) fitness: {baseline['fitness']:.4f}")
    print(f"prefix-and-load candidate     fitness: {better['fitness']:.4f}")
    print(better["feedback"])
    return {"least-loaded": baseline, "prefix-and-load": better}


if __name__ == "__main__":
    main()
