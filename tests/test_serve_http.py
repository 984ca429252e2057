"""``blis serve``'s HTTP side (issue 33): what a client sees.

The server runs in this process (a background thread) over the real ``LiveSimulation``
(qwen3-14b on H100, roofline, max-model-len 256) at ``--speed 50``. The numbers asserted come
from invariants, not from a run: token counts, request counts, and every latency on
``/metrics`` equal to the figures of the trace the simulation writes of what it served (which
``blis replay`` reproduces, ``tests/test_serve_cli.py``). Wall-clock assertions are lower
bounds only (a token is never sent before its simulated instant): an upper bound would fail by
chance on a loaded machine.
"""

from __future__ import annotations

import asyncio
import csv
import json
import random
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from _cli import invoke
from prometheus_client.parser import text_string_to_metric_families

from blis_fast.options import build_options
from blis_fast.serve.app import LiveServer, ServeConfig, estimate_tokens, start_in_thread
from blis_fast.serve.live import LiveSimulation
from blis_fast.serve.metrics import TOKEN_LATENCY_BUCKETS, TTFT_BUCKETS
from blis_fast.testing.serve_child import start_serve

MODEL = "qwen/qwen3-14b"
SPEED = 50.0


def _live(external: bool = False, **flags: str) -> LiveSimulation:
    return LiveSimulation(build_options({"model": MODEL, "log": "error", **flags}),
                          external_routing=external)


@pytest.fixture
def served():
    """One instance, max-model-len 256, at --speed 50; yields (server, sim, base url)."""
    sim = _live(max_model_len="256")
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=SPEED, default_output_tokens=7))
    try:
        yield srv, sim, f"http://127.0.0.1:{srv.port}"
    finally:
        srv.stop()


def _rows(srv, sim: LiveSimulation, tmp_path: Path) -> list[dict]:
    """Stop the server, then the trace rows of what the simulation served."""
    srv.stop()
    header, data = tmp_path / "t.yaml", tmp_path / "t.csv"
    sim.write_trace(str(header), str(data))
    with open(data) as fh:
        return list(csv.DictReader(fh))


def _post(base: str, path: str, body, raw: bool = False) -> tuple[int, bytes]:
    data = body if raw else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _get(base: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(base + path, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _events(raw: bytes) -> list:
    """The SSE events of a response: each ``data:`` line's JSON, ``[DONE]`` as the string."""
    text = raw.decode()
    assert text.endswith("\n\n")
    out = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _metrics(base: str) -> dict:
    status, body = _get(base, "/metrics")
    assert status == 200
    samples: dict = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items()
                                        if k not in ("model_name", "engine"))))
            samples[key] = samples.get(key, 0.0) + s.value
    return samples


def test_stream_completion_sse_format_and_usage(served, tmp_path):
    srv, sim, base = served
    start = time.monotonic()
    status, raw = _post(base, "/v1/completions", {
        "model": MODEL, "prompt": "one two three four five six seven eight", "max_tokens": 5,
        "stream": True, "stream_options": {"include_usage": True}})
    elapsed = time.monotonic() - start
    assert status == 200
    events = _events(raw)
    assert events[-1] == "[DONE]"
    tokens, usage = events[:5], events[5]
    assert [e["object"] for e in tokens] == ["text_completion"] * 5
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 4 + ["length"]
    assert "".join(e["choices"][0]["text"] for e in tokens) == "the simulated fleet answers with"
    assert len({e["id"] for e in events[:-1]}) == 1
    assert usage["choices"] == []
    prompt = estimate_tokens("one two three four five six seven eight")  # 40 chars -> 10
    assert usage["usage"] == {"prompt_tokens": prompt, "completion_tokens": 5,
                              "total_tokens": prompt + 5}
    (row,) = _rows(srv, sim, tmp_path)
    assert (int(row["input_tokens"]), int(row["output_tokens"])) == (prompt, 5)
    e2e_us = int(row["last_chunk_time_us"]) - int(row["arrival_time_us"])
    assert elapsed >= e2e_us / 1e6 / SPEED  # the last token is never sent early


def test_the_time_loop_ends_a_live_stream_with_the_handlers_bytes(monkeypatch):
    """A live stream's last token, usage chunk and [DONE] are written by the time loop at the
    request's end (not after a wake-up of its handler, which then only terminates the
    response); the events are those the handler writes when it streams every token itself."""
    body = {"model": MODEL, "prompt": "one two three", "max_tokens": 40, "stream": True,
            "stream_options": {"include_usage": True}}

    def serve_once() -> list:
        srv = start_in_thread(_live(), ServeConfig(model=MODEL, speed=SPEED))
        try:
            status, raw = _post(f"http://127.0.0.1:{srv.port}", "/v1/completions", body)
        finally:
            srv.stop()
        assert status == 200
        return [e if e == "[DONE]" else {k: v for k, v in e.items() if k not in ("id", "created")}
                for e in _events(raw)]

    ends: list[bool] = []
    real = LiveServer._direct_writer

    def spied(self, *args):
        write = real(self, *args)

        def recorded(n: int, end: bool) -> bool:
            ends.append(end)
            return write(n, end)
        return recorded

    monkeypatch.setattr(LiveServer, "_direct_writer", spied)
    live = serve_once()
    assert ends.count(True) == 1 and ends[-1] is True  # the time loop wrote the end
    monkeypatch.setattr(LiveServer, "_direct_writer", lambda self, *args: None)
    handled = serve_once()
    assert live == handled and len(live) == 40 + 2
    assert live[-2]["usage"]["completion_tokens"] == 40
    assert live[-3]["choices"][0]["finish_reason"] == "length"


def test_stream_chat_role_first_and_no_usage_unless_asked(served):
    _, _, base = served
    status, raw = _post(base, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 3, "stream": True})
    assert status == 200
    events = _events(raw)
    assert events[-1] == "[DONE]" and len(events) == 5  # role, 3 tokens, [DONE]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert [e["choices"][0]["delta"]["content"] for e in events[1:4]] == [
        "the", " simulated", " fleet"]
    assert events[3]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in events[:-1])


def test_whole_answers_and_default_length(served, tmp_path):
    srv, sim, base = served
    status, raw = _post(base, "/v1/completions", {"model": MODEL, "prompt": [1, 2, 3]})
    assert status == 200
    body = json.loads(raw)
    assert body["choices"][0]["finish_reason"] == "stop"  # no max_tokens: the default, 7
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}
    status, raw = _post(base, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": "hi"}], "max_tokens": 2})
    body = json.loads(raw)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "the simulated",
                                             "tool_calls": []}
    # estimate: ceil(8/4) + ceil(2/4) + 4 per message
    assert body["usage"]["prompt_tokens"] == 2 + 1 + 8
    assert [int(r["output_tokens"]) for r in _rows(srv, sim, tmp_path)] == [7, 2]


def test_default_length_drawn_per_request(tmp_path):
    sim = _live()
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=SPEED, default_output_tokens=20,
                                           default_output_stdev=5.0, seed=3))
    base = f"http://127.0.0.1:{srv.port}"
    reasons = [json.loads(_post(base, "/v1/completions", {"model": MODEL, "prompt": "hi"})[1])
               ["choices"][0]["finish_reason"] for _ in range(6)]
    rng = random.Random(3)  # the documented rule: normal(20, 5) per request, rounded, >= 1
    expected = [max(1, round(rng.gauss(20, 5))) for _ in range(6)]
    assert [int(r["output_tokens"]) for r in _rows(srv, sim, tmp_path)] == expected
    assert len(set(expected)) > 1 and reasons == ["stop"] * 6


def test_models_health_ready_version(served):
    _, _, base = served
    status, raw = _get(base, "/v1/models")
    card = json.loads(raw)["data"][0]
    assert status == 200 and card["id"] == MODEL and card["max_model_len"] == 256
    assert _get(base, "/health")[0] == 200
    assert _get(base, "/ready")[0] == 200
    assert json.loads(_get(base, "/version")[1])["version"]


@pytest.mark.parametrize(("path", "body", "status", "err_type", "param", "words"), [
    ("/v1/completions", b"{not json", 400, "Bad Request", None, "JSON decode error"),
    ("/v1/completions", {"model": MODEL}, 400, "Bad Request", "prompt", "Field required"),
    ("/v1/chat/completions", {"model": MODEL}, 400, "Bad Request", "messages",
     "Field required"),
    ("/v1/completions", {"model": "other", "prompt": "x"}, 404, "NotFoundError", "model",
     "The model `other` does not exist."),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 1024}, 400, "BadRequestError",
     "input_tokens", "maximum context length is 256 tokens. However, your request has 256 "
                     "input tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "abcd", "max_tokens": 256}, 400,
     "BadRequestError", "max_tokens", "'max_tokens' or 'max_completion_tokens' is too large: "
                                      "256. This model's maximum context length is 256 tokens "
                                      "and your request has 1 input tokens (256 > 256 - 1)."),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "n": 2}, 400, "BadRequestError", "n",
     "n must be 1"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "stream_options": {}}, 400,
     "BadRequestError", "stream_options", "only be defined when `stream=True`"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 0}, 400,
     "BadRequestError", "max_tokens", "at least 1"),
    ("/v1/completions", {"model": MODEL, "prompt": "a", "min_tokens": 5, "max_tokens": 2}, 400,
     "BadRequestError", "min_tokens", "less than or equal to max_tokens"),
])
def test_errors_as_vllm_gives_them(served, tmp_path, path, body, status, err_type, param,
                                   words):
    srv, sim, base = served
    got, raw = _post(base, path, body, raw=isinstance(body, bytes))
    assert got == status
    err = json.loads(raw)["error"]
    assert err["code"] == status and err["type"] == err_type and err["param"] == param
    assert words in err["message"]
    assert _rows(srv, sim, tmp_path) == []  # a refused request never enters the simulation


def test_admission_rejection_is_429():
    sim = _live(admission_policy="reject-all")
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=SPEED))
    try:
        base = f"http://127.0.0.1:{srv.port}"
        for stream in (False, True):
            status, raw = _post(base, "/v1/completions", {"model": MODEL, "prompt": "abc",
                                                          "max_tokens": 4, "stream": stream})
            err = json.loads(raw)["error"]
            assert status == 429 and err["type"] == "Too Many Requests" and err["code"] == 429
    finally:
        srv.stop()


def test_a_prompt_over_the_kv_cache_is_refused_by_max_model_len():
    sim = _live(total_kv_blocks="25")  # 400 tokens of KV: max-model-len is derived as 400
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=SPEED))
    try:
        status, raw = _post(f"http://127.0.0.1:{srv.port}", "/v1/completions",
                            {"model": MODEL, "prompt": "x" * 1800, "max_tokens": 10})
    finally:
        srv.stop()
    assert status == 400
    assert "maximum context length is 400 tokens" in json.loads(raw)["error"]["message"]


def test_disconnect_mid_stream_cancels_and_frees_kv():
    sim = _live()
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=2.0))  # 200 tokens: ~0.6 s
    base = f"http://127.0.0.1:{srv.port}"

    async def scenario():
        async with aiohttp.ClientSession() as session:
            resp = await session.post(base + "/v1/completions", json={
                "model": MODEL, "prompt": "abcdefgh", "max_tokens": 200, "stream": True})
            got = 0
            async for line in resp.content:
                if line.startswith(b"data: "):
                    got += 1
                if got == 3:
                    break
            resp.close()  # the client goes away mid-stream
            return got

    try:
        assert asyncio.run(scenario()) == 3
        deadline = time.monotonic() + 10
        while sim.status(0) != "aborted" and time.monotonic() < deadline:
            time.sleep(0.01)
        m = _metrics(base)
    finally:
        srv.stop()
    assert sim.status(0) == "aborted"
    assert m[("vllm:num_requests_running", ())] == 0
    assert m[("vllm:kv_cache_usage_perc", ())] == 0
    assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
    assert m[("vllm:generation_tokens_total", ())] < 200


def test_openai_sdk_streams_a_completion_and_a_chat(served):
    openai = pytest.importorskip("openai", reason="the openai SDK is a dev dependency")
    _, _, base = served
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
    chunks = list(client.completions.create(model=MODEL, prompt="hello world", max_tokens=4,
                                            stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert texts == ["the", " simulated", " fleet", " answers"]
    assert chunks[-1].usage.completion_tokens == 4
    chat = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chat) == "the simulated"
    assert chat[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)


def test_metrics_parse_and_count_the_requests_served(served, tmp_path):
    srv, sim, base = served
    lengths = [1, 2, 3, 5]
    for n in lengths:
        assert _post(base, "/v1/completions", {"model": MODEL, "prompt": "abcdefgh",
                                               "max_tokens": n})[0] == 200
    m = _metrics(base)
    rows = _rows(srv, sim, tmp_path)
    ttft = [int(r["first_chunk_time_us"]) - int(r["arrival_time_us"]) for r in rows]
    e2e = [int(r["last_chunk_time_us"]) - int(r["arrival_time_us"]) for r in rows]
    assert m[("vllm:request_success_total", (("finished_reason", "length"),))] == 4
    assert m[("vllm:request_success_total", (("finished_reason", "stop"),))] == 0
    assert m[("vllm:prompt_tokens_total", ())] == 4 * 2
    assert m[("vllm:generation_tokens_total", ())] == sum(lengths)
    assert m[("vllm:time_to_first_token_seconds_count", ())] == 4
    assert m[("vllm:time_to_first_token_seconds_sum", ())] == pytest.approx(sum(ttft) / 1e6)
    assert m[("vllm:inter_token_latency_seconds_count", ())] == sum(lengths) - 4
    assert m[("vllm:time_per_output_token_seconds_count", ())] == sum(lengths) - 4
    assert m[("vllm:e2e_request_latency_seconds_count", ())] == 4
    assert m[("vllm:e2e_request_latency_seconds_sum", ())] == pytest.approx(sum(e2e) / 1e6)
    assert m[("vllm:request_queue_time_seconds_count", ())] == 4
    assert m[("vllm:num_requests_running", ())] == 0
    # vLLM's boundaries, every one of them, cumulative up to the count
    le = [v for (name, labels), v in m.items()
          if name == "vllm:time_to_first_token_seconds_bucket"]
    edges = [dict(labels)["le"] for (name, labels) in m
             if name == "vllm:time_to_first_token_seconds_bucket"]
    assert edges == [*(str(float(b)) for b in TTFT_BUCKETS), "+Inf"]
    assert le == sorted(le) and le[-1] == 4
    assert len(TTFT_BUCKETS) == 22 and len(TOKEN_LATENCY_BUCKETS) == 19


def test_per_instance_ports_route_and_scrape_their_own_instance():
    sim = _live(external=True, num_instances="2")
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=SPEED, external_routing=True),
                          instance_ports=[0, 0])
    try:
        fleet, one = (f"http://127.0.0.1:{p}" for p in (srv.ports[0], srv.ports[2]))
        status, raw = _post(fleet, "/v1/completions", {"model": MODEL, "prompt": "a"})
        assert status == 400 and "instance's port" in json.loads(raw)["error"]["message"]
        assert _post(one, "/v1/completions", {"model": MODEL, "prompt": "a",
                                              "max_tokens": 2})[0] == 200
        text = _get(one, "/metrics")[1].decode()
        families = list(text_string_to_metric_families(text))
        assert {s.labels["engine"] for f in families for s in f.samples} == {"1"}
        whole = text_string_to_metric_families(_get(fleet, "/metrics")[1].decode())
        success = {s.labels["engine"]: s.value for f in whole
                   if f.name == "vllm:request_success" for s in f.samples
                   if s.labels["finished_reason"] == "length"}
        assert success == {"0": 0, "1": 1}  # it ran on instance 1, the port it was sent to
    finally:
        srv.stop()


@pytest.mark.parametrize(("argv", "words"), [
    (["--speed", "0"], "--speed"),
    (["--speed", "nan"], "--speed"),
    (["--port", "70000"], "--port"),
    (["--default-output-tokens", "0"], "--default-output-tokens"),
    (["--default-output-tokens", "5,x"], "--default-output-tokens"),
    (["--default-output-tokens", "5,-1"], "--default-output-tokens"),
    (["--content", "poetry"], "--content"),
    (["--rate", "5"], "--rate"),
    (["--trace-output", "/nonexistent-folder/served"], "--trace-output"),
    (["--max-num-running-reqs", "0"], "--max-num-running-reqs"),
])
def test_bad_flags_one_line_exit_2(argv, words):
    res = invoke(["serve", "--model", "qwen/qwen3-14b", *argv])
    assert res.code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in res.stderr


def test_instance_ports_parsing():
    from blis_fast.errors import BlisConfigError
    from blis_fast.serve.cli import parse_instance_ports

    assert parse_instance_ports("9000", 3) == [9000, 9001, 9002]
    assert parse_instance_ports("0", 2) == [0, 0]
    assert parse_instance_ports("7,9", 2) == [7, 9]
    for text in ("65535", "a,b", "7,7", "70000,1", "1,2,3"):
        with pytest.raises(BlisConfigError, match="--instance-ports"):
            parse_instance_ports(text, 2)


class _FailingSimulation(LiveSimulation):
    """The real simulation, whose clock fails once it has told two tokens."""

    told = 0

    def advance(self, until_us: int):
        if self.told >= 2:
            raise RuntimeError("the kernel reported an internal failure")
        out = super().advance(until_us)
        self.told += sum(len(e.tokens) for e in out)
        return out


def test_a_failing_simulation_ends_the_streams_and_the_server():
    sim = _FailingSimulation(build_options({"model": MODEL, "log": "error"}))
    srv = start_in_thread(sim, ServeConfig(model=MODEL, speed=1.0))  # 50 tokens: ~0.3 s
    base = f"http://127.0.0.1:{srv.port}"
    status, raw = _post(base, "/v1/completions", {"model": MODEL, "prompt": "a",
                                                  "max_tokens": 50, "stream": True})
    srv.thread.join(10)
    srv.stop()
    events = _events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "abort"
    assert "internal failure" in str(srv.server.failure)
    assert not srv.thread.is_alive()


def test_ctrl_c_ends_streams_cleanly_and_writes_the_trace(tmp_path):
    prefix = str(tmp_path / "served")
    with start_serve(["--model", MODEL, "--log", "error", "--port", "0", "--trace-output",
                      prefix]) as server:

        async def scenario():
            async with aiohttp.ClientSession() as session:
                resp = await session.post(server.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "a", "max_tokens": 1000, "stream": True})
                lines = []
                async for raw in resp.content:
                    if not raw.strip():
                        continue
                    lines.append(raw.decode().strip())
                    if len(lines) == 2:
                        server.proc.send_signal(signal.SIGINT)  # Ctrl-C, a stream in flight
                return lines

        lines = asyncio.run(scenario())
        code, rest = server.wait_exit(30)
    assert code == 0, rest
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "abort"
    assert "trace written to" in rest and "Traceback" not in rest
    assert Path(prefix + ".yaml").read_text().startswith("trace_version: 2\n")
    with open(prefix + ".csv") as fh:
        (row,) = list(csv.DictReader(fh))  # the one request, whole, marked incomplete
    assert int(row["output_tokens"]) == 1000 and row["status"] != "ok"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staged leftovers


def test_token_gaps_folded_late_equal_each_observed():
    """The inter-token gaps kept unfolded until a read (or PENDING_GAPS of them) land in the
    same buckets and the same sum as one ``observe`` each, bucket edges included."""
    from blis_fast.serve.metrics import (
        PENDING_GAPS,
        TOKEN_LATENCY_BUCKETS,
        GaugeSnapshot,
        ServeMetrics,
        _Histogram,
    )

    edges = [round(b * 1e6) for b in TOKEN_LATENCY_BUCKETS]
    values = [(k * 7919) % 3_000_000 for k in range(3000)] + edges + [e + 1 for e in edges]
    one = _Histogram("h", "d", TOKEN_LATENCY_BUCKETS, "m", 1)
    for v in values:
        one.observe(0, v / 1e6)
    metrics = ServeMetrics("m", 1, lambda: GaugeSnapshot([0], [0], [0.0], [0], [0]))
    for k in range(0, len(values), 7):
        metrics.tokens(0, 7, values[k:k + 7])
    metrics.flush()
    assert metrics._itl.counts == one.counts and metrics._itl.sums == one.sums
    assert metrics._tpot.counts == one.counts
    assert metrics._generation_of[0]._value.get() == 7 * len(range(0, len(values), 7))
    metrics.tokens(0, 1, [1000] * (PENDING_GAPS + 5))  # no scraper: folded at the bound
    assert metrics._new_gaps[0] == []
    assert sum(metrics._itl.counts[0]) == len(values) + PENDING_GAPS + 5


class _AlwaysDue:
    """A stand-in simulation whose next event is always already due (for its first
    ``turns`` looks), as a loaded server's is: nothing else in it."""

    num_instances = 1
    max_model_len = 0

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.looks = 0

    def advance(self, until_us: int) -> list:
        return []

    def gauges(self):
        from types import SimpleNamespace

        return SimpleNamespace(running=[0], waiting=[0], kv_usage=[0.0], prefix_queries=[0],
                               prefix_hits=[0])

    def next_event_us(self) -> int | None:
        self.looks += 1
        return 0 if self.looks <= self.turns else None


def test_a_time_loop_behind_its_events_still_lets_handlers_run():
    """Every turn of the time loop yields to the other tasks, even when its next event is
    already due: a loop that is behind (under load) once kept the handlers waiting for
    their last chunk until it caught up."""
    from blis_fast.serve.app import LiveServer

    sim = _AlwaysDue(turns=1000)
    server = LiveServer(sim, ServeConfig(model="m"))

    async def main() -> int:
        await server.start()
        await asyncio.sleep(0)  # the loop's first turn
        seen = sim.looks
        server._task.cancel()
        return seen

    assert asyncio.run(main()) <= 3


def test_observe_vocabulary_prompts_count_one_token_per_word(served):
    """A prompt made only of ``blis observe``'s vocabulary words is one token a word (a chat
    message too, with no template tokens), so observe's ratio probe measures exactly 1.0;
    any other word brings the 4-characters estimate back."""
    from blis_fast.observe.prompts import RATIO_PROMPT, build_prompt

    base = served[2]
    assert estimate_tokens(RATIO_PROMPT) == 100
    prompt = build_prompt(list(range(37, 37 + 250)), "", {}, {}, 1.0)
    assert estimate_tokens(prompt) == 250
    assert estimate_tokens(prompt + "hello") == -(-len(prompt + "hello") // 4)
    for path, body in (("/v1/completions", {"prompt": prompt}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": prompt}]})):
        status, raw = _post(base, path, {"model": MODEL, "max_tokens": 1, **body})
        assert status == 200
        assert json.loads(raw)["usage"]["prompt_tokens"] == 250
