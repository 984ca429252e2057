"""Benchmark ``blis serve`` under load (issue 33, "Load"): N concurrent streaming requests at
``--speed 1``, the server and the client pinned to different cores (``taskset``).

The server is a ``blis serve`` process (qwen3-14b, H100, roofline; four instances by
default) pinned to one core; the client, an asyncio loop in this process pinned to the other,
sends N streaming completions whose arrivals are spread over ``--spread`` seconds, reads every
chunk, and records when each request's first and last chunk arrived: by default on bare
connections, each received buffer timed as it arrives (``--client raw``), or through aiohttp's
line reader (``--client aiohttp``). The whole client process costs 10.4 µs (raw) or 14.7 µs
(aiohttp) of CPU per chunk at 500 streams (sending included): a chunk that arrives with a
hundred others waits for those before it either way. Then the server is
stopped with SIGINT and writes its trace: the simulated TTFT and E2E of every request (the
instants the server aimed at). The **pacing error** of a request is what the client measured
minus the simulated figure (divided by the speed), for the first and for the last token. Also
reported: requests completed, the server's peak resident memory (VmHWM), its CPU seconds
during the run (per simulated second and per token: the figure of merit when the machine is
busy) and the machine's load average before the run (the cores are pinned, not reserved:
other work on them counts). Writes ``bench/serve_results.json`` (one entry per N).

Usage::

    python bench/serve_bench.py [--streams 500 1000] [--spread 1.0] [--speed 1]
        [--client raw|aiohttp] [--server-lag] [--profile server.prof] [--no-save]

``--server-lag`` runs the server under ``bench/_paced.py``: how late after its instant the
time loop handed each token on (the server's share of the pacing error) and the garbage
collector's pauses while serving. The quiet-machine runs of the issue's figures::

    python bench/serve_bench.py --streams 500 --server-lag --no-save   # the 10 ms check
    python bench/serve_bench.py --streams 500 1000                     # serve_results.json
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from blis_fast.testing.serve_child import ServeChild, start_serve, timed_completion

BENCH_DIR = Path(__file__).resolve().parent
MODEL = "qwen/qwen3-14b"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _start_server(prefix: str, speed: float, instances: int, core: str,
                  profile: str | None = None, lags: str | None = None) -> ServeChild:
    python = [sys.executable] + ([str(BENCH_DIR / "_profiled.py"), profile] if profile
                                 else [str(BENCH_DIR / "_paced.py"), lags] if lags
                                 else ["-m", "blis_fast.cli"])
    return start_serve(["--model", MODEL, "--num-instances", str(instances), "--port", "0",
                        "--speed", str(speed), "--trace-output", prefix, "--log", "error"],
                       launcher=["taskset", "-c", core], python=python)


async def _one_raw(base: str, prompt_words: int,
                   max_tokens: int) -> tuple[float, float, float, int]:
    t = await timed_completion(base, {"model": MODEL, "prompt": "word " * prompt_words,
                                      "max_tokens": max_tokens, "stream": True})
    return t.sent, t.first - t.sent, t.last - t.sent, t.events


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


async def _client(base: str, n: int, spread: float, client: str = "raw") -> list:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = time.monotonic()
        tasks = []
        for k in range(n):
            await asyncio.sleep(max(0.0, start + spread * k / n - time.monotonic()))
            words = 100 + (k * 37) % 300
            max_tokens = 50 + (k * 13) % 150
            one = (_one_raw(base, words, max_tokens) if client == "raw"
                   else _one(session, base, words, max_tokens))
            tasks.append(asyncio.ensure_future(one))
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
             profile: str | None = None, client: str = "raw",
             server_lag: bool = False) -> dict:
    """One benchmark of ``n`` streams; returns its figures."""
    load_before = os.getloadavg()[0]  # other work on this 2-core machine skews the figures
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "served")
        lags = os.path.join(tmp, "lags.json") if server_lag else None
        server = _start_server(prefix, speed, instances, "0", profile, lags)
        with server:
            pid = server.proc.pid
            os.sched_setaffinity(0, {1})
            cpu = _cpu_s(pid)
            wall = time.monotonic()
            results = asyncio.run(_client(server.url, n, spread, client))
            wall = time.monotonic() - wall
            cpu = _cpu_s(pid) - cpu
            rss = _peak_rss_mb(pid)
            code, rest = server.interrupt(120)
        if code != 0:
            raise RuntimeError(f"blis serve exited {code}: {rest[-2000:]}")
        with open(prefix + ".csv") as fh:
            rows = list(csv.DictReader(fh))
        if lags is not None:
            with open(lags) as fh:
                timed = json.load(fh)
            handed = [v / 1e3 for v in timed["lags"]]
            pauses = timed["gc"]
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
    extra = {}
    if server_lag:
        extra["server_handoff_lag_ms"] = {"p50": round(statistics.median(handed), 2),
                                          "p99": round(_pct(handed, 99), 2),
                                          "max": round(max(handed), 2)}
        for gen in (0, 1, 2):
            ms = [p / 1e3 for g, p in pauses if g == gen]
            extra[f"server_gc{gen}"] = {"count": len(ms), "total_ms": round(sum(ms), 1),
                                        "max_ms": round(max(ms, default=0.0), 2)}
    return {
        **extra,
        "load_avg_1m_before": load_before, "client": client, "streams": n, "spread_s": spread, "speed": speed, "instances": instances,
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
    parser.add_argument("--client", choices=("raw", "aiohttp"), default="raw",
                        help="the load generator: bare asyncio connections timed as each "
                             "buffer arrives, or aiohttp's line reader")
    parser.add_argument("--server-lag", action="store_true",
                        help="time the server's hand-off of every token (bench/_paced.py): "
                             "how late after its instant the time loop passed it on")
    parser.add_argument("--no-save", action="store_true",
                        help="print the figures without rewriting serve_results.json")
    args = parser.parse_args()
    out = [run_once(n, args.spread, args.speed, args.instances, args.profile, args.client,
                    args.server_lag)
           for n in args.streams]
    for entry in out:
        print(json.dumps(entry))
    if not args.no_save:
        (BENCH_DIR / "serve_results.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
