"""``blis serve``: a live blis_fast simulation behind an OpenAI-compatible HTTP API (aiohttp).

A client sees a vLLM server: ``POST /v1/completions`` and ``/v1/chat/completions`` (streamed as
server-sent events or answered whole), ``GET /v1/models``, ``/health``, ``/ready``,
``/version`` and ``/metrics``, with vLLM's error bodies. Behind it, every request enters the
running simulation (``serve.live.LiveSimulation``) at the instant it arrives, and its tokens are
sent when the simulation produces them: the timing is the product, the text is filler.

Time: the simulated clock is ``(monotonic() - start) * speed`` (µs). One asyncio task advances
the simulation to "now", hands each request's new tokens to its handler at once (they are due:
the simulation never runs past the time it is told), then sleeps until the wall time of the
next simulated event, or until a new request wakes it.

Errors follow vLLM's OpenAI server (``vllm/entrypoints/openai``): the body is
``{"error": {"message", "type", "param", "code"}}`` (``engine/protocol.py: ErrorResponse``);
a body that is not JSON or misses a required field is 400 with type ``Bad Request`` (the
``RequestValidationError`` handler of ``api_server.py``); an unknown model is 404
``NotFoundError`` with ``param: "model"`` (``serving.py: _check_model``); a prompt at or over
max-model-len, or a prompt plus ``max_tokens`` over it, is 400 ``BadRequestError`` with vLLM's
message. vLLM itself never refuses a request for load; the simulation's admission policy
(``--admission-policy``, e.g. a token bucket) can: such a request is answered 429 Too Many
Requests (the client was rate limited and may retry later, as a gateway in front of vLLM
says it), and 503 Service Unavailable is kept for a server that is shutting down.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from aiohttp import web

from blis_fast.observe.prompts import VOCABULARY
from blis_fast.serve.metrics import CONTENT_TYPE, ServeMetrics, snapshot_from_gauges
from blis_fast.serve.timer import open_timer
from blis_fast.version import __version__

CHARS_PER_TOKEN = 4
"""The prompt-length estimate without a tokenizer: one token per 4 characters (rounded up),
OpenAI's rule of thumb for English text; a chat prompt is estimated on its messages' contents
plus 4 tokens per message for the chat template's role markers."""
CHAT_TOKENS_PER_MESSAGE = 4
MAX_DRAWN_LENGTH = 1 << 24

FILLER_WORDS = (
    "the", "simulated", "fleet", "answers", "with", "filler", "text", "while", "its", "timing",
    "follows", "batching", "queueing", "and", "cache", "pressure", "of", "a", "real", "server",
    "under", "load", "so", "routers", "and", "autoscalers", "see", "what", "they", "would",
    "see", "in", "production")
"""Word mode's text: token k of a request is word k of this list, cyclically."""

TIMER_SLACK_S = 0.001
"""Where there is no timerfd (``serve.timer``; not Linux): the time loop's timer fires this long
before the next simulated event's wall time and yields to the other tasks until it is due:
asyncio's timers fire up to a millisecond late (the selector's timeout is rounded up to whole
milliseconds), which the tokens' pacing would inherit."""
SPIN_STREAMS = 64
"""Above this many requests in flight the timer alone paces the loop: its millisecond is small
next to the lag of a loaded server, and the yielding turns cost CPU (~5 µs a token at 500
streams)."""

FINISHED_OK = ("completed",)
REJECTED = "rejected"
DROPPED = "dropped"
ABORTED = "aborted"
TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class ServeConfig:
    """What the HTTP layer needs besides the simulation."""

    model: str
    speed: float = 1.0
    default_output_tokens: int = 128
    default_output_stdev: float = 0.0  # > 0: the default length is drawn, normal, per request
    seed: int = 42  # of those draws (in arrival order)
    content: str = "words"  # "words" | "echo"
    block_size: int = 16
    external_routing: bool = False
    count_tokens: Callable[[str], int] | None = None  # a tokenizer's count, or the estimate


def estimate_tokens(text: str) -> int:
    """The documented estimate of a text's token count: one token per vocabulary word when
    the text is made of ``blis observe``'s prompt words alone (:func:`vocabulary_words`), else
    one per :data:`CHARS_PER_TOKEN` characters."""
    words = vocabulary_words(text)
    if words:
        return words
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN)) if text else 0


_OBSERVE_WORDS = frozenset(VOCABULARY)


def vocabulary_words(text: str) -> int:
    """The number of words of ``text`` if every one is a word of ``blis observe``'s prompt
    vocabulary (``observe.prompts.VOCABULARY``), else 0.

    Why: observe writes a prompt of ``n`` intended tokens as ``round(n / ratio)`` such words,
    ``ratio`` being the tokens per word it measured on this server with its probe of the 100
    words. Counting them one token each makes that ratio 1, so the server simulates exactly
    the ``input_tokens`` observe records, and ``blis replay`` of the observed trace feeds the
    simulation the same lengths the server did."""
    words = text.split()
    if not words or not _OBSERVE_WORDS.issuperset(words):
        return 0
    return len(words)


def load_token_counter(model: str) -> tuple[Callable[[str], int], str]:
    """The model's tokenizer if ``transformers`` and the tokenizer files are on this machine
    (``AutoTokenizer`` with ``local_files_only``: nothing is downloaded), else the estimate.
    Returns the counter and a few words saying which one it is."""
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]

        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception:  # not installed, no local files, a broken cache: the estimate serves
        return estimate_tokens, f"estimated ({CHARS_PER_TOKEN} characters per token)"

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=True)["input_ids"])

    return count, f"tokenizer of {model}"


class RequestError(Exception):
    """A request the API refuses: HTTP status, vLLM's error type and the parameter named."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type
        self.param = param


def error_body(status: int, message: str, err_type: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse`` as JSON: ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": err_type or HTTPStatus(status).phrase,
                      "param": param, "code": status}}


def error_response(err: RequestError) -> web.Response:
    """The HTTP answer of a refused request."""
    return web.json_response(error_body(err.status, str(err), err.err_type, err.param),
                             status=err.status)


@dataclass
class _Stream:
    """One request in flight: what its handler needs and what its metrics need."""

    handle: int
    rid: str
    instance: int
    arrival_us: int
    prompt_tokens: int
    output_tokens: int
    length_limited: bool  # max_tokens was given and is the output length: finish "length"
    words: tuple[str, ...]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    first_us: int | None = None
    last_us: int | None = None
    seen: int = 0  # tokens the simulation produced
    held: int = 0  # the last token, held until the request ends
    sent: int = 0  # tokens written to the client
    done: bool = False
    status: str = "running"
    # writes n token chunks now (a live stream); with ``end`` the last of them carries the
    # finish reason and the stream's closing events follow; False when the client is gone
    direct: Callable[[int, bool], bool] | None = None


@dataclass
class _Parsed:
    """A validated completion request."""

    prompt_text: str
    prompt_tokens: int
    max_tokens: int | None
    stream: bool
    include_usage: bool


class LiveServer:
    """The live simulation and the HTTP applications that feed it (one per listening port).

    ``sim`` is a ``LiveSimulation`` (or anything with its interface); every method runs on
    the event loop's thread, so the simulation is never touched concurrently.
    """

    def __init__(self, sim: Any, config: ServeConfig) -> None:
        self.sim = sim
        self.config = config
        self.count_tokens = config.count_tokens or estimate_tokens
        self.metrics = ServeMetrics(config.model, sim.num_instances, self._gauges)
        self._streams: dict[int, _Stream] = {}
        self._ids = itertools.count(1)
        self._start = time.monotonic()
        self._advanced = 0
        self._wake: asyncio.Event | None = None
        self._poked = False  # told something since the loop last looked (poke)
        self._task: asyncio.Task | None = None
        self.closing = False
        self.failure: BaseException | None = None  # what stopped the time loop, if anything
        self.failed: asyncio.Event | None = None
        self.served = 0  # requests that ended with their last token
        self._enc_cache: dict[str, bytes] = {}
        self._rng = random.Random(config.seed)
        self._unanswered: set[int] = set()  # streams whose headers wait for admission

    # ----- the clock and the time loop -----

    def sim_now_us(self) -> int:
        """The simulated time now (µs), never before the last time advanced to."""
        now = int((time.monotonic() - self._start) * self.config.speed * 1e6)
        return max(now, self._advanced)

    def wall_of(self, sim_us: int) -> float:
        """The monotonic wall time at which the simulated clock reads ``sim_us``."""
        return self._start + sim_us / self.config.speed / 1e6

    def _gauges(self):
        return snapshot_from_gauges(self.sim.gauges(), self.config.block_size)

    async def start(self) -> None:
        """Start the time loop on the running event loop (the simulated clock reads 0 now)."""
        self._start = time.monotonic()
        self._wake = asyncio.Event()
        self.failed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the simulation failed: end every stream, stop the server
            self.failure = exc
            await self.shutdown(from_loop=True)
            if self.failed is not None:
                self.failed.set()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wake is not None
        timer = open_timer(loop, self._tick)
        try:
            while True:
                now = self.sim_now_us()
                if now > self._advanced or not self._advanced:
                    emitted = self.sim.advance(now)
                    self._advanced = now
                    self._dispatch(emitted)
                    if self._unanswered:
                        self._answer_admitted()
                nxt = self.sim.next_event_us()
                self._wake.clear()
                if nxt is None:
                    await self._wake.wait()
                    continue
                target = self.wall_of(nxt)
                if timer is not None:
                    # the kernel's timer wakes the loop at the instant, no CPU meanwhile; a
                    # new request or a cancellation wakes it earlier. At least one yield per
                    # turn, even when the event is already due: a loop that is behind must
                    # still let the handlers run
                    if target > time.monotonic():
                        timer.arm(target)
                        await self._wake.wait()
                    else:
                        await asyncio.sleep(0)
                    continue
                await self._wait_until(loop, target)
        finally:
            if timer is not None:
                timer.close()

    async def _wait_until(self, loop: asyncio.AbstractEventLoop, target: float) -> None:
        """Without a timerfd: asyncio's timer to a millisecond before ``target``, then the
        last stretch yielded away, not slept (a timer fires up to a millisecond late: epoll
        rounds its timeout up to whole ms); a new request or a cancellation ends it at once.
        At least one yield per turn, even when the event is already due."""
        assert self._wake is not None
        delay = target - time.monotonic()
        slack = TIMER_SLACK_S if len(self._streams) <= SPIN_STREAMS else 0.0
        if delay > slack:
            timer = loop.call_later(delay - slack, self._tick)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()
        await asyncio.sleep(0)
        while not self._poked and time.monotonic() < target:
            await asyncio.sleep(0)
        self._poked = False

    def _tick(self) -> None:
        """The time loop's timer: wake it for the last stretch before the next event."""
        if self._wake is not None:
            self._wake.set()

    def poke(self) -> None:
        """Wake the time loop now: the simulation was told something (a submission, a
        cancellation), so its next event may be earlier."""
        self._poked = True
        if self._wake is not None:
            self._wake.set()

    def _answer_admitted(self) -> None:
        """Tell each waiting stream whose request the simulation took (its arrival is past
        and it is running) to send its response headers now, as vLLM does on acceptance: the
        client then has them in hand before the first token, whose chunk alone is timed."""
        status = getattr(self.sim, "status", None)
        for handle in list(self._unanswered):
            st = self._streams.get(handle)
            if st is None or st.done or status is None:
                self._unanswered.discard(handle)
            elif self._advanced > st.arrival_us and status(handle) == "running":
                self._unanswered.discard(handle)
                st.queue.put_nowait(_News(0, False, "running"))

    def _dispatch(self, emitted: list) -> None:
        for e in emitted:
            st = self._streams.get(e.handle)
            if st is None:
                continue
            inst = getattr(e, "instance", -1)
            if inst is None or inst < 0:
                inst = st.instance
            else:
                st.instance = inst
            gaps = []
            for t in e.tokens:
                if st.first_us is None:
                    st.first_us = t
                    self.metrics.first_token(inst, t - st.arrival_us, st.prompt_tokens)
                else:
                    gaps.append(t - st.last_us)
                st.last_us = t
            st.seen += len(e.tokens)
            self.metrics.tokens(inst, len(e.tokens), gaps)
            count = len(e.tokens) + st.held
            st.held = 0
            if e.finished:
                st.done = True
                st.status = e.status
                self._streams.pop(e.handle, None)
                self._record_end(st, e)
            elif count and st.seen >= st.output_tokens:
                # the last token goes out with the end of the request (its end_us: the
                # simulation's E2E includes the work after the last decode step), carrying
                # finish_reason as vLLM's last chunk does
                st.held, count = 1, count - 1
            if st.direct is not None and not e.finished:
                if count:
                    st.direct(count, False)  # the stream is live: write now, no task switch
            elif (st.direct is not None and count and e.status in FINISHED_OK
                  and st.direct(count, True)):
                # its last token, usage and [DONE] are on the wire: the handler only ends it
                st.queue.put_nowait(_News(0, True, e.status, True))
            elif count or e.finished:
                st.queue.put_nowait(_News(count, e.finished, e.status))

    def _record_end(self, st: _Stream, e: Any) -> None:
        if e.status in FINISHED_OK:
            reason = "length" if st.length_limited else "stop"
            self.served += 1
        elif e.status == ABORTED and st.first_us is not None:
            reason = "abort"
        else:
            return  # refused before the engine took it: vLLM would never have seen it
        end = getattr(e, "end_us", None)
        if end is None:
            end = st.last_us if st.last_us is not None else self._advanced
        scheduled = getattr(e, "scheduled_us", None)
        self.metrics.finished(st.instance, reason, end - st.arrival_us,
                              end - (st.first_us if st.first_us is not None else end),
                              st.seen,
                              None if scheduled is None else scheduled - st.arrival_us)

    # ----- requests -----

    def submit(self, parsed: _Parsed, instance: int | None,
               arrived_us: int | None = None) -> _Stream:
        """Put a validated request into the simulation; returns its stream. ``arrived_us``:
        the simulated instant its handler started (before the body was read and parsed), so
        the server's own parsing time is not counted as the client's; never before a time the
        simulation was already told."""
        now = self.sim_now_us()
        if arrived_us is not None:
            now = max(arrived_us, self._advanced, int(getattr(self.sim, "now_us", 0)))
        out = parsed.max_tokens
        if out is None:  # the default, within max-model-len (0: unlimited)
            room = self.sim.max_model_len - parsed.prompt_tokens
            out = self._default_length()
            out = min(out, max(1, room)) if self.sim.max_model_len > 0 else out
        rid = f"{next(self._ids)}"
        handle = self.sim.submit(now, parsed.prompt_tokens, out, instance=instance,
                                 request_id=rid)
        words = (tuple(parsed.prompt_text.split()) or FILLER_WORDS
                 if self.config.content == "echo" else FILLER_WORDS)
        st = _Stream(handle=handle, rid=rid, instance=instance or 0, arrival_us=now,
                     prompt_tokens=parsed.prompt_tokens, output_tokens=out,
                     length_limited=parsed.max_tokens is not None, words=words)
        self._streams[handle] = st
        self.poke()
        return st

    def _default_length(self) -> int:
        """The output length of a request without max_tokens: ``--default-output-tokens``,
        or a draw from the normal distribution it names (rounded, at least 1)."""
        mean, stdev = self.config.default_output_tokens, self.config.default_output_stdev
        if stdev <= 0:
            return mean
        return max(1, min(MAX_DRAWN_LENGTH, round(self._rng.gauss(mean, stdev))))

    def cancel(self, st: _Stream) -> None:
        """The client is gone: abort its request in the simulation (its KV is freed)."""
        if st.done:
            return
        st.done = True
        st.status = ABORTED
        self._streams.pop(st.handle, None)
        with contextlib.suppress(Exception):
            self.sim.cancel(st.handle, self.sim_now_us())
        if st.first_us is not None:
            end = st.last_us if st.last_us is not None else st.first_us
            self.metrics.finished(st.instance, "abort", end - st.arrival_us,
                                  end - st.first_us, st.seen, None)
        self.poke()

    def _encoded(self, text: str) -> bytes:
        """``text`` as a JSON string (bytes), cached: the filler has few distinct words."""
        enc = self._enc_cache.get(text)
        if enc is None:
            enc = json.dumps(text).encode()
            if len(self._enc_cache) < 65536:
                self._enc_cache[text] = enc
        return enc

    def token_text(self, st: _Stream, k: int) -> str:
        """The text of token ``k`` (0-based) of a request: a word, space-separated."""
        word = st.words[k % len(st.words)]
        return word if k == 0 else " " + word

    # ----- parsing -----

    def parse(self, body: Any, chat: bool) -> _Parsed:
        """Validate a completion request body as vLLM does; raises :class:`RequestError`."""
        if not isinstance(body, dict):
            raise RequestError(400, "Input should be a valid dictionary or object to extract "
                               "fields from", "Bad Request")
        model = body.get("model", self.config.model)
        if model is not None and model != self.config.model:
            raise RequestError(404, f"The model `{model}` does not exist.", "NotFoundError",
                               "model")
        n = body.get("n", 1)
        if n is not None and n != 1:
            raise RequestError(400, "n must be 1: blis serve simulates one sequence per "
                               "request", param="n")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError(400, "Field required: messages" if messages is None else
                                   "messages must be a non-empty list", "Bad Request",
                                   "messages")
            text, tokens = self._chat_prompt(messages)
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            max_name = ("max_completion_tokens" if "max_completion_tokens" in body
                        else "max_tokens")
        else:
            if "prompt" not in body:
                raise RequestError(400, "Field required: prompt", "Bad Request", "prompt")
            text, tokens = self._completion_prompt(body["prompt"])
            max_tokens = body.get("max_tokens")
            max_name = "max_tokens"
        if max_tokens is not None:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
                raise RequestError(400, f"{max_name} must be an integer", "Bad Request",
                                   max_name)
            if max_tokens < 1:
                raise RequestError(400, f"{max_name} must be at least 1, got {max_tokens}.",
                                   param=max_name)
        min_tokens = body.get("min_tokens", 0)
        if (isinstance(min_tokens, bool) or not isinstance(min_tokens, int)
                or min_tokens < 0):
            raise RequestError(400, f"min_tokens must be greater than or equal to 0, got "
                               f"{min_tokens}.", param="min_tokens")
        if max_tokens is not None and min_tokens > max_tokens:
            raise RequestError(400, f"min_tokens must be less than or equal to max_tokens="
                               f"{max_tokens}, got {min_tokens}.", param="min_tokens")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError(400, "stream must be a boolean", "Bad Request", "stream")
        opts = body.get("stream_options")
        if opts is not None and not stream:
            raise RequestError(400, "Stream options can only be defined when `stream=True`.",
                               param="stream_options")
        if opts is not None and not isinstance(opts, dict):
            raise RequestError(400, "stream_options must be an object", "Bad Request",
                               "stream_options")
        include_usage = bool(opts.get("include_usage", False)) if opts else False
        if tokens < 1:
            raise RequestError(400, "The prompt cannot be empty.", param="prompt")
        self._check_length(tokens, max_tokens)
        return _Parsed(text, tokens, max_tokens, stream, include_usage)

    def _completion_prompt(self, prompt: Any) -> tuple[str, int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return prompt, self.count_tokens(prompt)
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return " ".join(map(str, prompt)), len(prompt)
        raise RequestError(400, "prompt must be a string, a list of token ids, or a batch of "
                           "one of them (blis serve takes one prompt per request)",
                           "Bad Request", "prompt")

    def _chat_prompt(self, messages: list) -> tuple[str, int]:
        parts = []
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise RequestError(400, "each message must be an object with a role",
                                   "Bad Request", "messages")
            content = m.get("content") or ""
            if isinstance(content, list):  # content parts: their texts
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise RequestError(400, "message content must be a string or a list of parts",
                                   "Bad Request", "messages")
            parts.append(content)
        text = "\n".join(parts)
        if self.count_tokens is estimate_tokens:
            if all(vocabulary_words(p) for p in parts):  # observe's words: no template tokens
                return text, sum(vocabulary_words(p) for p in parts)
            return text, sum(estimate_tokens(p) for p in parts) + CHAT_TOKENS_PER_MESSAGE * len(
                parts)
        return text, self.count_tokens(text)

    def _check_length(self, tokens: int, max_tokens: int | None) -> None:
        limit = self.sim.max_model_len
        if limit <= 0:  # unlimited
            return
        if tokens >= limit:
            raise RequestError(400, f"This model's maximum context length is {limit} tokens. "
                               f"However, your request has {tokens} input tokens. Please "
                               "reduce the length of the input messages.",
                               param="input_tokens")
        if max_tokens is not None and tokens + max_tokens > limit:
            raise RequestError(400, f"'max_tokens' or 'max_completion_tokens' is too large: "
                               f"{max_tokens}. This model's maximum context length is {limit} "
                               f"tokens and your request has {tokens} input tokens "
                               f"({max_tokens} > {limit} - {tokens}).", param="max_tokens")

    # ----- HTTP -----

    def build_app(self, instance: int | None = None) -> web.Application:
        """The application of one port: the fleet's (``instance`` None) or one instance's."""
        app = web.Application(client_max_size=16 * 1024 * 1024)

        async def completions(request: web.Request) -> web.StreamResponse:
            return await self._handle(request, chat=False, instance=instance)

        async def chat(request: web.Request) -> web.StreamResponse:
            return await self._handle(request, chat=True, instance=instance)

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{
                "id": self.config.model, "object": "model", "created": int(time.time()),
                "owned_by": "vllm", "root": self.config.model, "parent": None,
                "max_model_len": self.sim.max_model_len or None, "permission": []}]})

        async def health(request: web.Request) -> web.Response:
            return web.Response(status=503 if self.closing else 200)

        async def ready(request: web.Request) -> web.Response:
            return web.json_response({"ready": not self.closing},
                                     status=503 if self.closing else 200)

        async def version(request: web.Request) -> web.Response:
            return web.json_response({"version": __version__})

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=self.metrics.exposition(instance),
                                headers={"Content-Type": CONTENT_TYPE})

        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/health", health)
        app.router.add_get("/ready", ready)
        app.router.add_get("/version", version)
        app.router.add_get("/metrics", metrics)
        return app

    async def _handle(self, request: web.Request, chat: bool,
                      instance: int | None) -> web.StreamResponse:
        if self.closing:
            return error_response(RequestError(503, "the server is shutting down",
                                               "Service Unavailable"))
        if self.config.external_routing and instance is None:
            return error_response(RequestError(
                400, "this fleet is routed externally (--instance-ports): send the request "
                "to an instance's port", "BadRequestError"))
        arrived = self.sim_now_us()
        try:
            raw = await request.read()
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise RequestError(400, f"JSON decode error: {exc}", "Bad Request") from None
            parsed = self.parse(body, chat)
        except RequestError as err:
            return error_response(err)
        try:
            st = self.submit(parsed, instance, arrived)
        except Exception as exc:  # the simulation refused it: a server error, one line
            return error_response(RequestError(500, f"the simulation could not take the "
                                               f"request: {exc}", "InternalServerError"))
        try:
            if parsed.stream:
                return await self._stream(request, st, parsed, chat)
            return await self._whole(st, parsed, chat)
        finally:
            if not st.done:
                self.cancel(st)

    async def _next(self, st: _Stream) -> Any:
        return await st.queue.get()

    def _refusal(self, e: Any) -> RequestError | None:
        """The HTTP error of a request the simulation ended before its first token."""
        if e.status == REJECTED:
            return RequestError(429, "the simulated fleet's admission policy rejected the "
                                "request", "Too Many Requests")
        if e.status == DROPPED:
            return RequestError(400, "the request cannot be served: it needs more KV cache "
                                "than an instance has", param="input_tokens")
        if e.status == TIMED_OUT:
            return RequestError(504, "the request timed out before its first token",
                                "Gateway Timeout")
        if e.status == "shutdown":
            return RequestError(503, "the server is shutting down", "Service Unavailable")
        if e.status == ABORTED:
            return RequestError(500, "the request was aborted", "Internal Server Error")
        return None

    def _ids_of(self, st: _Stream, chat: bool) -> tuple[str, str, int]:
        prefix = "chatcmpl" if chat else "cmpl"
        return f"{prefix}-blis-{st.rid}", "chat.completion" if chat else "text_completion", int(
            time.time())

    def _usage(self, st: _Stream) -> dict[str, int]:
        return {"prompt_tokens": st.prompt_tokens, "total_tokens": st.prompt_tokens + st.sent,
                "completion_tokens": st.sent}

    def _finish_reason(self, st: _Stream) -> str:
        if st.status in FINISHED_OK:
            return "length" if st.length_limited else "stop"
        return "abort"

    async def _whole(self, st: _Stream, parsed: _Parsed, chat: bool) -> web.Response:
        pieces: list[str] = []
        while True:
            e = await self._next(st)
            if not e.count and e.finished and st.first_us is None:
                err = self._refusal(e)
                if err is not None:
                    return error_response(err)
            for _ in range(e.count):
                pieces.append(self.token_text(st, st.sent))
                st.sent += 1
            if e.finished:
                break
        rid, obj, created = self._ids_of(st, chat)
        text = "".join(pieces)
        reason = self._finish_reason(st)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                              "tool_calls": []},
                      "logprobs": None, "finish_reason": reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                      "stop_reason": None, "prompt_logprobs": None}
        return web.json_response({"id": rid, "object": obj, "created": created,
                                  "model": self.config.model, "choices": [choice],
                                  "usage": self._usage(st)})

    async def _stream(self, request: web.Request, st: _Stream, parsed: _Parsed,
                      chat: bool) -> web.StreamResponse:
        self._unanswered.add(st.handle)
        e = await self._next(st)
        self._unanswered.discard(st.handle)
        if not e.count and e.finished:
            err = self._refusal(e)
            if err is not None:
                return error_response(err)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            await self._write_events(request, resp, st, parsed, chat, e)
        except (ConnectionResetError, ConnectionError):
            self.cancel(st)  # the client went away mid-stream
        return resp

    async def _write_events(self, request: web.Request, resp: web.StreamResponse,
                            st: _Stream, parsed: _Parsed, chat: bool, e: Any) -> None:
        rid, _, created = self._ids_of(st, chat)
        obj = "chat.completion.chunk" if chat else "text_completion"
        model = self.config.model

        def chunk(choices: list, usage: dict | None = None) -> bytes:
            payload: dict[str, Any] = {"id": rid, "object": obj, "created": created,
                                       "model": model, "choices": choices}
            if usage is not None:
                payload["usage"] = usage
            return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

        def token_choice(text: str, reason: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text}, "logprobs": None,
                        "finish_reason": reason}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                    "stop_reason": None}

        def ending(last_token: bool) -> bytes:
            """The stream's closing events: the last token's chunk with the finish reason (an
            empty one when it ended without a last token: aborted, shut down), the usage
            chunk when asked for, [DONE]."""
            text = ""
            if last_token:
                text = self.token_text(st, st.sent)
                st.sent += 1
            parts = [chunk([token_choice(text, self._finish_reason(st))])]
            if parsed.include_usage:
                parts.append(chunk([], self._usage(st)))
            parts.append(b"data: [DONE]\n\n")
            return b"".join(parts)

        # a token's chunk is the same bytes around its text: made once per stream (the JSON
        # encoder per chunk was the server's largest cost under 500 streams)
        marker = "\x00"
        head, tail = chunk([token_choice(marker, None)]).split(json.dumps(marker).encode())
        if chat:
            await resp.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}]))
        while not e.written:
            n = e.count
            mid = n - 1 if e.finished else n  # the last token's chunk carries the reason
            if mid > 0:
                parts = []
                for _ in range(mid):
                    parts += (head, self._encoded(self.token_text(st, st.sent)), tail)
                    st.sent += 1
                await resp.write(b"".join(parts))
            if e.finished:
                await resp.write(ending(n > 0))
                break
            if st.queue.empty() and st.direct is None:
                st.direct = self._direct_writer(request, st, head, tail, ending)
            e = await self._next(st)
        await resp.write_eof()

    def _direct_writer(self, request: web.Request, st: _Stream, head: bytes, tail: bytes,
                       ending: Callable[[bool], bytes]) -> Callable[[int, bool], bool] | None:
        """A function that writes a live stream's next ``n`` token chunks straight to its
        socket, framed as HTTP/1.1 chunks (the response is chunked), from the time loop; at
        the stream's end (``end``) the last of them is ``ending``'s (the finish reason, usage,
        [DONE]), and the handler is left only the terminating chunk.

        With hundreds of streams, waking each request's handler for each token (a queue, a
        task switch, aiohttp's write and drain per chunk) cost more than the simulation, and
        the last token waited for its handler's turn; the time loop writes instead. The bytes
        are those the handler would write; a client that is gone cancels its request (False).
        """
        transport = request.transport
        if transport is None:
            return None
        words = st.words
        period = len(words)
        # token k's framed chunk depends only on k mod the word count (and k == 0, which has
        # no leading space): made once per stream and word, not once per token
        framed: list[bytes | None] = [None] * period
        opening: list[bytes] = []

        def http_chunk(body: bytes) -> bytes:
            return b"%x\r\n%b\r\n" % (len(body), body)

        def frame(k: int) -> bytes:
            return http_chunk(head + self._encoded(self.token_text(st, k)) + tail)

        def chunk_of(k: int) -> bytes:
            if k == 0:
                if not opening:
                    opening.append(frame(0))
                return opening[0]
            j = k % period
            data = framed[j]
            if data is None:
                data = framed[j] = frame(k)
            return data

        def write(n: int, end: bool) -> bool:
            if transport.is_closing():
                if not end:  # a finished request has nothing left to cancel
                    self.cancel(st)
                    st.queue.put_nowait(_News(0, True, ABORTED))
                return False
            k = st.sent
            mid = n - 1 if end else n
            st.sent = k + mid
            data = (b"" if mid == 0 else chunk_of(k) if mid == 1 else
                    b"".join([chunk_of(j) for j in range(k, k + mid)]))
            if end:
                data += http_chunk(ending(True))
            transport.write(data)
            return True

        return write

    async def shutdown(self, from_loop: bool = False) -> None:
        """Stop taking requests and end every stream in flight cleanly (a last chunk with
        finish_reason ``abort``, then ``[DONE]``; a non-streamed request gets a 503)."""
        self.closing = True
        now = self.sim_now_us()
        for st in list(self._streams.values()):
            self._streams.pop(st.handle, None)
            with contextlib.suppress(Exception):
                self.sim.cancel(st.handle, now)
            st.done = True
            st.status = "shutdown" if st.first_us is None else ABORTED
            st.queue.put_nowait(_News(0, True, st.status))
        await asyncio.sleep(0)
        if self._task is not None and not from_loop:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass(frozen=True)
class _News:
    """What a request's handler is told: ``count`` more tokens to send, and whether (and
    how) the request ended."""

    count: int
    finished: bool
    status: str
    written: bool = False  # the time loop wrote the stream's last events: only the end is left


@dataclass
class RunningServer:
    """A server started by :func:`start_in_thread`: its ports, and how to stop it."""

    server: LiveServer
    ports: list[int]
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread
    _stop: asyncio.Event

    @property
    def port(self) -> int:
        """The fleet's port (the first one opened)."""
        return self.ports[0]

    def stop(self, timeout: float = 10.0) -> None:
        """End the streams in flight cleanly, close the ports, join the thread."""
        with contextlib.suppress(RuntimeError):  # the loop already ended (a failure)
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(timeout)


async def serve_forever(server: LiveServer, host: str, port: int,
                        instance_ports: list[int], stop: asyncio.Event,
                        on_listening: Callable[[list[int]], None] | None = None,
                        grace_s: float = 2.0) -> None:
    """Listen on ``port`` (the fleet) and on each of ``instance_ports`` (instance i on the
    i-th), run the time loop until ``stop`` is set, then end the streams in flight and close.
    ``on_listening`` receives the bound ports (a port 0 is given one by the system)."""
    runners: list[web.AppRunner] = []
    bound: list[int] = []
    await server.start()
    try:
        for app_instance, p in [(None, port), *enumerate(instance_ports)]:
            runner = web.AppRunner(server.build_app(app_instance), handler_cancellation=True,
                                   access_log=None, shutdown_timeout=grace_s)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, host, p, reuse_address=True)
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []
            bound.append(sockets[0].getsockname()[1] if sockets else p)
        if on_listening is not None:
            on_listening(bound)
        assert server.failed is not None
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(server.failed.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    finally:
        await server.shutdown()
        for runner in runners:
            await runner.cleanup()


def start_in_thread(sim: Any, config: ServeConfig, host: str = "127.0.0.1", port: int = 0,
                    instance_ports: list[int] | None = None) -> RunningServer:
    """Serve ``sim`` from a background thread with its own event loop (tests, notebooks);
    returns once the ports listen."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop = asyncio.Event()
        server = LiveServer(sim, config)
        box.update(loop=loop, stop=stop, server=server)

        def listening(ports: list[int]) -> None:
            box["ports"] = ports
            ready.set()

        try:
            loop.run_until_complete(serve_forever(server, host, port, instance_ports or [],
                                                  stop, listening))
        except BaseException as exc:  # surfaced to the caller below
            box["error"] = exc
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="blis-serve", daemon=True)
    thread.start()
    ready.wait(60)
    if "error" in box:
        raise box["error"]
    return RunningServer(box["server"], box["ports"], box["loop"], thread, box["stop"])


__all__ = ["CHARS_PER_TOKEN", "LiveServer", "RequestError", "RunningServer", "ServeConfig",
           "error_body", "estimate_tokens", "load_token_counter", "serve_forever",
           "start_in_thread"]
