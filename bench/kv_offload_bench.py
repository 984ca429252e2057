"""KV offload chain cost benchmark (issue 32): the same run without offload, with a 20 GB CPU
tier alone, and with the CPU tier plus three secondary tiers (nvme_gen4, sata_ssd, s3).
Target: the 4-tier run costs at most 1.5x the CPU-tier run's CPU time.

Each case is one ``blis run`` process (``run_bench.run_blis``: CPU time = user + system of the
process, wall time around it, peak RSS from ``os.wait4``). One untimed 200-request warm-up run
per case fills the kernel cache; then the cases run interleaved ``--repeat`` times (default 3)
and the medians are compared, with the 1-minute load average recorded before each round (on a
shared machine the figures move with it). Writes ``bench/kv_offload_results.json``.

Usage::

    python bench/kv_offload_bench.py                   # 100k requests, 3 rounds
    python bench/kv_offload_bench.py --requests 20000 --repeat 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_bench import find_blis, run_blis  # noqa: E402

COMMON = ["--model", "meta-llama/llama-3.1-8b-instruct", "--num-instances", "16",
          "--rate", "400", "--log", "error"]
CPU_TIER = "kv_offload:\n  cpu_bytes_to_use: 20000000000\n"
TIERS = CPU_TIER + "  secondary_tiers:\n" + "".join(
    f"    - {{type: fs, root_dir: /mnt/{name}, direct_io: true, device_class: {name}}}\n"
    for name in ("nvme_gen4", "sata_ssd", "s3"))
TARGET = 1.5


def main(argv: list[str] | None = None) -> int:
    """Run the three cases and write their medians and the 4-tier / CPU-tier ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    blis = find_blis()
    with tempfile.TemporaryDirectory() as tmp:
        cpu_cfg, tiers_cfg = Path(tmp, "cpu.yaml"), Path(tmp, "tiers.yaml")
        cpu_cfg.write_text(CPU_TIER)
        tiers_cfg.write_text(TIERS)
        cases = {"no offload": [],
                 "CPU tier": ["--kv-offload-config", str(cpu_cfg)],
                 "CPU + 3 secondary tiers": ["--kv-offload-config", str(tiers_cfg)]}
        for extra in cases.values():  # warm-up: kernels compiled or loaded
            run_blis(blis, [*COMMON, "--num-requests", "200", *extra])
        runs: dict[str, list] = {name: [] for name in cases}
        loads = []
        for _ in range(args.repeat):
            loads.append(os.getloadavg()[0])
            for name, extra in cases.items():
                r = run_blis(blis, [*COMMON, "--num-requests", str(args.requests), *extra])
                if r.exit_code != 0:
                    print(f"{name}: exit {r.exit_code}: {r.stderr[-500:]}", file=sys.stderr)
                    return 1
                runs[name].append(r)
    results = {name: {"cpu_s": statistics.median(r.cpu_s for r in rs),
                      "wall_s": statistics.median(r.wall_s for r in rs),
                      "peak_rss_mb": statistics.median(r.peak_rss_bytes for r in rs) / 1e6}
               for name, rs in runs.items()}
    ratio = results["CPU + 3 secondary tiers"]["cpu_s"] / results["CPU tier"]["cpu_s"]
    for name, r in results.items():
        print(f"{name:24s} cpu {r['cpu_s']:8.2f} s  wall {r['wall_s']:8.2f} s "
              f"{r['peak_rss_mb']:9.1f} MB")
    print(f"4 tiers / CPU tier: {ratio:.2f}x CPU time (target <= {TARGET}x); "
          f"load {min(loads):.2f}-{max(loads):.2f}")
    out = Path(__file__).with_name("kv_offload_results.json")
    out.write_text(json.dumps({"requests": args.requests, "repeat": args.repeat,
                               "load_1min": loads, "results": results,
                               "tiers_over_cpu_tier": ratio,
                               "meets_target": ratio <= TARGET}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
