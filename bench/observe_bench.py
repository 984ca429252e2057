"""Pacing and completeness of ``blis observe`` against the loopback recording server.

    PYTHONPATH=. python bench/observe_bench.py [--requests 500] [--rate 200] [--streaming]

Runs one observation in-process (the recording server in a child process) and prints JSON:
rows recorded vs requests the server received, and the pacing error of every send
(``send_time_us - (dispatch start + planned arrival)``) as p50/p99/max in milliseconds.
``bench/test_observe_bench.py`` (marker ``bench``) asserts the targets: no row lost,
p99 < 5 ms. Measured on the 2-core VM (load average ~1.8): 500/500 rows, pacing error p50
0.12-0.15 ms, p99 0.22-0.31 ms (a bare asyncio sleep loop: p99 1.1 ms): a send sleeps until
2 ms before its time and then yields until it. With other jobs loading the machine (~5) the
p99 is the machine's scheduling delay (5-9 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

P99_TARGET_MS = 5.0


def sleep_floor(n: int = 500, rate: float = 200.0) -> dict:
    """Pacing error of a bare asyncio sleep loop at the same rate: what the machine's scheduler
    alone costs (under load from other processes this floor rises, and observe's with it)."""
    import asyncio

    async def loop() -> np.ndarray:
        t0 = time.perf_counter()
        errs = np.empty(n)
        for i in range(n):
            target = t0 + (i + 1) / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            errs[i] = (time.perf_counter() - target) * 1e3
        return errs

    e = asyncio.run(loop())
    return {"p50": round(float(np.percentile(e, 50)), 3),
            "p99": round(float(np.percentile(e, 99)), 3)}


def measure(requests: int = 500, rate: float = 200.0, streaming: bool = True) -> dict:
    """One observation; returns the figures as a dict."""
    from blis_fast.observe.command import ObserveOptions, run_observe
    from blis_fast.testing.record_server import running_record_server

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "received.jsonl"
        given = frozenset({"rate", "num_requests", "prompt_tokens", "prompt_tokens_stdev",
                           "output_tokens", "output_tokens_stdev", "seed"})
        with running_record_server(log) as url:
            opts = ObserveOptions(
                server_url=url, model="bench", trace_header=f"{tmp}/t.yaml",
                trace_data=f"{tmp}/t.csv", rate=rate, num_requests=requests, seed=1,
                prompt_tokens=64, prompt_tokens_stdev=16, output_tokens=8,
                output_tokens_stdev=2, record_itl=streaming, given=given,
            )
            t0 = time.perf_counter()
            cpu0 = time.process_time()
            res = run_observe(opts)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
        received = len(log.read_text().splitlines()) - 1  # minus the token-ratio request
        obs = res.result.observed
        start = res.result.start_wall_us
        err_ms = np.array([(o.record.send_time_us - (start + o.job.arrival_us)) / 1e3
                           for o in obs])
        rows = len(Path(f"{tmp}/t.csv").read_text().splitlines()) - 1
        ok = sum(o.record.status == "ok" for o in obs)
    return {
        "requests": requests, "rate": rate, "streaming": streaming, "rows": rows,
        "server_received": received, "ok": ok, "wall_s": round(wall, 3),
        "client_cpu_ms_per_request": round(cpu * 1e3 / max(requests, 1), 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "pacing_error_ms": {
            "p50": round(float(np.percentile(err_ms, 50)), 3),
            "p99": round(float(np.percentile(err_ms, 99)), 3),
            "max": round(float(err_ms.max()), 3),
            "min": round(float(err_ms.min()), 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--non-streaming", action="store_true")
    a = ap.parse_args(argv)
    out = measure(a.requests, a.rate, not a.non_streaming)
    out["bare_sleep_floor_ms"] = sleep_floor(a.requests, a.rate)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
