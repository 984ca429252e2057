"""What a server's answer may contain: every response field observe reads is checked here.

A server is hostile input like a file: its usage figures may be ``Infinity``, ``1e300``,
negative or fractional, its ``finish_reason`` a megabyte of text, its JSON nested a million
levels deep, its body endless or a gzip bomb. One parser per body kind reads it into the
request's :class:`RequestRecord` and never raises: a body that breaks
a rule makes the request's row ``error`` with a message saying which field broke which rule,
and the run goes on. Limits are per response and count decompressed bytes, so memory stays
bounded whatever the server sends.

Rules (the reference's own reading where it has one, OBS-6):

* ``usage.completion_tokens`` / ``usage.prompt_tokens``: a field that is absent or not a JSON
  number is ignored (the reference's ``.(float64)`` check); a number must be finite, whole and
  in ``0..16777216`` (blis_fast's rule: the reference truncates any float into an int). A
  count above the request's ``max_tokens`` is kept as reported (real servers never send one).
* ``choices[0].finish_reason``: used when it is a string (else ignored); a string longer than
  :data:`MAX_FINISH_REASON_CHARS` is refused.
* Streamed events: at most :data:`MAX_STREAM_EVENTS` ``data:`` lines and
  :data:`MAX_STREAM_BYTES` bytes; a line over 64 KiB is the reference's ``token too long``.
  A ``data:`` payload that is not JSON is counted and skipped, as the reference does.
* A whole (non-streamed) body: at most :data:`MAX_BODY_BYTES`; a non-200 body is kept up to
  :data:`MAX_ERROR_BODY_BYTES` and not read further.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from blis_fast.observe.sse import DONE, LineSplitter, data_payload

MAX_TOKEN_COUNT = 1 << 24
"""Largest token count a response may report: 16,777,216, above any model's context window
(a closed-loop session turns the count into that many prompt words of its next round)."""
MAX_FINISH_REASON_CHARS = 256
"""Longest ``finish_reason`` accepted (real servers send words such as ``length``)."""
MAX_BODY_BYTES = 16 << 20
"""Largest non-streamed response body read, after decompression (a 128k-token completion is
well under 1 MiB)."""
MAX_STREAM_BYTES = 256 << 20
"""Largest streamed response read, after decompression (one event of ~250 bytes per token)."""
MAX_STREAM_EVENTS = 1 << 20
"""Most ``data:`` events one streamed response may send (one per token, and no model has a
context of a million tokens)."""
MAX_ERROR_BODY_BYTES = 64 << 10
"""Bytes of a non-200 body kept for the row's error message; the rest is not read."""


@dataclass
class RequestRecord:
    """Timings and outcome of one request (the reference's RequestRecord, OBS-6/7)."""

    request_id: int
    status: str = "ok"
    error_message: str = ""
    output_tokens: int = 0
    server_input_tokens: int = 0
    send_time_us: int = 0
    first_chunk_time_us: int = 0
    last_chunk_time_us: int = 0
    num_chunks: int = 0
    finish_reason: str = ""
    chunk_timestamps: list[int] = field(default_factory=list)


class InvalidResponse(ValueError):
    """A response that breaks one of this module's rules (the message names the field)."""


class ResponseTooLarge(InvalidResponse):
    """A body over its byte or event limit."""


def _json(text: str | bytes) -> object:
    """``json.loads`` with every parse failure (deep nesting included) as ``ValueError``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def token_count(usage: dict, key: str) -> int | None:
    """``usage[key]`` as a token count; None when absent or not a JSON number.

    Raises :class:`InvalidResponse` for a number that is not a finite whole count in
    ``0..MAX_TOKEN_COUNT``."""
    v = usage.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        raise InvalidResponse(f"usage.{key} = {v!r} is not a whole number of tokens")
    if not 0 <= v <= MAX_TOKEN_COUNT:
        shown = f"{v:.6g}" if abs(v) > 1e15 else f"{int(v)}"
        raise InvalidResponse(f"usage.{key} = {shown} is outside 0..{MAX_TOKEN_COUNT}")
    return int(v)


def finish_reason(obj: dict) -> str:
    """``choices[0].finish_reason`` when it is a string, else ""; too long → InvalidResponse."""
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        fr = choices[0].get("finish_reason")
        if isinstance(fr, str):
            if len(fr) > MAX_FINISH_REASON_CHARS:
                raise InvalidResponse(f"choices[0].finish_reason is {len(fr)} characters long "
                                      f"(at most {MAX_FINISH_REASON_CHARS})")
            return fr
    return ""


def apply_usage(rec: RequestRecord, usage: object) -> None:
    """Set the record's token counts from a ``usage`` object (ignored unless a JSON object)."""
    if not isinstance(usage, dict):
        return
    ct = token_count(usage, "completion_tokens")
    pt = token_count(usage, "prompt_tokens")
    if ct is not None:
        rec.output_tokens = ct
    if pt is not None:
        rec.server_input_tokens = pt


def parse_whole(rec: RequestRecord, body: bytes) -> None:
    """A non-streamed 200 body into ``rec`` (usage, finish reason, OBS-6.3); a body that is not
    a JSON object becomes the reference's ``JSON parse error`` row, a field that breaks a rule
    an ``invalid response`` row. Never raises."""
    try:
        obj = _json(body)
        if not isinstance(obj, dict):
            raise ValueError(f"cannot unmarshal {type(obj).__name__} into an object")
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        rec.status, rec.error_message = "error", f"JSON parse error: {exc}"
        return
    try:
        apply_usage(rec, obj.get("usage"))
        rec.finish_reason = finish_reason(obj)
    except InvalidResponse as exc:
        invalid(rec, exc)


def invalid(rec: RequestRecord, exc: InvalidResponse) -> None:
    """Record a response that broke a rule (``error``, ``invalid response: ...``)."""
    rec.status, rec.error_message = "error", f"invalid response: {exc}"


class StreamParser:
    """An SSE body, fed as it arrives: one chunk per ``data:`` line up to ``[DONE]`` (OBS-6.2).

    :meth:`feed` raises ``LineTooLong`` (the reference's scanner error) and
    :class:`InvalidResponse`; the caller records either. The usage seen last is applied by
    :meth:`finish`, which also runs when the stream broke off."""

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self.usage: dict | None = None
        self.done = False
        self.bytes = 0
        self._lines = LineSplitter()

    def feed(self, data: bytes, now: int) -> None:
        """Bytes read at wall time ``now`` (µs)."""
        self.bytes += len(data)
        if self.bytes > MAX_STREAM_BYTES:
            raise ResponseTooLarge(f"stream longer than {MAX_STREAM_BYTES} bytes")
        self._take(self._lines.feed(data), now)

    def close(self, now: int) -> None:
        """The stream ended: its last line when it had no final newline."""
        self._take(self._lines.close(), now)

    def _take(self, lines: list[str], now: int) -> None:
        rec = self.rec
        for line in lines:
            payload = data_payload(line)
            if payload is None:
                continue
            if payload == DONE:
                self.done = True
                return
            if rec.num_chunks >= MAX_STREAM_EVENTS:
                raise ResponseTooLarge(f"more than {MAX_STREAM_EVENTS} stream events")
            rec.num_chunks += 1
            rec.chunk_timestamps.append(now)
            if rec.num_chunks == 1:
                rec.first_chunk_time_us = now
            rec.last_chunk_time_us = now
            try:
                obj = _json(payload)
            except ValueError:
                continue  # malformed chunk: counted, not parsed (the reference's rule)
            if not isinstance(obj, dict):
                continue
            usage = obj.get("usage")
            if isinstance(usage, dict):
                token_count(usage, "completion_tokens")  # checked as it arrives
                token_count(usage, "prompt_tokens")
                self.usage = usage
            fr = finish_reason(obj)
            if fr:
                rec.finish_reason = fr

    def finish(self) -> None:
        """Apply the last usage seen (checked when it arrived, so this cannot fail)."""
        apply_usage(self.rec, self.usage)


__all__ = ["MAX_BODY_BYTES", "MAX_ERROR_BODY_BYTES", "MAX_STREAM_BYTES", "MAX_STREAM_EVENTS",
           "MAX_TOKEN_COUNT", "InvalidResponse", "RequestRecord", "ResponseTooLarge", "StreamParser", "apply_usage",
           "finish_reason", "invalid", "parse_whole", "token_count"]
