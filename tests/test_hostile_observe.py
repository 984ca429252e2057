"""A hostile server, hostile flags and Ctrl-C against ``blis observe``; output paths that
collide in ``run``/``replay``; API hooks no policy calls; the cached vLLM venv (issue 28,
items 1 and 8).

Observe must keep what it promised: every request it sent gets a row, a response that breaks a
rule is that row's ``invalid response`` failure (never a dead task, a traceback or a hang), a
body cannot grow memory without bound, and what can be refused is refused before anything is
sent (exit 2, one stderr line naming the flag, no file written). Servers here are loopback
threads (``test_observe.Misbehaving`` and one that replays a given body).
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile_input import MODEL, RUN, _replay, _trace, refused_cleanly
from test_observe import ROOT, Misbehaving, _observe

import blis_fast
from blis_fast.errors import BlisConfigError
from blis_fast.observe.client import PendingRequest, RealClient
from blis_fast.observe.response import (
    MAX_BODY_BYTES,
    MAX_ERROR_BODY_BYTES,
    MAX_FINISH_REASON_CHARS,
    MAX_TOKEN_COUNT,
)
from blis_fast.testing.record_server import running_record_server, sse_events, whole_answer

# ------------------------------------------------------------- servers that answer with nonsense


class Hostile(Misbehaving):
    """``Misbehaving`` with answers whose usage figures or bodies are hostile."""

    USAGE = b'{"prompt_tokens": 5, "completion_tokens": %s}'

    async def _whole(self, writer, payload: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(payload) + payload)
        await writer.drain()

    async def _inf_usage(self, writer, body) -> None:
        await self._whole(writer, b'{"choices":[{"finish_reason":"stop"}],"usage":'
                          + self.USAGE % b"Infinity" + b"}")

    async def _huge_usage(self, writer, body) -> None:
        await self._whole(writer, b'{"choices":[{"finish_reason":"stop"}],"usage":'
                          + self.USAGE % b"1e300" + b"}")

    async def _negative_usage(self, writer, body) -> None:
        await self._whole(writer, b'{"usage":' + self.USAGE % b"-3" + b"}")

    async def _nan_usage_stream(self, writer, body) -> None:
        await self._sse_head(writer, b"Connection: close\r\n")
        writer.write(b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n'
                     b'data: {"choices":[],"usage":' + self.USAGE % b"NaN" + b"}\n\n"
                     b"data: [DONE]\n\n")
        await writer.drain()

    async def _long_reason(self, writer, body) -> None:
        reason = "x" * (MAX_FINISH_REASON_CHARS + 1)
        await self._whole(writer, json.dumps({"choices": [{"finish_reason": reason}]}).encode())

    async def _endless500(self, writer, body) -> None:
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n\r\n")
        block = b"e" * 65536
        while True:  # until the client hangs up
            writer.write(block)
            await writer.drain()

    async def _gzip_bomb(self, writer, body) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Encoding: gzip\r\nConnection: close\r\n\r\n")
        comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
        writer.write(comp.compress(b'{"pad":"'))
        zeros = b"0" * (1 << 20)
        while True:  # endless: 1 MiB of text is ~1 KiB on the wire
            writer.write(comp.compress(zeros) + comp.flush(zlib.Z_SYNC_FLUSH))
            await writer.drain()

    async def _stall_all(self, writer, body) -> None:
        await asyncio.sleep(30)


class StallProbe(Hostile):
    """Every request, the token-ratio probe included, waits 30 s for an answer."""

    async def _handle(self, reader, writer) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.received += 1
            await asyncio.sleep(30)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err, err[-3000:]


# ------------------------------------------------------------------------ hostile usage figures


@pytest.mark.parametrize(("mode", "streaming", "field"), [
    ("inf_usage", False, "usage.completion_tokens = inf"),
    ("huge_usage", False, "usage.completion_tokens = 1e+300"),
    ("negative_usage", False, "usage.completion_tokens = -3"),
    ("nan_usage_stream", True, "usage.completion_tokens = nan"),
    ("long_reason", False, "choices[0].finish_reason is 257 characters"),
])
def test_hostile_response_fields_become_failed_rows(tmp_path, mode, streaming, field):
    """Open loop: every request gets its row, failed with the rule it broke; exit 0."""
    extra = ["--timeout", "5"] + (["--record-itl"] if streaming else [])
    with Hostile(mode) as url:
        code, err, rows = _observe(url, tmp_path, *extra)
    _no_traceback(err)
    assert code == 0, err
    assert len(rows) == 3
    for r in rows:
        assert r["status"] == "error", r
        assert r["error_message"].startswith("invalid response: " + field), r
        assert r["output_tokens"] == "0"


def test_hostile_usage_in_a_closed_loop_ends_each_session(tmp_path):
    """Closed loop: a failed row ends its session, so the run ends (it used to hang)."""
    with Hostile("inf_usage") as url:
        args = [sys.executable, "-m", "blis_fast.cli", "observe", "--server-url", url,
                "--model", "m", "--concurrency", "2", "--num-requests", "6", "--timeout", "5",
                "--prompt-tokens", "20", "--output-tokens", "5",
                "--trace-header", str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv")]
        res = subprocess.run(args, capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    code, err = res.returncode, res.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "t.csv").read_text())))
    _no_traceback(err)
    assert code == 0, err
    assert len(rows) == 2  # one per session: its first round failed, so no follow-up
    assert all(r["status"] == "error" and "invalid response" in r["error_message"] for r in rows)


# ---------------------------------------------------------------- bodies that never end


def _send_one(url: str, streaming: bool = False, timeout_s: float = 20.0):
    async def go():
        async with RealClient(url, "m", timeout_s=timeout_s) as client:
            return await client.send(PendingRequest(request_id=0, input_tokens=3,
                                                    max_output_tokens=4, prompt="a b c",
                                                    streaming=streaming))
    return asyncio.run(go())


@pytest.mark.parametrize("mode", ["endless500", "gzip_bomb"])
def test_endless_or_bomb_body_is_cut_in_bounded_memory_and_time(mode):
    """An endless 500 body is kept up to 64 KiB and not read further; a gzip bomb is read up
    to the body limit counted after decompression; both end at once, in bounded memory."""
    with Hostile(mode) as url:
        tracemalloc.start()
        t0 = time.perf_counter()
        try:
            rec = _send_one(url)
            _cur, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        took = time.perf_counter() - t0
    assert rec.status == "error"
    assert took < 15, took  # the client's timeout is 20 s: the cap ended the read, not it
    if mode == "endless500":
        assert rec.error_message.startswith("HTTP 500: eeee")
        assert rec.error_message.endswith(f"[body cut at {MAX_ERROR_BODY_BYTES} bytes]")
        assert len(rec.error_message) < MAX_ERROR_BODY_BYTES + 100
        assert peak < 8 << 20, peak
    else:
        assert rec.error_message == f"invalid response: body longer than {MAX_BODY_BYTES} bytes"
        assert peak < 3 * MAX_BODY_BYTES, peak


# -------------------------------------------------------------------- Ctrl-C during the probe


def test_interrupt_during_the_token_ratio_probe_stops_the_command(tmp_path):
    """Ctrl-C while the probe waits: exit 130 (``blis: interrupted``), no workload request
    sent afterwards, no file written (the reference dies of the signal there)."""
    server = StallProbe("stall_all")
    with server as url:
        args = [sys.executable, "-m", "blis_fast.cli", "observe", "--server-url", url,
                "--model", "m", "--rate", "50", "--num-requests", "20",
                "--trace-header", str(tmp_path / "t.yaml"), "--trace-data", str(tmp_path / "t.csv")]
        proc = subprocess.Popen(args, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while server.received < 1 and time.time() < deadline:
            time.sleep(0.02)
        assert server.received == 1
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        time.sleep(0.3)  # a request sent after the interrupt would have arrived by now
        received = server.received
    _no_traceback(err)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["blis: interrupted"], err
    assert received == 1
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------- refused before anything is sent


def _refused_before_sending(tmp_path: Path, extra: list[str], names: tuple[str, ...]) -> str:
    log = tmp_path / "received.jsonl"
    before = sorted(p.name for p in tmp_path.iterdir())
    t0 = time.perf_counter()
    with running_record_server(log) as url:
        code, err, _rows = _observe(url, tmp_path, *extra)
    took = time.perf_counter() - t0
    _no_traceback(err)
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and any(n in lines[0] for n in names), err
    assert log.read_text() == ""  # nothing was sent
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, log.name])
    assert took < 30, took
    return lines[0]


@pytest.mark.parametrize("count", ["1000000000000", "1e12"])
def test_num_requests_beyond_memory_is_refused_up_front(tmp_path, count):
    line = _refused_before_sending(tmp_path, ["--num-requests", count], ("--num-requests",))
    assert ("memory" in line) if count.isdigit() else ("invalid" in line)


def test_output_dir_naming_the_trace_header_is_refused_before_sending(tmp_path):
    line = _refused_before_sending(tmp_path, ["--output-dir", str(tmp_path / "t.yaml")],
                                   ("--output-dir",))
    assert "--trace-header" in line


def test_trace_data_naming_the_parquet_inside_output_dir_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    line = _refused_before_sending(
        tmp_path, ["--output-dir", str(out), "--trace-data",
                   str(out / "observed_requests.parquet")], ("--output-dir", "--trace-data"))
    assert "observed_requests.parquet" in line and "written by" in line


def test_output_dir_inside_a_file_output_is_refused(tmp_path):
    _refused_before_sending(tmp_path, ["--output-dir", str(tmp_path / "t.csv" / "pq")],
                            ("--output-dir",))


# ------------------------------------------------------------- run/replay: colliding outputs


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder receiving the run's outputs (also the cwd), as in test_hostile_input."""
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.mark.parametrize("extra", [
    ["--metrics-path", "X", "--output-dir", "X"],
    ["--trace-output", "T", "--output-dir", "T.csv"],
    ["--metrics-path", "X", "--output-dir", "X/sub"],
], ids=["same-path", "trace-file", "folder-below-a-file"])
def test_run_output_file_and_output_dir_colliding_is_refused_first(work, extra):
    line = refused_cleanly([*RUN, *extra], work, "--output-dir")
    assert "--metrics-path" in line or "--trace-output" in line


def test_replay_results_path_and_output_dir_colliding_is_refused_first(work):
    header, data = _trace(work)
    refused_cleanly([*_replay(header, data), "--results-path", "R", "--output-dir", "R"], work,
                    "--output-dir")


# ------------------------------------------------------------------- API: hooks nobody calls


def _admit(snapshots, request):
    return True


def _key(features):
    return 0.0


def _score(snapshots, request, out):
    for i in range(out.shape[0]):
        out[i] = 1.0


@pytest.mark.parametrize(("kwargs", "name"), [
    (dict(custom_admission=_admit), "custom_admission"),
    (dict(custom_scheduler_key=_key), "custom_scheduler_key"),
    (dict(custom_scorer=_score), "custom_scorer"),
    (dict(custom_scorer=_score, routing_policy="weighted", routing_scorers="queue-depth:1"),
     "custom_scorer"),
], ids=["admission", "scheduler", "scorer-not-weighted", "scorer-not-listed"])
def test_hook_without_the_policy_that_calls_it_is_refused(kwargs, name, tmp_path):
    out = tmp_path / "m.json"
    with pytest.raises(BlisConfigError, match=f"^{name} was given but no policy calls it"):
        blis_fast.run(model=MODEL, alpha_coeffs=[100, 1, 100], beta_coeffs=[1000, 10, 5],
                      num_requests=3, log="error", metrics_path=str(out), **kwargs)
    assert not out.exists()


# ------------------------------------------------- the real-server tests' cached vLLM venv


def test_cached_vllm_venv_is_built_in_place_so_its_scripts_run(tmp_path):
    """The venv's console scripts name its own python (it is not built elsewhere and
    renamed), and a leftover of an unfinished build is not taken for a finished one."""
    from blis_fast.testing import vllm_server as vs

    (tmp_path / "vllm-venv").mkdir(parents=True)  # a killed build: no marker
    py = vs.ensure_venv(tmp_path, log=open(os.devnull, "w"), install=lambda python, run: None)
    venv = tmp_path / "vllm-venv"
    assert py == venv / "bin" / "python"
    scripts = [p for p in (venv / "bin").iterdir() if p.name.startswith("pip")]
    assert scripts
    for script in scripts:
        shebang = script.read_text().splitlines()[0]
        assert shebang.startswith("#!")
        assert Path(shebang[2:].split()[0]).parent == venv / "bin", shebang
        assert Path(shebang[2:].split()[0]).exists(), shebang
    res = subprocess.run([str(venv / "bin" / "pip"), "--version"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and str(venv) in res.stdout, res.stderr
    assert not (tmp_path / "vllm-venv.partial").exists()
    assert vs.ensure_venv(tmp_path, install=lambda python, run: pytest.fail("rebuilt")) == py


def test_bundled_server_keeps_the_last_cpu_for_the_client():
    """The server's CPUs leave the last allowed one to the client, a child started inside the
    confinement inherits it, and the launching thread gets its own affinity back."""
    from blis_fast.testing import vllm_server as vs

    allowed = sorted(os.sched_getaffinity(0))
    cpus = vs.server_cpus()
    assert cpus == (set(allowed[:-1]) if len(allowed) > 1 else set(allowed))
    with vs._thread_affinity(cpus):
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted("
                                "os.sched_getaffinity(0)))"], capture_output=True, text=True,
                               timeout=60)
    assert child.stdout.strip() == str(sorted(cpus)), child.stderr
    assert sorted(os.sched_getaffinity(0)) == allowed


# -------------------------------------------- property: mutated responses through the parser


class Replayer:
    """A loopback server answering every request with ``self.head`` + ``self.body``."""

    def __init__(self) -> None:
        self.head = b""
        self.body = b""
        self.port = 0
        self._ready = threading.Event()

    def __enter__(self) -> Replayer:
        threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True).start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)

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
            length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                           if x.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(self.head + self.body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


_REQ = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
_USAGE = {"prompt_tokens": 9, "completion_tokens": 3}
_BASES = [
    b"".join(b"data: " + json.dumps(e).encode() + b"\n\n"
             for e in sse_events(_REQ, chat, 3, "length", _USAGE)) + b"data: [DONE]\n\n"
    for chat in (False, True)
] + [json.dumps(whole_answer(_REQ, chat, 3, "length", _USAGE)).encode() for chat in (False, True)]
_TOKENS = [b"Infinity", b"NaN", b"-Infinity", b"1e300", b"-1", b"3.5", b"9" * 5000, b"[" * 3000,
           b'"finish_reason":"' + b"r" * 300 + b'"', b"true", b"null", b"\xff\xfe", b"\r",
           b"\n", b"data: ", b"data: [DONE]\n", b":", b"{", b"}", b'"usage":', b"\x00"]


_VALUES = [b"Infinity", b"-Infinity", b"NaN", b"1e300", b"-1", b"3.5", b"9" * 5000, b"1e7",
           b"16777217", b'"7"', b"true", b"null", b"[" * 3000, b"{}"]


def _mutated(data: st.DataObject) -> bytes:
    base = bytearray(data.draw(st.sampled_from(_BASES)))
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["value", "value", "flip", "insert", "delete", "dup"]))
        pos = data.draw(st.integers(0, max(len(base) - 1, 0)))
        numbers = list(re.finditer(rb"-?\d+(\.\d+)?|\"length\"", bytes(base)))
        if op == "value" and numbers:  # a field's value: a count or the finish reason
            m = data.draw(st.sampled_from(numbers))
            new = data.draw(st.sampled_from(
                [*_VALUES, b'"' + b"r" * (MAX_FINISH_REASON_CHARS + 1) + b'"']))
            base[m.start():m.end()] = new
        elif op == "flip" and base:
            base[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            base[pos:pos] = data.draw(st.sampled_from(_TOKENS))
        elif op == "delete":
            del base[pos:pos + data.draw(st.integers(1, 30))]
        else:
            base[pos:pos] = base[pos:pos + data.draw(st.integers(1, 120))]
    return bytes(base)


@pytest.fixture(scope="module")
def replayer():
    with Replayer() as server:
        yield server


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_parser_turns_any_mutated_response_into_a_row(data: st.DataObject, replayer) -> None:
    """Mutated SSE streams and JSON bodies (plain or gzip): ``send`` returns a record, never
    raises; an ``ok`` record holds only figures within the rules, any other says why."""
    body = _mutated(data)
    streaming = data.draw(st.booleans())
    gz = data.draw(st.booleans())
    if gz:
        body = gzip.compress(body)
    ctype = b"text/event-stream" if streaming else b"application/json"
    replayer.head = (b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\nContent-Length: %d\r\n"
                     % len(body) + (b"Content-Encoding: gzip\r\n" if gz else b"")
                     + b"Connection: close\r\n\r\n")
    replayer.body = body
    try:
        rec = _send_one(f"http://127.0.0.1:{replayer.port}", streaming=streaming, timeout_s=10)
    except BaseException as exc:  # noqa: BLE001 - the property under test
        pytest.fail(f"send raised {type(exc).__name__}: {exc}\nbody={body[:300]!r}")
    assert rec.status in ("ok", "error", "timeout"), rec
    if rec.status == "ok":
        assert 0 <= rec.output_tokens <= MAX_TOKEN_COUNT
        assert 0 <= rec.server_input_tokens <= MAX_TOKEN_COUNT
        assert len(rec.finish_reason) <= MAX_FINISH_REASON_CHARS
        assert rec.error_message == ""
    else:
        assert rec.error_message, rec
    assert rec.num_chunks == len(rec.chunk_timestamps) or not streaming
