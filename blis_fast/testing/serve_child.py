"""Start ``blis serve`` in a child process and wait for its "listening on" line (tests, benches);
time a streamed completion with the lightest client.

Every end-to-end test of ``blis serve`` (and ``bench/serve_bench.py``) needs the same few
steps: launch the command unbuffered with its stderr piped, read stderr until the line that
names the fleet's URL (and, with ``--instance-ports``, the lines naming each instance's), fail
with what the server said if it ended first, and kill it if the caller leaves early. Reading is
done on the raw pipe with a deadline, so a server that hangs before listening fails the caller
after ``timeout_s`` instead of blocking it.

:func:`timed_completion` is the lightest client that can measure the server's pacing: a bare
asyncio connection, opened before the request's clock starts, each received buffer timed as
it arrives (``data_received``) and its SSE events counted by their ``data: {`` prefix, before
any parsing: nothing between the socket and the clock but the event loop. An HTTP library
times a chunk after its reader and its consumer's coroutine have run; under load that is the
client's lag, not the server's.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

LISTENING = "listening on "
_INSTANCES = re.compile(r"\((?:model .*?, )?(\d+) instance\(s\)")
_INSTANCE_LINE = re.compile(r"instance (\d+) on (\S+)")


class ServeStartError(RuntimeError):
    """``blis serve`` ended, or stayed silent past the deadline, before it listened."""


@dataclass
class ServeChild:
    """A running ``blis serve`` child: its process, the fleet's URL, each instance's URL
    (``--instance-ports``) and the stderr lines written before it listened."""

    proc: subprocess.Popen
    url: str
    instance_urls: list[str] = field(default_factory=list)
    startup: str = ""
    _pending: str = ""

    def interrupt(self, timeout_s: float = 60.0) -> tuple[int, str]:
        """Ctrl-C (SIGINT): the server ends its streams and writes its trace; then
        :meth:`wait_exit`."""
        self.proc.send_signal(signal.SIGINT)
        return self.wait_exit(timeout_s)

    def wait_exit(self, timeout_s: float = 60.0) -> tuple[int, str]:
        """Wait for the child to exit (killed if it has not within ``timeout_s``: then the
        code is the kill's); its exit code and what it wrote on stderr after listening."""
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        rest, self._pending = self._pending, ""
        return code, rest + (self.proc.stderr.read() if self.proc.stderr else "")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServeChild:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def start_serve(args: Sequence[str], *, launcher: Sequence[str] = (),
                python: Sequence[str] | None = None, env: dict[str, str] | None = None,
                timeout_s: float = 120.0) -> ServeChild:
    """Run ``blis serve ARGS`` as a child (``launcher`` before the interpreter, e.g.
    ``("taskset", "-c", "0")``; ``python`` replaces ``[sys.executable, "-m", "blis_fast.cli"]``,
    e.g. a profiling wrapper) and return once it listens. Raises :class:`ServeStartError` with
    the tail of its stderr if it ends first or says nothing within ``timeout_s`` (the child is
    killed then)."""
    cmd = [*launcher, *(python or (sys.executable, "-m", "blis_fast.cli")), "serve", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                            env={**(os.environ if env is None else env),
                                 "PYTHONUNBUFFERED": "1"})
    try:
        return _wait_listening(proc, timeout_s, any(str(a).startswith("--instance-ports")
                                                    for a in args))
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise


def _wait_listening(proc: subprocess.Popen, timeout_s: float,
                    per_instance: bool) -> ServeChild:
    """Read ``proc``'s stderr (the raw pipe, so nothing stays in a text buffer) until the
    "listening on" line and, with ``per_instance`` (``--instance-ports`` given), the line of
    every instance."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    deadline = time.monotonic() + timeout_s
    raw = b""
    while True:
        text = raw.decode(errors="replace")
        found = _parse(text, per_instance)
        if found is not None:
            url, instances, consumed = found
            return ServeChild(proc, url, instances, text[:consumed], text[consumed:])
        left = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            raise ServeStartError(f"blis serve did not listen within {timeout_s:g} s: "
                                  + text[-2000:])
        data = os.read(fd, 65536)
        if not data:
            proc.wait()
            raise ServeStartError(f"blis serve ended (exit {proc.returncode}) before "
                                  "listening: " + text[-2000:])
        raw += data


def _parse(text: str, per_instance: bool) -> tuple[str, list[str], int] | None:
    """The fleet's URL, the instances' URLs and how much of ``text`` they took, once every
    line they need is complete (None before): the listening line says how many instances
    there are, and with ``per_instance`` each has a line of its own after it."""
    at = text.find(LISTENING)
    if at < 0:
        return None
    end = text.find("\n", at)
    if end < 0:
        return None
    line = text[at:end]
    url = line[len(LISTENING):].split(" ")[0]
    rest = text[end + 1:]
    urls: list[str] = []
    pos = end + 1
    for ln in rest.splitlines(keepends=True):
        m = _INSTANCE_LINE.search(ln)
        if m is None or not ln.endswith("\n"):
            break
        urls.append(m.group(2))
        pos += len(ln)
    expected = _INSTANCES.search(line)
    if per_instance and expected is not None and len(urls) < int(expected.group(1)):
        return None  # the instance lines are still coming
    return url, urls, pos


@dataclass
class StreamTiming:
    """A streamed completion as its client saw it (``time.monotonic()`` seconds): when the
    request was written, when the buffers holding the first and the last event arrived, and
    how many events (``data: {...}``, the usage chunk included) there were."""

    sent: float
    first: float
    last: float
    events: int


class _TimedStream(asyncio.Protocol):
    EVENT = b"data: {"
    DONE = b"data: [DONE]"

    def __init__(self, done: asyncio.Future) -> None:
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.first: float | None = None
        self.last: float | None = None
        self.events = 0
        self.status_ok: bool | None = None
        self._tail = b""  # the end of the previous buffer: an event prefix cut in two

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.status_ok is None:
            self.status_ok = data.startswith(b"HTTP/1.1 200")
        buf = self._tail + data
        n = buf.count(self.EVENT)
        if n:
            self.first = now if self.first is None else self.first
            self.last = now
            self.events += n
        if self.DONE in buf:
            assert self.transport is not None
            self.transport.close()
            if not self.done.done():
                self.done.set_result(True)
        self._tail = buf[-(len(self.EVENT) - 1):]  # too short to hold a whole prefix twice

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(False)


async def timed_completion(url: str, body: dict, at: float | None = None,
                           path: str = "/v1/completions") -> StreamTiming:
    """POST ``body`` (a streamed completion) to ``url`` (``http://host:port``) on a connection
    opened first, the request written at monotonic time ``at`` (now if None); raises
    RuntimeError if the answer is not a 200 stream that ends with ``[DONE]``."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    payload = json.dumps(body).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(payload)}\r\nConnection: close"
               "\r\n\r\n").encode() + payload
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, proto = await loop.create_connection(lambda: _TimedStream(done), host,
                                                    int(port))
    if at is not None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
    sent = time.monotonic()
    transport.write(request)
    if not await done or not proto.status_ok or proto.first is None or proto.last is None:
        raise RuntimeError(f"{url}{path}: not a 200 stream ended by [DONE]")
    return StreamTiming(sent, proto.first, proto.last, proto.events)


__all__ = ["LISTENING", "ServeChild", "ServeStartError", "StreamTiming", "start_serve",
           "timed_completion"]
