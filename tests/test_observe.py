"""``blis observe`` against loopback servers: SSE parsing, failures recorded per request,
interrupts, bad input. Servers here misbehave on purpose; the reference's recorded behaviour
(OBS-6, OBS-7) says what each row must hold."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from blis_fast.observe.prompts import go_round, tokens_to_prompt, word_count
from blis_fast.observe.sse import LineSplitter, LineTooLong, data_payload
from blis_fast.testing.record_server import running_record_server

ROOT = Path(__file__).resolve().parents[1]


# ---- SSE and prompt helpers ------------------------------------------------------------------
def test_line_splitter_joins_lines_split_across_reads():
    sp = LineSplitter()
    assert sp.feed(b"data: {\"a\"") == []
    assert sp.feed(b": 1}\r\n\r\n: keep-alive comment\nda") == ['data: {"a": 1}', "", ": keep-alive comment"]
    assert sp.feed(b"ta: [DONE]\n") == ["data: [DONE]"]
    assert sp.feed(b"data: tail-without-newline") == []
    assert sp.close() == ["data: tail-without-newline"]


def test_line_splitter_refuses_a_line_over_64_kib():
    sp = LineSplitter()
    assert sp.feed(b"data: " + b"x" * 65000) == []
    with pytest.raises(LineTooLong):
        sp.feed(b"y" * 1000)


def test_only_data_colon_space_lines_are_events():
    assert data_payload("data: {}") == "{}"
    assert data_payload("data:{}") is None  # no space: ignored like the reference
    assert data_payload(": comment") is None
    assert data_payload("event: message") is None


def test_prompt_words_come_from_token_ids_then_positions():
    # ids 0, 101, -1 -> words 0, 1, 99; then positions 3, 4 once the ids run out (OBS-4.3)
    assert tokens_to_prompt([0, 101, -1], 5) == "alpha bravo zest delta echo "
    assert go_round(2.5) == 3 and go_round(-2.5) == -3
    assert word_count(13, 1.3) == 10 and word_count(0, 1.3) == 1


# ---- a server that misbehaves on purpose ------------------------------------------------------
class Misbehaving:
    """Loopback HTTP server thread; the ratio request (max_tokens 1) gets a normal answer,
    every other request the behaviour ``mode`` names."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.received = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def __enter__(self) -> str:
        threading.Thread(target=self._run, daemon=True).start()
        assert self._ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _handle(self, reader, writer) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode().split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = json.loads(await reader.readexactly(length))
            if body.get("max_tokens") == 1:
                payload = json.dumps({"usage": {"prompt_tokens": 130, "completion_tokens": 1},
                                      "choices": [{"finish_reason": "length"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload)
                             + payload)
                await writer.drain()
                return
            self.received += 1
            await getattr(self, "_" + self.mode)(writer, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _slow(self, writer, body) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.2)
        self.in_flight -= 1
        payload = json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 3},
                              "choices": [{"finish_reason": "length"}]}).encode()
        # the handler closes the connection after answering: say so, or the client may reuse
        # it for its next request and lose the race with the close (a stray "error" row)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                     % len(payload) + payload)
        await writer.drain()

    async def _stall(self, writer, body) -> None:
        await asyncio.sleep(30)

    async def _status500(self, writer, body) -> None:
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n"
                     b"Connection: close\r\n\r\nboom")
        await writer.drain()

    async def _short500(self, writer, body) -> None:
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1000\r\n\r\n"
                     b"0123456789abcdef")
        await writer.drain()

    async def _bad_json(self, writer, body) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nnot json")
        await writer.drain()

    async def _sse_head(self, writer, extra: bytes = b"") -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + extra + b"\r\n")
        await writer.drain()

    async def _stall_stream(self, writer, body) -> None:
        await self._sse_head(writer, b"Connection: close\r\n")
        writer.write(b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n')
        await writer.drain()
        await asyncio.sleep(30)

    async def _cut_stream(self, writer, body) -> None:
        # chunked transfer encoding, connection dropped in the middle of a chunk
        await self._sse_head(writer, b"Transfer-Encoding: chunked\r\n")
        event = b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        writer.write(b"400\r\ndata: {\"cho")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.transport.abort()

    async def _garbage(self, writer, body) -> None:
        await self._sse_head(writer, b"Connection: close\r\n")
        parts = [
            b": comment line\n", b"event: message\n", b"data:no-space\n\n",
            b'data: {"choices":[{"delta":{"role":"assistant"},"finish_reason":null}]}\n\n',
            b"data: {not json at all\n\n",
            b'data: {"choices":[{"text":"x","fin', b'ish_reason":"stop"}]}\r\n\r\n',
            b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":7}}\n\n',
            b"data: [DONE]\n\n", b"data: after-done\n\n",
        ]
        for p in parts:
            writer.write(p)
            await writer.drain()
            await asyncio.sleep(0.002)


def _observe(url: str, tmp: Path, *extra: str, n: int = 3, rate: int = 20,
             output_tokens: int = 5) -> tuple[int, str, list[dict]]:
    """Run ``blis observe`` in a child process; return exit code, stderr and the trace rows."""
    args = [sys.executable, "-m", "blis_fast.cli", "observe", "--server-url", url,
            "--model", "m", "--rate", str(rate), "--num-requests", str(n), "--prompt-tokens",
            "20", "--prompt-tokens-stdev", "5", "--output-tokens", str(output_tokens),
            "--output-tokens-stdev", "2",
            "--trace-header", str(tmp / "t.yaml"), "--trace-data", str(tmp / "t.csv"), *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    rows = []
    if (tmp / "t.csv").exists():
        rows = list(csv.DictReader(io.StringIO((tmp / "t.csv").read_text())))
    return res.returncode, res.stderr, rows


@pytest.mark.parametrize("mode, streaming, status, prefix, chunks", [
    ("stall", False, "timeout", "HTTP timeout: ", 0),
    ("status500", False, "error", "HTTP 500: boom", 0),
    ("short500", False, "error", "HTTP 500: 0123456789abcdef", 0),
    ("bad_json", False, "error", "JSON parse error: ", 1),
    ("stall_stream", True, "timeout", "streaming timeout: ", 1),
    ("cut_stream", True, "error", "streaming error: ", 2),
])
def test_server_failures_become_rows(tmp_path, mode, streaming, status, prefix, chunks):
    extra = ["--timeout", "1"] + (["--record-itl"] if streaming else [])
    with Misbehaving(mode) as url:
        code, err, rows = _observe(url, tmp_path, *extra)
    assert code == 0, err
    assert len(rows) == 3
    for r in rows:
        assert r["status"] == status and r["error_message"].startswith(prefix), r
        assert int(r["num_chunks"]) == chunks and int(r["send_time_us"]) > 0
        assert r["output_tokens"] == "0"
    if streaming:  # failed requests get no ITL rows (OBS-8.4)
        assert (tmp_path / "t.itl.csv").read_text() == "request_id,chunk_index,timestamp_us\n"


def test_max_concurrency_bounds_requests_in_flight(tmp_path):
    # 8 requests due within 40 ms, each answered after 200 ms: with 2 slots the server never
    # sees more than 2 at once, and the later ones are sent late (slot wait, OBS-5.3/5.4)
    server = Misbehaving("slow")
    with server as url:
        code, err, rows = _observe(url, tmp_path, "--max-concurrency", "2", "--rate", "200", n=8)
    assert code == 0, err
    assert [r["status"] for r in rows] == ["ok"] * 8
    assert server.max_in_flight == 2
    sends = sorted(int(r["send_time_us"]) for r in rows)
    assert sends[-1] - sends[0] >= 3 * 200_000 * 0.9  # four waves of two


def test_garbage_stream_counts_data_lines_until_done(tmp_path):
    with Misbehaving("garbage") as url:
        code, err, rows = _observe(url, tmp_path, "--record-itl", n=2)
    assert code == 0, err
    assert len(rows) == 2
    for r in rows:
        # role-only, malformed, split content and usage-only lines are chunks; comments,
        # event:, data: without a space and anything after [DONE] are not (OBS-6.2)
        assert (r["status"], r["num_chunks"], r["output_tokens"]) == ("ok", "4", "7")
        assert (r["server_input_tokens"], r["finish_reason"]) == ("9", "stop")
        assert int(r["first_chunk_time_us"]) <= int(r["last_chunk_time_us"])
    itl = list(csv.DictReader(io.StringIO((tmp_path / "t.itl.csv").read_text())))
    assert len(itl) == 8 and sorted({r["chunk_index"] for r in itl}) == ["0", "1", "2", "3"]


def test_recording_server_run_writes_every_file_and_parquet(tmp_path):
    log = tmp_path / "received.jsonl"
    with running_record_server(log) as url:
        code, err, rows = _observe(url, tmp_path, "--record-itl", "--api-format", "chat",
                                   "--output-dir", str(tmp_path / "out"), n=6)
    assert code == 0, err
    received = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(received) == 7  # the token-ratio request + 6
    assert [r["status"] for r in rows] == ["ok"] * 6
    for r in rows:
        # chat stream: role chunk + one chunk per token + usage chunk (OBS-6.2)
        assert int(r["num_chunks"]) == int(r["output_tokens"]) + 2
    table = pq.read_table(tmp_path / "out" / "observed_requests.parquet")
    assert table.num_rows == 6
    assert sorted(table.column("request_id").to_pylist()) == list(range(6))
    assert all(v is not None and v >= 0 for v in table.column("ttft_ms").to_pylist())
    assert not list(tmp_path.glob(".*.tmp")) and not list((tmp_path / "out").glob(".*.tmp"))


@pytest.mark.parametrize("drain, expect_cancelled", [("30", False), ("0.3", True)])
def test_interrupt_keeps_one_row_per_sent_request(tmp_path, drain, expect_cancelled):
    log = tmp_path / "received.jsonl"
    with running_record_server(log, token_delay_ms=100) as url:
        args = [sys.executable, "-m", "blis_fast.cli", "observe", "--server-url", url,
                "--model", "m", "--rate", "20", "--num-requests", "200", "--record-itl",
                "--prompt-tokens", "20", "--prompt-tokens-stdev", "5", "--output-tokens", "8",
                "--output-tokens-stdev", "2", "--drain-timeout", drain,
                "--trace-header", str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv")]
        proc = subprocess.Popen(args, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:  # interrupt once a few requests are in flight
            if log.exists() and len(log.read_text().splitlines()) >= 6:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    sent = len(log.read_text().splitlines()) - 1  # minus the token-ratio request
    rows = list(csv.DictReader(io.StringIO((tmp_path / "t.csv").read_text())))
    assert 5 <= len(rows) == sent < 200
    assert sorted(int(r["request_id"]) for r in rows) == list(range(sent))
    cancelled = [r for r in rows if "context canceled" in r["error_message"]]
    if expect_cancelled:
        assert cancelled and all(r["status"] == "error" for r in cancelled)
    else:
        assert not cancelled and all(r["status"] == "ok" for r in rows)
    assert (tmp_path / "t.yaml").read_text().startswith("trace_version: 2\n")


@pytest.mark.parametrize("extra, message", [
    (["--api-format", "grpc"], "--api-format must be 'completions' or 'chat'"),
    (["--timeout", "0"], "--timeout must be between 1 and 86400"),
    (["--workload-spec", "missing.yaml", "--rate", "1"], "Failed to load workload spec"),
    (["--prompt-tokens-min", "0"], "--prompt-tokens-min must be >= 1"),
    (["--drain-timeout", "-1"], "--drain-timeout must be"),
])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, extra, message):
    with running_record_server(tmp_path / "received.jsonl") as url:
        code, err, rows = _observe(url, tmp_path, *extra)
    assert code == 2
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "t.csv").exists() and not (tmp_path / "t.yaml").exists()
    assert (tmp_path / "received.jsonl").read_text() == ""  # nothing was sent


def test_missing_output_directory_is_refused_before_sending(tmp_path):
    with running_record_server(tmp_path / "received.jsonl") as url:
        code, err, _ = _observe(url, tmp_path, "--trace-data", str(tmp_path / "no" / "t.csv"))
    assert code == 2 and "--trace-data" in err and err.count("\n") == 1
    assert (tmp_path / "received.jsonl").read_text() == ""


# ---- token ids kept for prompts ----------------------------------------------------------------
@pytest.mark.parametrize("case", ["obs-chat-spec-two-clients-prefix",
                                  "obs-multiturn-closed-loop-3-rounds"])
def test_kept_token_ids_hash_to_the_table_digests(case):
    """The ids observe builds prompts from are the generator's own: their full blocks digest
    to the table's chunk digests, and keeping them changes nothing else."""
    import numpy as np

    from blis_fast.kernels.hashing import block_digests
    from blis_fast.workload.generator import generate_workload
    from blis_fast.workload.spec_yaml import load_workload_spec

    spec = load_workload_spec(str(ROOT / "tests/reference_cases/cases" / case / "spec.yaml"))
    kept = generate_workload(spec, max_requests=spec.num_requests, keep_token_ids=True)
    plain = generate_workload(spec, max_requests=spec.num_requests)
    t = kept.table
    assert plain.input_ids is None
    assert np.array_equal(t.chunk_digests, plain.table.chunk_digests)
    assert np.array_equal(t.arrival_us, plain.table.arrival_us)
    bs = t.block_size
    for i, ids in enumerate(kept.input_ids):
        assert len(ids) == t.input_len[i]
        n = len(ids) // bs
        out = np.empty(n, dtype=np.uint64)
        block_digests(np.asarray(ids, dtype=np.int64), 0, bs, n, out, 0)
        assert np.array_equal(out, t.chunks(i)[:n])
