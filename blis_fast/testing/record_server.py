"""A loopback OpenAI-compatible server that answers deterministically and logs what it receives.

usage: python -m blis_fast.testing.record_server --record FILE [--port N] [--token-delay-ms D]

It binds 127.0.0.1 only (port 0 picks a free port) and prints the port as its first stdout
line. Each request is appended to FILE as one JSON object (method, path, the headers listed in
``LOGGED_HEADERS`` that were sent, the parsed JSON body or null) before it is answered.
SIGTERM/SIGINT stop it.

Answers follow the protocol the parity cases were recorded with:
* ``POST /v1/completions`` and ``/v1/chat/completions``: prompt tokens = 13 * words // 10 over
  the prompt's whitespace-separated words (chat: over every message content, plus 7); the
  completion has ``max_tokens`` tokens if > 0, else ``min_tokens`` if > 0, else 16, capped at
  4096; ``finish_reason`` is ``length`` when ``max_tokens`` (or the cap) set the count.
  Streaming sends one SSE event per token (chat first sends a role-only delta), then a usage
  event with empty ``choices`` if ``stream_options.include_usage``, then ``data: [DONE]``
  (chunked transfer encoding, connection kept open). Non-streaming sends one JSON body with
  ``usage``.
* ``GET /v1/models`` one model; ``GET /metrics`` a few fixed ``vllm:*`` lines; other paths 404;
  a POST body that is not a JSON object 400.
* ``--metrics-script FILE`` replaces the fixed ``/metrics`` answer with a script: a JSON list
  whose k-th entry answers the k-th ``GET /metrics`` (the last one repeats), either a string
  (the body, status 200) or ``{"status": int, "body": str, "delay_s": float}``. Counters that
  go backwards, hits above queries, bodies that are not exposition text or that never end
  before a timeout: faults a real server cannot be made to show on demand.
``--token-delay-ms`` (default 0) waits that long before each streamed token, to make streams
take time; ``--buffer-stream`` still waits but holds the events back and writes the whole stream
at its end, as a buffering proxy or a CPU-starved frontend does (issue 30). Standard library only (asyncio streams, HTTP/1.1 keep-alive for JSON answers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

LOGGED_HEADERS = ("content-type", "authorization", "x-gateway-inference-fairness-id",
                  "x-gateway-inference-objective", "x-request-id", "x-slo-ttft-ms")
MAX_TOKENS_CAP = 4096
FALLBACK_TOKENS = 16
CHAT_OVERHEAD_TOKENS = 7
METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="recorded"} 0.0\n'
    'vllm:num_requests_waiting{model_name="recorded"} 0.0\n'
    'vllm:gpu_cache_usage_perc{model_name="recorded"} 0.25\n'
    "# TYPE vllm:gpu_prefix_cache_queries counter\n"
    'vllm:gpu_prefix_cache_queries_total{model_name="recorded"} 1000.0\n'
    'vllm:gpu_prefix_cache_hits_total{model_name="recorded"} 400.0\n'
    'vllm:prefix_cache_queries_total{model_name="recorded"} 1000.0\n'
    'vllm:prefix_cache_hits_total{model_name="recorded"} 400.0\n'
)
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error",
            503: "Service Unavailable"}


def count_prompt_tokens(body: dict, chat: bool) -> int:
    """The fake tokenizer: 1.3 tokens per word, plus a fixed chat template overhead."""
    if not chat:
        return 13 * len(str(body.get("prompt", "")).split()) // 10
    words = 0
    for msg in body.get("messages") or []:
        if isinstance(msg, dict):
            words += len(str(msg.get("content", "")).split())
    return 13 * words // 10 + CHAT_OVERHEAD_TOKENS


def plan_output(body: dict) -> tuple[int, str]:
    """How many tokens to generate and the finish reason."""

    def positive_int(key: str) -> int:
        v = body.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0

    if positive_int("max_tokens"):
        n, reason = positive_int("max_tokens"), "length"
    elif positive_int("min_tokens"):
        n, reason = positive_int("min_tokens"), "stop"
    else:
        n, reason = FALLBACK_TOKENS, "stop"
    if n > MAX_TOKENS_CAP:
        return MAX_TOKENS_CAP, "length"
    return n, reason


def sse_events(body: dict, chat: bool, n: int, reason: str, usage: dict) -> list[dict]:
    """The streamed events of one completion, in order (without the final [DONE])."""
    head = {"id": "chatcmpl-rec" if chat else "cmpl-rec", "created": 0,
            "model": body.get("model", ""),
            "object": "chat.completion.chunk" if chat else "text_completion"}
    events = []
    if chat:
        events.append({**head, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    for i in range(n):
        fr = reason if i == n - 1 else None
        choice = ({"index": 0, "delta": {"content": "tok "}, "finish_reason": fr} if chat else
                  {"index": 0, "text": "tok ", "logprobs": None, "finish_reason": fr})
        events.append({**head, "choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**head, "choices": [], "usage": usage})
    return events


def whole_answer(body: dict, chat: bool, n: int, reason: str, usage: dict) -> dict:
    """The non-streaming answer of one completion."""
    text = "tok " * n
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        kind = "text_completion"
    return {"id": "chatcmpl-rec" if chat else "cmpl-rec", "object": kind, "created": 0,
            "model": body.get("model", ""), "choices": [choice], "usage": usage}


class RecordServer:
    """The asyncio server; ``log_path`` receives one JSON line per request."""

    def __init__(self, log_path: str, token_delay_s: float = 0.0,
                 buffer_stream: bool = False, metrics_script: list | None = None) -> None:
        self.log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.token_delay_s = token_delay_s
        self.buffer_stream = buffer_stream
        self.metrics_script = metrics_script or []
        self.metrics_served = 0

    async def _metrics(self, writer: asyncio.StreamWriter, keep: bool) -> None:
        """Answer ``GET /metrics``: the fixed text, or the script's next entry."""
        if not self.metrics_script:
            await self._reply(writer, 200, "text/plain; version=0.0.4", METRICS, keep)
            return
        entry = self.metrics_script[min(self.metrics_served, len(self.metrics_script) - 1)]
        self.metrics_served += 1
        if isinstance(entry, str):
            entry = {"body": entry}
        if entry.get("delay_s"):
            await asyncio.sleep(float(entry["delay_s"]))
        await self._reply(writer, int(entry.get("status", 200)), "text/plain; version=0.0.4",
                          str(entry.get("body", "")), keep)

    def close(self) -> None:
        self.log.close()

    def _log(self, method: str, path: str, headers: dict, body) -> None:
        sent = {k: headers[k] for k in LOGGED_HEADERS if k in headers}
        self.log.write(json.dumps({"method": method, "path": path, "headers": sent,
                                   "body": body}) + "\n")
        self.log.flush()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection should close."""
        start = await reader.readline()
        if not start.strip():
            return False
        method, path, version = start.decode("latin-1").split()
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        size = int(headers.get("content-length") or 0)
        raw = await reader.readexactly(size) if size else b""
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if method != "POST":
            self._log(method, path, headers, None)
            if path == "/v1/models":
                payload = {"object": "list", "data": [
                    {"id": "recorded", "object": "model", "owned_by": "record-server"}]}
                await self._reply(writer, 200, "application/json", json.dumps(payload), keep)
            elif path == "/metrics":
                await self._metrics(writer, keep)
            else:
                await self._reply(writer, 404, "text/plain", "not found", keep)
            return keep
        try:
            body = json.loads(raw.decode("utf-8"))
        except ValueError:
            body = None
        self._log(method, path, headers, body)
        if path not in ("/v1/completions", "/v1/chat/completions"):
            await self._reply(writer, 404, "text/plain", "not found", keep)
            return keep
        if not isinstance(body, dict):
            await self._reply(writer, 400, "application/json",
                              json.dumps({"error": "body must be a JSON object"}), keep)
            return keep
        chat = path == "/v1/chat/completions"
        prompt = count_prompt_tokens(body, chat)
        n, reason = plan_output(body)
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        if not body.get("stream"):
            await self._reply(writer, 200, "application/json",
                              json.dumps(whole_answer(body, chat, n, reason, usage)), keep)
            return keep
        # HTTP/1.1 chunked stream: the connection stays open for the client's next request
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                     + (b"Connection: keep-alive\r\n\r\n" if keep else b"Connection: close\r\n\r\n"))
        events = [b"data: " + json.dumps(ev).encode() + b"\n\n"
                  for ev in sse_events(body, chat, n, reason, usage)]
        events.append(b"data: [DONE]\n\n")
        if self.token_delay_s > 0 and self.buffer_stream:
            await asyncio.sleep(self.token_delay_s * len(events))
            writer.write(b"".join(b"%x\r\n%s\r\n" % (len(ev), ev) for ev in events))
        elif self.token_delay_s > 0:
            for ev in events:
                await asyncio.sleep(self.token_delay_s)
                writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                await writer.drain()
        else:
            writer.write(b"".join(b"%x\r\n%s\r\n" % (len(ev), ev) for ev in events))
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return keep

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, code: int, ctype: str, text: str,
                     keep: bool) -> None:
        data = text.encode()
        head = (f"HTTP/1.1 {code} {_REASONS.get(code, 'Error')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(data)}\r\n"
                f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n")
        writer.write(head.encode() + data)
        await writer.drain()


async def serve(log_path: str, port: int, token_delay_s: float,
                buffer_stream: bool = False, metrics_script: list | None = None) -> None:
    """Run until SIGTERM/SIGINT; print the bound port first."""
    rec = RecordServer(log_path, token_delay_s, buffer_stream, metrics_script)
    server = await asyncio.start_server(rec.handle, "127.0.0.1", port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with server:
            await stop.wait()
    finally:
        rec.close()


@contextlib.contextmanager
def running_record_server(record_path: str | os.PathLike, token_delay_ms: float = 0.0,
                          buffer_stream: bool = False,
                          metrics_script: str | os.PathLike | None = None) -> Iterator[str]:
    """Run the server in a child process; yield its base URL; stop it with SIGTERM."""
    cmd = [sys.executable, "-m", "blis_fast.testing.record_server", "--port", "0",
           "--record", os.fspath(record_path), "--token-delay-ms", str(token_delay_ms),
           *(["--buffer-stream"] if buffer_stream else []),
           *(["--metrics-script", os.fspath(metrics_script)] if metrics_script else [])]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.strip().isdigit():
            raise RuntimeError(f"record server did not start (printed {line!r})")
        yield f"http://127.0.0.1:{int(line)}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description="Deterministic recording OpenAI-compatible server")
    ap.add_argument("--record", required=True, help="append one JSON line per request here")
    ap.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0 = any free one)")
    ap.add_argument("--token-delay-ms", type=float, default=0.0,
                    help="pause before each streamed token")
    ap.add_argument("--buffer-stream", action="store_true",
                    help="hold a stream's events back and write them all at its end")
    ap.add_argument("--metrics-script", default="",
                    help="JSON list of /metrics answers, served in order (the last repeats)")
    a = ap.parse_args(argv)
    script = None
    if a.metrics_script:
        script = json.loads(Path(a.metrics_script).read_text(encoding="utf-8"))
        if not isinstance(script, list) or not script:
            ap.error("--metrics-script: expected a non-empty JSON list")
    asyncio.run(serve(a.record, a.port, a.token_delay_ms / 1000.0, a.buffer_stream, script))
    return 0


if __name__ == "__main__":
    sys.exit(main())
