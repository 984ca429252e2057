"""HTTP client for OpenAI-compatible servers: one request, its timings and its outcome (OBS-4, 6, 7).

Built on aiohttp: one event loop drives hundreds of concurrent streams with a pooled
connector, a total per-request timeout covers connection, headers and the whole body (as the
reference's ``http.Client.Timeout`` does), and the body is read as it arrives so each SSE line
gets the wall-clock time of the network read that completed it. Every failure becomes a
record (status ``error``/``timeout`` with the reference's message prefix); nothing raises.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from blis_fast.observe.response import (
    MAX_BODY_BYTES,
    MAX_ERROR_BODY_BYTES,
    InvalidResponse,
    RequestRecord,
    ResponseTooLarge,
    StreamParser,
    invalid,
    parse_whole,
)
from blis_fast.observe.sse import LineTooLong

log = logging.getLogger("blis_fast.observe")

DEFAULT_MAX_OUTPUT_TOKENS = 2048
"""``max_tokens`` sent for a request whose output length is not positive (OBS-4.6)."""

MAX_INT32 = 2147483647
CANCELLED_TEXT = "context canceled"
"""Error text of a request aborted by an interrupt (the reference's context error)."""


def wall_us() -> int:
    """Wall-clock Unix time in microseconds (OBS-0.2)."""
    return time.time_ns() // 1000


@dataclass
class PendingRequest:
    """What is sent for one dispatched request (the reference's PendingRequest)."""

    request_id: int
    input_tokens: int  # intended input length, group prefix included
    max_output_tokens: int
    prompt: str
    streaming: bool
    model: str = ""  # the request's own model tag (recorded, never sent)
    client_id: str = ""
    tenant_id: str = ""
    slo_class: str = ""
    prefix_group: str = ""
    prefix_length: int = 0
    unconstrained: bool = False
    min_tokens: int = 0
    deadline_us: int = 0


def warn_on_finish_reason(request_id: int, finish_reason: str, min_tokens: int,
                          effective_max: int, output_tokens: int) -> None:
    """The reference's finish-reason warnings (OBS-6.5), on stderr only."""
    exact = min_tokens > 0 and effective_max > 0 and min_tokens >= effective_max
    if finish_reason == "length" and not exact:
        log.warning('observe: request %d finish_reason="length" (output may be truncated)',
                    request_id)
    if finish_reason == "abort":
        log.warning('observe: request %d finish_reason="abort" (server aborted request; '
                    "timing data unreliable)", request_id)
    if min_tokens > 0 and finish_reason == "stop" and 0 < output_tokens < min_tokens:
        log.warning("observe: request %d generated %d tokens (< min_tokens=%d); server may not "
                    "support min_tokens", request_id, output_tokens, min_tokens)


def _describe(exc: BaseException) -> str:
    """The exception's own text, or its type name when it has none."""
    return str(exc) or type(exc).__name__


class RealClient:
    """Sends requests to ``<base>/v1/completions`` or ``<base>/v1/chat/completions``.

    Use as ``async with RealClient(...) as client``; the session lives inside one event loop.
    """

    def __init__(self, base_url: str, model: str, api_key: str = "", api_format: str = "completions",
                 timeout_s: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.api_format = api_format
        self.timeout_s = float(timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RealClient:
        host = urlsplit(self.base_url).hostname or ""
        loopback = host in ("localhost", "::1") or host.startswith("127.")
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            trust_env=not loopback,  # proxies from the environment, never for loopback
            auto_decompress=True,
        )
        return self

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def endpoint(self) -> str:
        path = "/v1/chat/completions" if self.api_format == "chat" else "/v1/completions"
        return self.base_url + path

    def body(self, req: PendingRequest) -> dict:
        """The JSON body of a request (OBS-4.6, April level: no ``priority``)."""
        body: dict = {"model": self.model, "stream": req.streaming}
        if not req.unconstrained:
            mx = req.max_output_tokens
            if mx < 0:
                log.warning("PendingRequest.MaxOutputTokens is negative (%d), using default %d",
                            mx, DEFAULT_MAX_OUTPUT_TOKENS)
            body["max_tokens"] = mx if mx > 0 else DEFAULT_MAX_OUTPUT_TOKENS
        elif self.api_format != "chat":
            body["max_tokens"] = MAX_INT32
        if req.min_tokens > 0:
            body["min_tokens"] = req.min_tokens
        if self.api_format == "chat":
            body["messages"] = [{"role": "user", "content": req.prompt}]
        else:
            body["prompt"] = req.prompt
        if req.streaming:
            body["stream_options"] = {"include_usage": True}
        return body

    def headers(self, req: PendingRequest) -> dict[str, str]:
        """Request headers: JSON content type, bearer key, GIE tenant/objective (OBS-4.6)."""
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        if req.tenant_id:
            h["x-gateway-inference-fairness-id"] = req.tenant_id
        if req.slo_class:
            h["x-gateway-inference-objective"] = req.slo_class
        return h

    def _effective_max(self, req: PendingRequest) -> int:
        if not req.unconstrained:
            return req.max_output_tokens if req.max_output_tokens > 0 else DEFAULT_MAX_OUTPUT_TOKENS
        return MAX_INT32 if self.api_format != "chat" else 0

    def encode(self, req: PendingRequest) -> bytes | str:
        """The request body as JSON bytes, or the marshal error text (done ahead of the send
        time so pacing does not pay for it)."""
        try:
            return json.dumps(self.body(req)).encode("utf-8")
        except (TypeError, ValueError) as exc:
            return f"marshal error: {exc}"

    async def send(self, req: PendingRequest, timeout_s: float | None = None,
                   encoded: bytes | str | None = None) -> RequestRecord:
        """Send one request and return its record; never raises (an interrupt while the
        request is in flight is recorded as ``error`` with a ``context canceled`` text).
        ``encoded`` is :meth:`encode`'s result when the caller prepared it already."""
        rec = RequestRecord(request_id=req.request_id)
        url = self.endpoint
        data = self.encode(req) if encoded is None else encoded
        if isinstance(data, str):
            rec.status, rec.error_message = "error", data
            return rec
        assert self._session is not None, "RealClient used outside 'async with'"
        kwargs = {}
        if timeout_s is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        phase = "connect"
        rec.send_time_us = wall_us()
        try:
            async with self._session.post(url, data=data, headers=self.headers(req),
                                          **kwargs) as resp:
                if resp.status != 200:
                    phase = "status"
                    body, cut = await _read_partial(resp)
                    rec.status = "error"
                    rec.error_message = f"HTTP {resp.status}: {body.decode('utf-8', 'replace')}"
                    if cut:
                        rec.error_message += f" [body cut at {MAX_ERROR_BODY_BYTES} bytes]"
                    return rec
                if req.streaming:
                    phase = "stream"
                    await self._read_stream(resp, rec)
                else:
                    phase = "body"
                    await self._read_whole(resp, rec)
        except asyncio.CancelledError:
            _fail(rec, phase, url, CANCELLED_TEXT, timeout=False)
            return rec
        except TimeoutError as exc:
            _fail(rec, phase, url, _describe(exc) if str(exc) else "deadline exceeded",
                  timeout=True)
            return rec
        except InvalidResponse as exc:
            invalid(rec, exc)
            if phase == "stream":
                log.warning("observe: request %d: %s", rec.request_id, rec.error_message)
            return rec
        except (aiohttp.ClientError, LineTooLong, OSError, ValueError) as exc:
            _fail(rec, phase, url, _describe(exc), timeout=False)
            return rec
        if rec.status == "ok":
            warn_on_finish_reason(req.request_id, rec.finish_reason, req.min_tokens,
                                  self._effective_max(req), rec.output_tokens)
        return rec

    async def get_text(self, url: str, timeout_s: float) -> str:
        """``GET url`` with the bearer key, the body as UTF-8 text (at most ``MAX_BODY_BYTES``
        after decompression). Raises ``ValueError`` with a one-line reason for a transport
        error, a timeout, a status other than 200, a body too long or not UTF-8."""
        assert self._session is not None, "RealClient used outside 'async with'"
        headers = {"Authorization": "Bearer " + self.api_key} if self.api_key else {}
        parts = []
        size = 0
        try:
            async with self._session.get(url, headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    raise ValueError(f"GET {url}: HTTP {resp.status}")
                async for piece in resp.content.iter_any():
                    size += len(piece)
                    if size > MAX_BODY_BYTES:
                        resp.close()  # stop reading: the rest may be endless
                        raise ValueError(f"GET {url}: body longer than {MAX_BODY_BYTES} bytes")
                    parts.append(piece)
        except TimeoutError:
            raise ValueError(f"GET {url}: no complete answer within {timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ValueError(f"GET {url}: {_describe(exc)}") from None
        try:
            return b"".join(parts).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"GET {url}: body is not UTF-8 text ({exc.reason} at byte "
                             f"{exc.start})") from None

    async def _read_whole(self, resp: aiohttp.ClientResponse, rec: RequestRecord) -> None:
        """Non-streaming body (at most ``MAX_BODY_BYTES``, decompressed): first byte and end
        times, one chunk, then :func:`~blis_fast.observe.response.parse_whole` (OBS-6.3)."""
        parts = []
        first = 0
        size = 0
        async for piece in resp.content.iter_any():
            if piece and not first:
                first = wall_us()
            size += len(piece)
            if size > MAX_BODY_BYTES:
                resp.close()  # stop reading: the rest may be endless
                raise ResponseTooLarge(f"body longer than {MAX_BODY_BYTES} bytes")
            parts.append(piece)
        now = wall_us()
        rec.first_chunk_time_us = first or now
        rec.last_chunk_time_us = now
        rec.num_chunks = 1
        parse_whole(rec, b"".join(parts))

    async def _read_stream(self, resp: aiohttp.ClientResponse, rec: RequestRecord) -> None:
        """SSE body (:class:`~blis_fast.observe.response.StreamParser`, OBS-6.2). A read error,
        a timeout or a broken rule keeps the chunks seen so far; the caller records it."""
        parser = StreamParser(rec)
        try:
            async for piece in resp.content.iter_any():
                parser.feed(piece, wall_us())
                if parser.done:
                    break
            else:
                parser.close(wall_us())
        except (InvalidResponse, LineTooLong):
            resp.close()
            raise
        finally:
            if parser.usage is None and rec.num_chunks > 0:
                log.warning("observe: request %d: streaming response had %d chunks but no usage "
                            "data (missing stream_options?)", rec.request_id, rec.num_chunks)
            parser.finish()


async def _read_partial(resp: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The body of a non-200 response, or as much of it as arrived (the reference ignores the
    read error here), up to ``MAX_ERROR_BODY_BYTES``: the rest is not read (an endless body
    cannot grow memory); True with it when it was cut."""
    parts = []
    size = 0
    try:
        async for piece in resp.content.iter_any():
            parts.append(piece)
            size += len(piece)
            if size > MAX_ERROR_BODY_BYTES:
                resp.close()
                return b"".join(parts)[:MAX_ERROR_BODY_BYTES], True
    except (aiohttp.ClientError, TimeoutError, OSError):
        pass
    return b"".join(parts), False


def _fail(rec: RequestRecord, phase: str, url: str, text: str, timeout: bool) -> None:
    """Record a failure with the reference's prefix for the phase it happened in (OBS-7)."""
    rec.status = "timeout" if timeout else "error"
    if phase == "connect":
        prefix = "HTTP timeout" if timeout else "HTTP error"
        rec.error_message = f'{prefix}: Post "{url}": {text}'
    elif phase == "stream":
        rec.error_message = ("streaming timeout: " if timeout else "streaming error: ") + text
        log.warning("observe: request %d: SSE scanner error: %s", rec.request_id, text)
    elif phase == "body":
        rec.error_message = ("read timeout: " if timeout else "read error: ") + text
    else:
        rec.error_message = ("HTTP timeout: " if timeout else "HTTP error: ") + text
