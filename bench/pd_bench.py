"""P/D cost benchmark (issue 14): the same 100,000-request run as 16 ordinary instances and as
8 prefill + 8 decode instances (every request disaggregated). Targets: the P/D run costs at
most 1.3x the wall time and 1.3x the peak RSS of the ordinary one.

Each run is one ``blis run`` process (``run_bench.run_blis``: wall time around the process,
peak RSS from ``os.wait4``); one untimed warm-up run fills the kernel cache, then each case runs
``--repeat`` times (default 3) and the medians are compared. Writes ``bench/pd_results.json``.

Usage::

    python bench/pd_bench.py                  # 100k requests, 3 repeats
    python bench/pd_bench.py --requests 20000 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_bench import find_blis, run_blis  # noqa: E402

COMMON = ["--model", "meta-llama/llama-3.1-8b-instruct", "--num-instances", "16",
          "--rate", "400", "--routing-policy", "least-loaded", "--log", "error"]
PD = ["--prefill-instances", "8", "--decode-instances", "8", "--pd-decider", "always"]
TARGET = 1.3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    blis = find_blis()
    base = [*COMMON, "--num-requests", str(args.requests)]
    cases = {"16 instances": base, "8 prefill + 8 decode": [*base, *PD]}
    run_blis(blis, cases["8 prefill + 8 decode"])  # warm-up: kernels compiled or loaded
    results = {}
    for name, cli in cases.items():
        runs = [run_blis(blis, cli) for _ in range(args.repeat)]
        bad = [r for r in runs if r.exit_code != 0]
        if bad:
            print(f"{name}: exit {bad[0].exit_code}: {bad[0].stderr[-500:]}", file=sys.stderr)
            return 1
        results[name] = {"wall_s": statistics.median(r.wall_s for r in runs),
                         "peak_rss_mb": statistics.median(r.peak_rss_bytes for r in runs) / 1e6}
    base_r, pd_r = results["16 instances"], results["8 prefill + 8 decode"]
    ratios = {"wall": pd_r["wall_s"] / base_r["wall_s"],
              "rss": pd_r["peak_rss_mb"] / base_r["peak_rss_mb"]}
    for name, r in results.items():
        print(f"{name:22s} {r['wall_s']:8.2f} s {r['peak_rss_mb']:9.1f} MB")
    print(f"ratio (P/D / ordinary): wall {ratios['wall']:.2f}x, RSS {ratios['rss']:.2f}x "
          f"(targets <= {TARGET}x)")
    out = Path(__file__).with_name("pd_results.json")
    out.write_text(json.dumps({"requests": args.requests, "repeat": args.repeat,
                               "results": results, "ratios": ratios,
                               "meets_targets": all(v <= TARGET for v in ratios.values())},
                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
