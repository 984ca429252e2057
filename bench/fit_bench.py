"""Benchmark ``blis fit`` on a 200-request observed trace (made by the simulator with known
blackbox coefficients and 3% timing noise, at 12 requests/s). Target: converged in <= 60 s.

Usage::

    python bench/fit_bench.py               # 3 repeats, prints each and the median
    python bench/fit_bench.py --repeat 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from blis_fast.fit.optimize import fit
from blis_fast.fit.problem import load_fit_trace
from blis_fast.testing.synthetic_trace import make_observed_trace

MAX_S = 60.0
MODEL = "meta-llama/llama-3.1-8b-instruct"


def main() -> None:
    """Time whole fits (initial guess, every replay, scoring) in a warm process."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        header, data = make_observed_trace(
            f"{tmp}/busy", alpha=(2000.0, 1.0, 0.0), beta=(6000.0, 8.0, 150.0), rate=12,
            seed=5, noise_seed=2, num_requests=200, prompt_tokens=300, prompt_tokens_stdev=150,
            output_tokens=60, output_tokens_stdev=30)
        trace = load_fit_trace(header, data)
        weights = {"ttft": 1.0, "itl": 1.0, "e2e": 1.0}
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            res = fit([trace], {"model": MODEL}, weights, max_evaluations=2000,
                      time_limit_s=MAX_S, seed=0)
            times.append(time.perf_counter() - started)
            print(f"fit: {len(res.losses)} evaluations, {res.stopped}, loss {res.loss:.4f}, "
                  f"{times[-1]:.2f} s ({times[-1] / len(res.losses) * 1e3:.1f} ms/evaluation)")
    median = statistics.median(times)
    print(f"median {median:.2f} s (target <= {MAX_S:.0f} s, converged), load "
          f"{os.getloadavg()[0]:.2f}")
    if median > MAX_S or res.stopped != "converged":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
