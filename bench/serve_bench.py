"""Benchmark ``blis serve`` under load (issue 33, "Load"): N concurrent streaming requests at
``--speed 1``, the server and the client pinned to different cores (``taskset``).

The server is a ``blis serve`` process (qwen3-14b, H100, roofline; four instances by
default) pinned to one core; the client, an aiohttp loop in this process pinned to the other,
sends N streaming completions whose arrivals are spread over ``--spread`` seconds, reads every
chunk, and records when each request's first and last chunk arrived. Then the server is
stopped with SIGINT and writes its trace: the simulated TTFT and E2E of every request (the
instants the server aimed at). The **pacing error** of a request is what the client measured
minus the simulated figure (divided by the speed), for the first and for the last token. Also
reported: requests completed, the server's peak resident memory (VmHWM), its CPU seconds
during the run (per simulated second and per token: the figure of merit when the machine is
busy) and the machine's load average before the run (the cores are pinned, not reserved:
other work on them counts). Writes ``bench/serve_results.json`` (one entry per N).

Usage::

    python bench/serve_bench.py [--streams 500 1000] [--spread 1.0] [--speed 1]
        [--profile server.prof] [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

BENCH_DIR = Path(__file__).resolve().parent
MODEL = "qwen/qwen3-14b"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _start_server(prefix: str, speed: float, instances: int, core: str,
                  profile: str | None = None) -> tuple:
    python = [sys.executable] + ([str(BENCH_DIR / "_profiled.py"), profile] if profile
                                 else ["-m", "blis_fast.cli"])
    cmd = ["taskset", "-c", core, *python, "serve",
           "--model", MODEL, "--num-instances", str(instances), "--port", "0",
           "--speed", str(speed), "--trace-output", prefix, "--log", "error"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    while True:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("blis serve ended before listening")
        if "listening on " in line:
            return proc, line.split("listening on ")[1].split(" ")[0]


async def _one(session: aiohttp.ClientSession, base: str, prompt_words: int,
               max_tokens: int) -> tuple[float, float, float, int]:
    sent = time.monotonic()
    first = last = None
    chunks = 0
    async with session.post(base + "/v1/completions", json={
            "model": MODEL, "prompt": "word " * prompt_words, "max_tokens": max_tokens,
            "stream": True}) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {"):
                now = time.monotonic()
                first = now if first is None else first
                last = now
                chunks += 1
    return sent, first - sent, last - sent, chunks


async def _client(base: str, n: int, spread: float) -> list:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = time.monotonic()
        tasks = []
        for k in range(n):
            await asyncio.sleep(max(0.0, start + spread * k / n - time.monotonic()))
            words = 100 + (k * 37) % 300
            tasks.append(asyncio.ensure_future(_one(session, base, words, 50 + (k * 13) % 150)))
        return await asyncio.gather(*tasks)


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(n: int, spread: float, speed: float, instances: int,
             profile: str | None = None) -> dict:
    """One benchmark of ``n`` streams; returns its figures."""
    load_before = os.getloadavg()[0]  # other work on this 2-core machine skews the figures
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "served")
        proc, base = _start_server(prefix, speed, instances, "0", profile)
        try:
            os.sched_setaffinity(0, {1})
            cpu = _cpu_s(proc.pid)
            wall = time.monotonic()
            results = asyncio.run(_client(base, n, spread))
            wall = time.monotonic() - wall
            cpu = _cpu_s(proc.pid) - cpu
            rss = _peak_rss_mb(proc.pid)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
        with open(prefix + ".csv") as fh:
            rows = list(csv.DictReader(fh))
    ttft_err, e2e_err = [], []
    for row, (_, ttft, e2e, _) in zip(rows, results, strict=True):
        arrival = int(row["arrival_time_us"])
        sim_ttft = (int(row["first_chunk_time_us"]) - arrival) / 1e6 / speed
        sim_e2e = (int(row["last_chunk_time_us"]) - arrival) / 1e6 / speed
        ttft_err.append((ttft - sim_ttft) * 1000)
        e2e_err.append((e2e - sim_e2e) * 1000)
    completed = sum(1 for row in rows if row["status"] == "ok")
    tokens = sum(chunks for *_, chunks in results)
    sim_s = wall * speed
    return {
        "load_avg_1m_before": load_before, "streams": n, "spread_s": spread, "speed": speed, "instances": instances,
        "completed": completed, "wall_s": round(wall, 2),
        "server_peak_rss_mb": round(rss, 1),
        # the figure of merit on a busy machine: the server's CPU for the run's work
        "server_cpu_s": round(cpu, 2), "tokens": tokens,
        "server_cpu_s_per_sim_s": round(cpu / sim_s, 3),
        "server_cpu_us_per_token": round(cpu / max(tokens, 1) * 1e6, 1),
        "ttft_pacing_error_ms": {"p50": round(statistics.median(ttft_err), 2),
                                 "p99": round(_pct(ttft_err, 99), 2),
                                 "max": round(max(ttft_err), 2)},
        "last_token_pacing_error_ms": {"p50": round(statistics.median(e2e_err), 2),
                                       "p99": round(_pct(e2e_err, 99), 2),
                                       "max": round(max(e2e_err), 2)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[500, 1000])
    parser.add_argument("--spread", type=float, default=1.0)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--profile", metavar="FILE",
                        help="run the server under cProfile, stats to FILE (one N only)")
    parser.add_argument("--no-save", action="store_true",
                        help="print the figures without rewriting serve_results.json")
    args = parser.parse_args()
    out = [run_once(n, args.spread, args.speed, args.instances, args.profile)
           for n in args.streams]
    for entry in out:
        print(json.dumps(entry))
    if not args.no_save:
        (BENCH_DIR / "serve_results.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
