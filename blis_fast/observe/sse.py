"""Incremental server-sent-events reading for streamed completions (OBS-6.2).

Network reads cut the stream anywhere, so :class:`LineSplitter` keeps the unfinished tail
between reads and hands out whole lines (``\\n`` or ``\\r\\n`` endings, as Go's
``bufio.ScanLines``). :func:`data_payload` applies the reference's rule for which lines are
events: only lines that start with exactly ``data: `` count (comments ``:...``, ``event:``
lines, blank separators and ``data:`` without a space are skipped).
"""

from __future__ import annotations

MAX_LINE_BYTES = 64 * 1024
"""Longest line the reference's scanner accepts (bufio.MaxScanTokenSize)."""

DONE = "[DONE]"
"""The payload that ends an OpenAI-style stream."""


class LineTooLong(Exception):
    """A line longer than :data:`MAX_LINE_BYTES` (the reference's ``token too long``)."""

    def __str__(self) -> str:
        return "bufio.Scanner: token too long"


class LineSplitter:
    """Feed raw bytes, get back the complete lines they finish (decoded as UTF-8)."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> list[str]:
        """Lines completed by ``data`` (without their line endings), in order."""
        buf = self._tail + data if self._tail else data
        parts = buf.split(b"\n")
        self._tail = parts.pop()
        if len(self._tail) > MAX_LINE_BYTES:
            raise LineTooLong()
        out = []
        for p in parts:
            if len(p) > MAX_LINE_BYTES:
                raise LineTooLong()
            if p.endswith(b"\r"):
                p = p[:-1]
            out.append(p.decode("utf-8", errors="replace"))
        return out

    def close(self) -> list[str]:
        """The last line when the stream ends without a final newline."""
        tail, self._tail = self._tail, b""
        if not tail:
            return []
        if tail.endswith(b"\r"):
            tail = tail[:-1]
        return [tail.decode("utf-8", errors="replace")]


def data_payload(line: str) -> str | None:
    """The event payload of an SSE line, or None for a line that is not a ``data: `` line."""
    if line.startswith("data: "):
        return line[6:]
    return None
