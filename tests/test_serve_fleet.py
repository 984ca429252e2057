"""``blis serve`` over the real ``LiveSimulation``: a router outside it on per-instance ports
(issue 33, "Per-instance"), and a client that goes away mid-stream ("Faults").

A test router of a few lines scrapes each instance's ``/metrics`` (vLLM's
``num_requests_running`` + ``num_requests_waiting``), sends each request to the least-loaded
instance (lowest index on a tie) and waits until the instance has it. The fleet is the real
``LiveSimulation`` (qwen3-14b on H100, roofline, two instances). ``blis replay`` of the served
trace with ``--routing-policy least-loaded`` (the same arrivals, the simulator's own router)
must give every request the same TTFT and E2E, to the microsecond: the arrivals are spaced
so that the router only ever breaks a tie between two idle instances (the reference breaks
ties at random; between idle twins the choice cannot change a timing). What the client
measured on the wall clock can only be later than the simulated TTFT (a token is never sent
early); how much later is pacing and HTTP overhead on this machine.
"""

from __future__ import annotations

import asyncio
import csv
import json
import statistics
import time

import aiohttp
from _cli import invoke
from prometheus_client.parser import text_string_to_metric_families

from blis_fast.options import build_options
from blis_fast.serve.app import ServeConfig, start_in_thread
from blis_fast.serve.cli import warm_up, write_served_trace
from blis_fast.serve.live import LiveSimulation

MODEL = "qwen/qwen3-14b"
FLAGS = {"model": MODEL, "num_instances": "2"}
SPEED = 2.0
PLAN = [  # (arrival in simulated ms, prompt words, max_tokens); alone on an instance these
    (0, 400, 40),      # take 243, 2320, 181, 173, 1743, 58 and 288 ms, one request at a time
    (50, 100, 400),    # per instance: every routing decision but the first and the last (both
    (500, 300, 30),    # instances idle then) has 200 ms or more between the arrival and the
    (900, 50, 30),     # end of a request that decides it, more than a scrape's delay
    (1300, 200, 300),
    (2650, 100, 10),
    (3300, 100, 50),
]


async def _load(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(base + "/metrics") as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")
               for s in f.samples)


async def _stream(session: aiohttp.ClientSession, base: str, words: int, mt: int) -> float:
    sent = time.monotonic()
    async with session.post(base + "/v1/completions", json={
            "model": MODEL, "prompt": "abc " * words, "max_tokens": mt, "stream": True}) as r:
        first = None
        async for line in r.content:
            if first is None and line.startswith(b"data: "):
                first = time.monotonic() - sent
        return first


async def _route(sim: LiveSimulation, ports: list[int]) -> tuple[list[int], list[float]]:
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    async with aiohttp.ClientSession() as session:
        start, streams, chosen = time.monotonic(), [], []
        for at_ms, words, mt in PLAN:
            await asyncio.sleep(max(0.0, start + at_ms / 1000 / SPEED - time.monotonic()))
            loads = [await _load(session, b) for b in bases]
            target = min(range(len(bases)), key=lambda i: (loads[i], i))
            chosen.append(target)
            before = len(sim._rows)
            streams.append(asyncio.ensure_future(_stream(session, bases[target], words, mt)))
            while len(sim._rows) == before:  # the instance has it: the next scrape sees it
                await asyncio.sleep(0.0005)
        return chosen, await asyncio.gather(*streams)


def test_scraping_router_matches_blis_least_loaded(tmp_path):
    def make() -> LiveSimulation:
        return LiveSimulation(build_options(FLAGS), external_routing=True)

    warm_up(make, True)
    sim = make()
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=SPEED, external_routing=True),
                          instance_ports=[0, 0])
    try:
        chosen, client_ttft_s = asyncio.run(_route(sim, srv.ports[1:]))
    finally:
        srv.stop()
    assert chosen == [0, 1, 0, 0, 0, 1, 0]  # the long request keeps instance 1 busy
    prefix = str(tmp_path / "served")
    write_served_trace(sim, prefix)
    results = tmp_path / "replay.json"
    res = invoke(["replay", "--model", MODEL, "--num-instances", "2", "--routing-policy",
                  "least-loaded", "--trace-header", prefix + ".yaml", "--trace-data",
                  prefix + ".csv", "--results-path", str(results), "--horizon", "1000000000"])
    assert res.code == 0, res.stderr
    replayed = {r["request_id"]: r for r in json.loads(results.read_text())}
    with open(prefix + ".csv") as fh:
        served = list(csv.DictReader(fh))
    assert len(served) == len(PLAN) == len(replayed)
    lags = []
    for row, measured in zip(served, client_ttft_s, strict=True):
        k, arrival = int(row["request_id"]), int(row["arrival_time_us"])
        ttft_us = int(row["first_chunk_time_us"]) - arrival
        assert ttft_us == replayed[k]["ttft_us"]
        assert int(row["last_chunk_time_us"]) - arrival == replayed[k]["e2e_us"]
        assert measured >= ttft_us / 1e6 / SPEED  # never early
        lags.append(measured - ttft_us / 1e6 / SPEED)
    assert statistics.median(lags) < 0.25  # wall seconds of pacing + HTTP, generous


def test_disconnect_mid_stream_frees_the_kv_cache():
    sim = LiveSimulation(build_options({"model": MODEL}))
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=20.0))
    base = f"http://127.0.0.1:{srv.port}"

    async def scenario() -> tuple[float, float]:
        async with aiohttp.ClientSession() as session:
            resp = await session.post(base + "/v1/completions", json={
                "model": MODEL, "prompt": "abc " * 2000, "max_tokens": 2000, "stream": True})
            got = 0
            async for line in resp.content:
                got += line.startswith(b"data: ")
                if got == 3:
                    break
            async with session.get(base + "/metrics") as m:
                during = _series(await m.text())
            resp.close()  # the client goes away mid-stream
            for _ in range(500):
                async with session.get(base + "/metrics") as m:
                    after = _series(await m.text())
                if after["vllm:num_requests_running"] == 0:
                    break
                await asyncio.sleep(0.01)
            return during, after

    try:
        during, after = asyncio.run(scenario())
    finally:
        srv.stop()
    assert during["vllm:num_requests_running"] == 1 and during["vllm:kv_cache_usage_perc"] > 0
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:request_success_total/length"] == 0
    assert after["vllm:request_success_total/abort"] == 1  # vLLM counts an abort so too
    assert sim.status(0) == "aborted"


def _series(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name + (f"/{s.labels['finished_reason']}"
                             if "finished_reason" in s.labels else "")
            out[name] = out.get(name, 0.0) + s.value
    return out
