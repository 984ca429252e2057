"""Observation quality (issue 30) against a real vLLM server (CPU build, tiny random model).

The bursty delivery path is made deterministic: a loopback proxy written here (aiohttp, on
127.0.0.1) forwards each POST to vLLM and, for a streamed (``text/event-stream``) answer,
reads the whole upstream body before writing it downstream in one write, as an SSE-buffering
gateway does. Non-streamed answers pass as they are. Through the proxy ``blis observe`` must
flag every streamed request as a burst; straight to the server the same workload must flag
none (the control: no false alarm). ``blis calibrate`` of the proxied trace must say so, and
``blis fit`` must refuse TTFT and ITL (every request is flagged for them), fit E2E alone, and
report a search that did not improve its start as not fitted (exit 3).

The control cannot be clean on a machine that starves the client: observe's own event loop
then runs tens of ms late and reads whole streams at once, which it rightly flags. The control
therefore always asserts that no request read on time is a burst, and is skipped, with the
figures, when bursts were raised on requests the client read late (observed here with other
jobs on the 2 cores: 13 of 24, each with 25-56 ms of measured client lag).

Marker ``realserver``: run with ``python -m pytest -m realserver``. Skipped with the reason
when vLLM cannot be installed or started. One server and one proxy serve the module; each
trace is observed once. Figures are printed (``-s`` shows them).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _cli import invoke

from blis_fast.observe.quality import CLIENT_LATE_US, MIN_CHUNKS
from blis_fast.testing.foreign_cpu import ForeignCpu
from blis_fast.testing.vllm_server import MODEL_NAME, VllmServer, VllmUnavailable

pytestmark = pytest.mark.realserver

ROOT = Path(__file__).resolve().parents[1]
BURST_LINE = ("requests arrived in one burst: TTFT and ITL of these measure the delivery path, "
              "not the server")
NUM_REQUESTS = 24
REPLAY_MODEL = "meta-llama/llama-3.1-8b-instruct"
DIRECT_ATTEMPTS = 3
"""The control (straight to the server) is observed again, up to this many times in all, while
it raises burst flags (a client starved of CPU reads whole streams at once)."""


# ---- the buffering proxy --------------------------------------------------------------------
class BufferingProxy:
    """An aiohttp server on its own thread and event loop that forwards every POST to
    ``upstream`` and delivers each streamed answer whole (one write after the upstream's last
    byte); counts the answers it buffered and the ones it passed as they were."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.buffered = 0
        self.passed = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner = None
        self._session = None

    async def _forward(self, request):
        from aiohttp import web

        body = await request.read()
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "authorization", "accept")}
        async with self._session.post(self.upstream + request.path_qs, data=body,
                                      headers=headers) as up:
            whole = await up.read()  # the whole stream, however long it took upstream
            ctype = up.headers.get("Content-Type", "application/json")
            if ctype.startswith("text/event-stream"):
                self.buffered += 1
                resp = web.StreamResponse(status=up.status, headers={"Content-Type": ctype})
                resp.content_length = len(whole)
                await resp.prepare(request)
                await resp.write(whole)  # one write: every chunk reaches the client at once
                await resp.write_eof()
                return resp
            self.passed += 1
            return web.Response(status=up.status, body=whole, headers={"Content-Type": ctype})

    async def _start(self) -> int:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    def start(self) -> BufferingProxy:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


# ---- one server, one proxy, two observations -------------------------------------------------
def _observe(url: str, tmp: Path) -> dict:
    """``blis observe`` in a child process (the proxy's thread then shares no interpreter with
    the client): 24 streamed requests at 4/s, 16 output tokens on average."""
    tmp.mkdir()
    args = [sys.executable, "-m", "blis_fast.cli", "observe", "--server-url", url,
            "--model", MODEL_NAME, "--rate", "4", "--num-requests", str(NUM_REQUESTS),
            "--seed", "7", "--prompt-tokens", "40", "--prompt-tokens-stdev", "10",
            "--prompt-tokens-min", "10", "--prompt-tokens-max", "80", "--output-tokens", "16",
            "--output-tokens-stdev", "4", "--output-tokens-min", "4", "--output-tokens-max",
            "24", "--record-itl", "--quality-columns", "--timeout", "120",
            "--trace-header", str(tmp / "t.yaml"), "--trace-data", str(tmp / "t.csv"),
            "--output-dir", str(tmp / "out")]
    foreign = ForeignCpu()
    foreign.start()
    t0 = time.perf_counter()
    res = subprocess.run(args, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    took = time.perf_counter() - t0
    others = foreign.share()
    rows = []
    if (tmp / "t.csv").exists():
        rows = list(csv.DictReader(io.StringIO((tmp / "t.csv").read_text())))
    return {"code": res.returncode, "stderr": res.stderr, "rows": rows, "dir": tmp,
            "header": str(tmp / "t.yaml"), "data": str(tmp / "t.csv"),
            "itl": str(tmp / "t.itl.csv"), "took": took, "others": others}


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> Iterator[dict[str, dict]]:
    """The same workload observed through the buffering proxy and straight to the server."""
    t0 = time.perf_counter()
    server = VllmServer()
    try:
        server.start()
    except VllmUnavailable as exc:
        pytest.skip(f"real vLLM server unavailable: {exc}")
    print(f"\nvLLM ready in {time.perf_counter() - t0:.1f} s")
    proxy = BufferingProxy(server.url)
    tmp = tmp_path_factory.mktemp("quality-real")
    try:
        proxy.start()
        out = {"proxied": _observe(proxy.url, tmp / "proxied")}
        for attempt in range(1, DIRECT_ATTEMPTS + 1):
            direct = _observe(server.url, tmp / f"direct{attempt}")
            direct["attempts"] = attempt
            out["direct"] = direct
            if direct["code"] != 0 or not _bursts(direct["rows"]):
                break
            print(f"direct attempt {attempt}: {_bursts(direct['rows'])} bursts, observed again")
        out["proxied"]["buffered"], out["proxied"]["passed"] = proxy.buffered, proxy.passed
    finally:
        try:
            proxy.stop()
        finally:
            server.stop()
    for name, o in out.items():
        bursts = sum(r.get("burst") == "true" for r in o["rows"])
        lag = max((int(r.get("client_lag_us") or -1) for r in o["rows"]), default=-1)
        print(f"{name}: exit {o['code']}, {len(o['rows'])} requests in {o['took']:.1f} s, "
              f"{bursts} flagged as bursts, max client lag {lag / 1000:.1f} ms, other "
              f"processes {o['others']:.2f} cores")
    yield out


def _bursts(rows: list[dict]) -> int:
    return sum(r["burst"] == "true" for r in rows)


def test_observe_through_the_buffering_proxy_flags_every_stream(observed):
    o = observed["proxied"]
    assert o["code"] == 0, o["stderr"][-2000:]
    rows = o["rows"]
    assert len(rows) == NUM_REQUESTS and all(r["status"] == "ok" for r in rows)
    assert all(r["streaming"] == "true" for r in rows)
    # every streamed answer went through the proxy's one write (plus the token-ratio request)
    assert o["buffered"] >= NUM_REQUESTS
    for r in rows:  # the whole stream in one read: first chunk = last chunk, enough chunks to
        # judge (not one per token: a busy vLLM frontend merges tokens into fewer chunks)
        assert r["first_chunk_time_us"] == r["last_chunk_time_us"], r
        assert int(r["num_chunks"]) >= MIN_CHUNKS
    assert f"{NUM_REQUESTS} of {NUM_REQUESTS} {BURST_LINE}" in o["stderr"]
    assert _bursts(rows) == NUM_REQUESTS
    assert all(r["not_streamed"] == "false" for r in rows)
    table = pq.read_table(o["dir"] / "out" / "observed_requests.parquet")
    assert table.column("burst").to_pylist() == [True] * NUM_REQUESTS
    assert table.column("not_streamed").to_pylist() == [False] * NUM_REQUESTS


def test_observe_straight_to_the_server_flags_none(observed):
    o = observed["direct"]
    assert o["code"] == 0, o["stderr"][-2000:]
    rows = o["rows"]
    assert len(rows) == NUM_REQUESTS and all(r["status"] == "ok" for r in rows)
    # no false alarm: a request the client read on time is never called a burst
    late = [r for r in rows if r["client_late"] == "true"]
    wrong = [r["request_id"] for r in rows if r["burst"] == "true" and r["client_late"] == "false"]
    assert not wrong, f"bursts on requests read on time: {wrong}\n{o['stderr']}"
    bursts = _bursts(rows)
    if bursts:  # each of them read by a late client: its own lag, measured, explains them
        lag = max(int(r["client_lag_us"]) for r in late)
        pytest.skip(f"the machine is too busy for the no-false-alarm control (last of "
                    f"{o['attempts']} attempts): {len(late)} of "
                    f"{NUM_REQUESTS} requests were in flight while observe's own event loop ran "
                    f"over {CLIENT_LATE_US / 1000:g} ms late (max {lag / 1000:.1f} ms; other "
                    f"processes {o['others']:.2f} cores), {bursts} of them read in one burst; "
                    f"the {NUM_REQUESTS - len(late)} read on time raised no burst flag")
    assert bursts == 0, o["stderr"]
    assert "burst" not in o["stderr"] and "not streamed" not in o["stderr"]
    # a real stream: the chunks span most of the answer
    assert all(int(r["last_chunk_time_us"]) > int(r["first_chunk_time_us"]) for r in rows)
    table = pq.read_table(o["dir"] / "out" / "observed_requests.parquet")
    assert table.column("burst").to_pylist() == [False] * NUM_REQUESTS


# ---- calibrate and fit of the proxied trace ----------------------------------------------------
@pytest.fixture(scope="module")
def proxied(observed) -> dict:
    o = observed["proxied"]
    if o["code"] != 0 or len(o["rows"]) != NUM_REQUESTS:
        pytest.fail(f"the proxied observation failed: {o['stderr'][-2000:]}")
    return o


def test_calibrate_of_the_proxied_trace_says_what_the_bursts_change(proxied, tmp_path):
    sim = tmp_path / "sim.json"
    replay = invoke(["replay", "--trace-header", proxied["header"], "--trace-data",
                     proxied["data"], "--model", REPLAY_MODEL, "--results-path", str(sim)])
    assert replay.code == 0, replay.stderr
    base = ["calibrate", "--trace-header", proxied["header"], "--trace-data", proxied["data"],
            "--itl-data", proxied["itl"], "--sim-results", str(sim)]
    graded = invoke(base + ["--report", str(tmp_path / "r.json")])
    assert graded.code == 0, graded.stderr
    n = NUM_REQUESTS
    assert f"calibrate: {n} of {n} {BURST_LINE}" in graded.stderr
    line = next(ln for ln in graded.stderr.splitlines() if "graded TTFT and ITL" in ln)
    assert "on every pair, flagged ones included" in line
    assert "without them: TTFT: no pairs left" in line
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["metrics"]["ttft"]["count"] == n  # the reference's grading: every pair
    print(f"\ncalibrate: {line}")
    # graded without the flagged requests, no TTFT pair is left: refused, nothing written
    refused = invoke(base + ["--report", str(tmp_path / "x.json"), "--exclude-flagged"])
    assert refused.code == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"only 0 of {n} TTFT pairs" in refused.stderr
    assert not (tmp_path / "x.json").exists()


def _fit(proxied: dict, tmp: Path, *extra: str):
    return invoke(["fit", "--trace-header", proxied["header"], "--trace-data", proxied["data"],
                   "--model", REPLAY_MODEL, "--report", str(tmp / "r.json"),
                   "--out-coeffs", str(tmp / "c.json"), *extra])


def test_fit_of_the_proxied_trace_refuses_ttft_and_itl(proxied, tmp_path):
    n = NUM_REQUESTS
    ttft = _fit(proxied, tmp_path, "--max-evaluations", "20")
    assert ttft.code == 2 and ttft.stderr.count("\n") == 1, ttft.stderr
    assert f"only 0 request(s) usable for TTFT once the flagged ones are left out ({n} burst" \
        in ttft.stderr and "--weight-ttft 0" in ttft.stderr
    itl = _fit(proxied, tmp_path, "--itl-data", proxied["itl"], "--weight-ttft", "0",
               "--max-evaluations", "20")
    assert itl.code == 2 and itl.stderr.count("\n") == 1, itl.stderr
    assert "only 0 request(s) usable for ITL" in itl.stderr and "--weight-itl 0" in itl.stderr
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "c.json").exists()


def test_fit_of_the_proxied_trace_fits_e2e_alone(proxied, tmp_path):
    # the symmetric loss: MAPE settles on the server's fast periods (in the first run here its
    # fit landed 9 % under the mean E2E, 6 points inside the verdict's tolerance)
    n = NUM_REQUESTS
    res = _fit(proxied, tmp_path, "--itl-data", proxied["itl"], "--weight-ttft", "0",
               "--weight-itl", "0", "--loss", "rms-log", "--max-evaluations", "200")
    print(f"\n{res.stderr.strip()}")
    assert res.code == 0, res.stderr
    assert "fit: converged: mean E2E" in res.stderr
    assert f"{n} request(s) left out of TTFT and ITL, E2E kept: {n} delivered in one burst" \
        in res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["traces"][0]["left_out_of_ttft_itl"]["burst"] == list(range(n))
    assert report["verdict"]["result"] == "converged"
    assert report["verdict"]["means"]["e2e"]["weighted"]
    assert report["traces"][0]["calibration"]["metrics"]["e2e"]["count"] == n


def test_a_fit_that_did_not_improve_its_start_is_reported_not_fitted(proxied, tmp_path):
    # one evaluation: the search never moves off its start, so the loss cannot improve
    res = _fit(proxied, tmp_path, "--weight-ttft", "0", "--max-evaluations", "1")
    assert res.code == 3, res.stderr
    assert "fit: did not fit: mean E2E" in res.stderr and "(NOT improved)" in res.stderr
    assert "converged" not in res.stderr
    verdict = json.loads((tmp_path / "r.json").read_text())["verdict"]
    assert verdict["result"] == "did not fit" and not verdict["loss_improved"]
    assert json.loads((tmp_path / "c.json").read_text())["latency_model"] == "blackbox"
