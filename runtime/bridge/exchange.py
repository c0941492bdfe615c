"""One `/v1/messages` request, from its validated body to its last byte.

Order matters: the window check and the upstream's own refusals come before any byte is sent,
so they are real HTTP errors (Claude Code compacts on a 400 "prompt is too long"); once the upstream
accepted, `message_start` goes out with the engine's first chunk (whose usage counts the prompt), or
before the first `ping` if that comes sooner, and pings cover the silence of a long prefill.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import msgspec

from runtime.bridge.answer import Answer, Outbox, Serving
from runtime.bridge.cachemiss import CacheCheck
from runtime.bridge.errors import (
    JSON_RESPONSE_HEADERS,
    BridgeError,
    capability_rejected,
    from_upstream,
    internal_failure,
)
from runtime.bridge.guard import BlockedWrite
from runtime.bridge.schema import MessagesRequest
from runtime.bridge.sessions import Asker
from runtime.bridge.sse import PING, AnthropicSse, SseParser
from runtime.bridge.stream import MessageAssembler, Sink, StreamTranslator, decoded, refusal_of
from runtime.bridge.swaps import UNSTREAMED_WAIT_S, Swaps
from runtime.bridge.trace import Trace
from runtime.bridge.translate import Translation, Translator
from runtime.bridge.upstream import BROKEN, JSON_HEADERS, Upstream
from runtime.logsafe import loggable

log = logging.getLogger("runtime.bridge")

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
# A prompt whose upper bound of tokens (one per byte, doubled for the template) fits the window with
# this margin cannot be too long: the /tokenize round trip is skipped (images are always counted).
TEMPLATE_MARGIN_TOKENS = 16384
VLLM_TOO_LONG = re.compile(r"maximum context length is (\d+) tokens.*?(\d+) input tokens", re.S)
# vLLM's refusals of images, by what the client can drop: every image (a text-only model), or some (VL_MM_IMAGES).
NO_IMAGES = re.compile(r"is not a multimodal model|At most 0 image\(s\)")
TOO_MANY_IMAGES = re.compile(r"At most [1-9]\d* image\(s\)")
# vLLM's grammar compilers refusing a feature of a response format's schema they lack (look-around, a format): the
# engine cannot give that structured output. A schema wrong in itself (a missing $ref, a bad type) is the client's.
GRAMMAR_LACKS = re.compile(r"^Grammar error: (?:.*\bis not supported|.*\bunsupported|Unknown format)", re.S | re.I)


def too_long(count: int, window: int) -> BridgeError:
    """The wording Claude Code reacts to by compacting the conversation."""
    return BridgeError(400, f"prompt is too long: {count} tokens > {window - 1} maximum")


def upstream_refusal(error: BridgeError, structured: bool = False) -> BridgeError:
    """vLLM's own refusals in the words Claude Code acts on: its context-length refusal reworded so that the client
    compacts; an image, or a `structured` answer's schema, it cannot take as `capability_rejected: <class>`, so that
    the client drops it and retries."""
    if error.status != 400:
        return error
    if structured and GRAMMAR_LACKS.search(error.message):
        return capability_rejected("structured_outputs_unsupported")
    if found := VLLM_TOO_LONG.search(error.message):
        return too_long(int(found.group(2)), int(found.group(1)))
    if NO_IMAGES.search(error.message):
        return capability_rejected("image_block")  # vLLM's wording blamed the user for the model's limit
    if TOO_MANY_IMAGES.search(error.message):
        return capability_rejected("media_budget")
    return error


async def count_prompt(upstream: Upstream, translation: Translation) -> tuple[int, int]:
    """(tokens, window) of the exact prompt vLLM would build, through its /tokenize in chat form."""
    body = msgspec.json.encode(translation.tokenize_payload())
    status, content, _ = await upstream.fetch("POST", "/tokenize", body, JSON_HEADERS)
    if status != 200:
        raise upstream_refusal(from_upstream(status, content))
    answer = msgspec.json.decode(content)
    return int(answer["count"]), int(answer["max_model_len"])


class MessagesExchange(Answer):
    """The ASGI response for one `/v1/messages` request; records its outcome in `trace`."""

    def __init__(
        self,
        serving: Serving,
        request: MessagesRequest,
        body_size: int,
        trace: Trace,
        routing: dict[str, str] | None = None,
        cache_salt: str | None = None,
        may_swap: bool = True,
        asker: Asker | None = None,
    ) -> None:
        self.serving = serving
        self.may_swap = may_swap  # the key's right to make the pod swap its model (VL_SWAP)
        self.routing = routing or {}  # this conversation's key for the router (runtime.bridge.affinity)
        self.cache_salt = cache_salt  # the key's, so that no other key reads its prompts in the cache
        self.request = request
        self.body_size = body_size
        self.trace = trace
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.cache_check = CacheCheck(serving.prompts, asker or Asker(""), request, self.id)
        self.started = time.monotonic()
        self.window = 0  # the served model's context window, once known
        trace.id, trace.model, trace.stream = self.id, request.model, request.stream

    async def serve(self, out: Outbox) -> None:
        """Errors up to the upstream's acceptance are HTTP errors; `stream` handles the later ones."""
        try:
            swaps = await self.swaps_to_wait_on()
            if swaps is not None and self.request.stream:
                return await self.serve_after_swap(out, swaps)  # the stream begins now, and pings while it swaps
            if swaps is not None:
                await self.wait_for_swap(swaps, UNSTREAMED_WAIT_S)
            translation = await self.translate()
            input_tokens = await self.guard_window(translation)
            async with self.open_chat(translation) as response:
                if self.request.stream:
                    await self.stream(response, out, translation, input_tokens)
                else:
                    await self.answer(response, out, input_tokens)
        except BridgeError as error:
            error = upstream_refusal(error, self.structured)  # vLLM's, after its 200 too (a schema's grammar)
            self.trace.error_type = error.type
            await error.send(out.send)

    @property
    def structured(self) -> bool:
        """Whether the client asked for structured output (`output_config.format`)."""
        return self.request.output_config is not None and self.request.output_config.format is not None

    async def swaps_to_wait_on(self) -> Swaps | None:
        """VL_SWAP's, when this request must wait for the engine (another model, or a swap under way); None when
        it need not; BridgeError(403) when it would make the pod swap and its key may not."""
        swaps = self.serving.swaps
        if swaps is not None and await swaps.must_wait_for(self.request.model, self.may_swap):
            return swaps
        return None

    async def serve_after_swap(self, out: Outbox, swaps: Swaps) -> None:
        """A streamed request for a model being swapped in: message_start and pings at once, then the answer
        as usual; an error once the stream began (the window's too) is an `event: error`."""
        sink = AnthropicSse()
        translator = self.translator(sink)
        await out.start(200, SSE_HEADERS, PING, self.serving.ping_s, self.announcer(sink, translator))
        try:
            await self.wait_for_swap(swaps)
            translation = await self.translate()
            input_tokens = await self.guard_window(translation)
            async with self.open_chat(translation) as response:
                await self.stream(response, out, translation, input_tokens, (sink, translator))
        except BridgeError as error:
            self.trace.error_type = error.type
            await out.end(sink.take() + error.event())

    async def wait_for_swap(self, swaps: Swaps, timeout_s: float | None = None) -> None:
        """Until the engine serves the model asked for (`Swaps.ready_for`); the trace says how long it waited."""
        began = time.monotonic()
        try:
            await swaps.ready_for(self.request.model, timeout_s, self.may_swap)
        finally:
            self.trace.swap_wait_s = round(time.monotonic() - began, 2)

    async def translate(self) -> Translation:
        catalog = self.serving.catalog
        self.window = (await catalog.current(self.serving.upstream)).context_window
        translation = Translator(catalog.traits).translate(self.request, catalog.upstream_name)
        if self.serving.log_prompts:
            self.trace.prompt = last_user_text(translation.payload["messages"])
        if self.cache_salt is not None:
            translation.payload["cache_salt"] = self.cache_salt
        return translation

    async def guard_window(self, translation: Translation) -> int:
        """Refuse a prompt that cannot fit before the engine sees it; the count when it was needed."""
        if self.window and not translation.has_images and 2 * self.body_size + TEMPLATE_MARGIN_TOKENS < self.window:
            return 0
        count, window = await count_prompt(self.serving.upstream, translation)
        if count >= window:
            raise too_long(count, window)
        return count

    @asynccontextmanager
    async def open_chat(self, translation: Translation) -> AsyncIterator[aiohttp.ClientResponse]:
        """The upstream's streamed answer, once it accepted the request; its refusal as a BridgeError."""
        payload = translation.payload
        headers = {**JSON_HEADERS, "x-request-id": self.id, **self.routing}
        while True:
            body = msgspec.json.encode(payload)
            async with self.serving.upstream.open("POST", "/v1/chat/completions", body, headers) as response:
                if response.status == 200:
                    yield response
                    return
                error = from_upstream(response.status, await response.read())
            if "thinking_token_budget" in payload and "thinking_token_budget" in error.message:
                self.serving.catalog.refused_thinking_budget()  # no reasoning parser: retried without
                del payload["thinking_token_budget"]
                continue
            raise upstream_refusal(error, self.structured)

    async def stream(
        self,
        response: aiohttp.ClientResponse,
        out: Outbox,
        translation: Translation,
        input_tokens: int,
        begun: tuple[AnthropicSse, StreamTranslator] | None = None,
    ) -> None:
        """The answer as SSE; `begun`: the sink and translator of a stream already started (a swap's wait)."""
        if begun is None:
            sink = AnthropicSse()
            translator = self.translator(sink, input_tokens)
        else:
            sink, translator = begun
            translator.input_tokens = input_tokens

        announce = self.announcer(sink, translator, translation)
        first = b""
        if begun is None:
            if self.structured:  # its refusal a 400 the client heals from, not an `event: error` it cannot
                first = await self.read_past_grammar(response)
            await out.start(200, SSE_HEADERS, PING, self.serving.ping_s, announce)
        elif out.pings is not None:  # the pings go on, their message_start now with the prompt counted
            out.pings.before = announce
        self.serving.open_streams.inc()
        try:
            await self.pump(response, translator, sink, out, first)
        except BridgeError as error:  # after the stream began: an `event: error`
            self.trace.error_type = error.type
            await out.end(sink.take() + error.event())
        except Exception:
            log.exception("internal error in stream %s", self.id)
            self.trace.error_type = "api_error"
            await out.end(sink.take() + internal_failure().event())
        else:
            await out.end(sink.take())
        finally:
            out.stop()
            self.serving.open_streams.dec()
            self.record(translator)

    def announcer(
        self, sink: AnthropicSse, translator: StreamTranslator, translation: Translation | None = None
    ) -> Callable[[], Awaitable[bytes]]:
        """What goes before a ping: the message_start that the engine's first chunk has not brought yet (a long
        prefill, a queue, a swap), with the prompt counted once there is one to count (unless the window guard
        counted it already)."""

        async def announce() -> bytes:
            if translation is not None and not translator.started and not translator.input_tokens:
                with contextlib.suppress(BridgeError):
                    translator.input_tokens, _ = await count_prompt(self.serving.upstream, translation)
            translator.begin()
            return sink.take()

        return announce

    async def answer(self, response: aiohttp.ClientResponse, out: Outbox, input_tokens: int) -> None:
        sink = MessageAssembler()
        translator = self.translator(sink, input_tokens)
        try:
            await self.pump(response, translator)
        finally:
            self.record(translator)
        body = msgspec.json.encode(sink.message)
        await out.send({"type": "http.response.start", "status": 200, "headers": JSON_RESPONSE_HEADERS})
        await out.send({"type": "http.response.body", "body": body})

    async def read_past_grammar(self, response: aiohttp.ClientResponse) -> bytes:
        """The upstream's first read, before the stream starts: vLLM compiles a response format's grammar after it
        answered 200, and refuses it as the first event. That refusal raised here is an HTTP error (`serve`'s)."""
        try:
            data = await response.content.readany()
        except BROKEN:
            return b""  # `pump` reads again, and says the stream broke off
        for payload in SseParser().feed(data):
            if payload.startswith(b'{"error"') and (error := decoded(payload).error) is not None:
                raise refusal_of(error)
        return data

    async def pump(
        self,
        response: aiohttp.ClientResponse,
        translator: StreamTranslator,
        sink: AnthropicSse | None = None,
        out: Outbox | None = None,
        first: bytes = b"",
    ) -> None:
        """Upstream bytes (from `first`, what was read already) → translator; when streaming, one write per network
        read (many events, one write)."""
        parser, read = SseParser(), response.content.readany
        try:
            while data := first or await read():
                first = b""
                for payload in parser.feed(data):
                    translator.feed(payload)
                if translator.done:  # the generation has ended: what is left of the body is no reason to abort
                    self.serving.upstream.finish(response)
                    return
                if out is not None and sink is not None and sink.out:
                    await out.write(sink.take())
        except BROKEN as error:
            raise BridgeError(500, f"the model server broke the stream off ({type(error).__name__})") from None
        raise BridgeError(500, "the model server ended the stream before its end")

    def translator(self, sink: Sink, input_tokens: int = 0) -> StreamTranslator:
        translator = StreamTranslator(sink, self.id, self.request.model, input_tokens, self.serving.guard)
        translator.diagnostics = self.cache_check.answer
        return translator

    def record(self, translator: StreamTranslator) -> None:
        trace = self.trace
        trace.count_tokens(translator.input_tokens, translator.cached_tokens, translator.output_tokens)
        if translator.started:  # the engine counted the prompt: its fingerprint is kept, the miss said
            prompt = translator.input_tokens + translator.cached_tokens
            trace.cache_miss = self.cache_check.settle(prompt, translator.cached_tokens)
        trace.stop = translator.stop_reason or trace.stop
        if translator.first_token_at is not None:
            trace.ttft_s = translator.first_token_at - self.started
        if translator.blocked:
            self.record_blocked(translator.blocked)

    def record_blocked(self, writes: list[BlockedWrite]) -> None:
        """The writes VL_GUARD blocked: in the trace (`guard=blocked:Write`), counted by tool, and one log line
        each with the file and the marker's line, escaped (`loggable`: the model wrote them), never the content."""
        self.trace.guard = "blocked:" + ",".join(write.label for write in writes)
        for write in writes:
            self.serving.count_blocked_write(write.label)
            log.warning(
                "guard blocked a truncated write id=%s tool=%s path=%s line=%d marker=%s",
                self.id,
                loggable(write.tool),
                loggable(write.path),
                write.line,
                loggable(write.marker),
            )


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The last user message's text, for VL_LOG_PROMPTS traces."""
    for message in reversed(messages):
        if message["role"] == "user":
            content = message["content"]
            if isinstance(content, str):
                return content
            return "\n".join(part["text"] for part in content if part["type"] == "text")
    return ""
