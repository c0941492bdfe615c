"""OpenAI-style routes passed through to vLLM (`/v1/chat/completions`, `/v1/completions`, `/tokenize`…).

What the bridge adds on the way: the model-name fallback, SSE comment pings while the engine is
silent (OpenAI SDKs ignore comments, and RunPod's proxy cuts a silent connection), closing the
upstream when the client leaves, and per-key usage from the response's `usage` (asked for on the client's behalf
in a stream that did not ask, and then kept from it).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import msgspec
from starlette.requests import Request

from runtime.bridge.affinity import routing_headers
from runtime.bridge.answer import Answer, Outbox, Serving
from runtime.bridge.errors import BridgeError
from runtime.bridge.nesting import refuse_deep_nesting
from runtime.bridge.sse import COMMENT_PING, SseParser
from runtime.bridge.upstream import BROKEN, JSON_HEADERS

PASSED_HEADERS = (b"content-type", b"cache-control")


@dataclass(frozen=True)
class Relayed:
    """A relayed request's body as sent upstream, whether it streams, and whether the bridge asked for the stream's
    usage on the client's behalf (its usage chunk is then counted, and kept from the client)."""

    body: bytes
    stream: bool = False
    usage_asked_for_us: bool = False


def rewrite_model(body: bytes, served: str | None, cache_salt: str | None = None, generation: bool = False) -> Relayed:
    """The body with the `served` model's own name as its `model` once the bridge knows it (the router
    routes by it), before that without a `model` (vLLM takes its own), and the caller's `cache_salt`
    in place of any it sent; a streamed `generation` asks vLLM for its usage (sent only when asked: a budget
    counted such streams as 0 tokens)."""
    refuse_deep_nesting(body)
    try:
        payload = msgspec.json.decode(body)
    except msgspec.DecodeError as error:
        raise BridgeError(400, f"the request body is not valid JSON: {error}") from None
    if not isinstance(payload, dict):
        raise BridgeError(400, "the request body must be a JSON object")
    if served is not None:
        payload["model"] = served
    else:
        payload.pop("model", None)
    if cache_salt is not None:
        payload["cache_salt"] = cache_salt
    stream = payload.get("stream") is True
    options = payload.get("stream_options")
    ours = stream and generation and not (isinstance(options, dict) and options.get("include_usage") is True)
    if ours:
        payload["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return Relayed(msgspec.json.encode(payload), stream, ours)


def is_usage_chunk(payload: bytes) -> bool:
    """Whether a stream's event is its usage chunk (no choices, the usage), which vLLM sends last when asked."""
    if b'"usage"' not in payload or b'"usage":null' in payload:  # a token's chunk: not decoded, on the hot path
        return False
    try:
        chunk = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return False
    return isinstance(chunk, dict) and chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict)


class Relay(Answer):
    """The ASGI response relaying one request to `path` upstream; records usage in `trace`."""

    def __init__(self, serving: Serving, request: Request, relayed: Relayed | None = None) -> None:
        self.serving, self.relayed = serving, relayed or Relayed(b"")
        self.body = relayed.body if relayed is not None else None
        self.method, self.path, self.trace = request.method, request.url.path, request.state.trace
        self.headers = dict(JSON_HEADERS) if self.body is not None else {}
        # vLLM names the generation after it, and the bridge aborts it by that name. Never the client's
        # id: vLLM aborts every generation under an id, so a reused one would abort another client's
        # (the trace line logs the client's beside this one).
        self.headers["x-request-id"] = self.trace.id = f"relay_{uuid.uuid4().hex[:24]}"
        self.headers |= routing_headers(
            request.headers, None, request.state.key, serving.data_parallel, serving.down_ranks()
        )

    async def serve(self, out: Outbox) -> None:
        try:
            async with self.serving.upstream.open(self.method, self.path, self.body, self.headers) as response:
                kept = [(name.lower(), value) for name, value in response.raw_headers if name.lower() in PASSED_HEADERS]
                if self.relayed.stream and response.status == 200:
                    await self.relay_stream(response, out, kept)
                    return
                try:
                    content = await response.read()
                except BROKEN as error:
                    raise BridgeError(500, f"the model server closed the connection ({type(error).__name__})") from None
        except BridgeError as error:
            self.trace.error_type = error.type
            await error.send(out.send)
            return
        self.count_usage(content)
        await out.send({"type": "http.response.start", "status": response.status, "headers": kept})
        await out.send({"type": "http.response.body", "body": content})

    async def relay_stream(
        self, response: aiohttp.ClientResponse, out: Outbox, headers: list[tuple[bytes, bytes]]
    ) -> None:
        await out.start(200, headers, COMMENT_PING, self.serving.ping_s)
        self.serving.open_streams.inc()
        previous = last = b""  # the usage chunk is among the last bytes
        events = SseParser() if self.relayed.usage_asked_for_us else None
        try:
            async for data in response.content.iter_any():
                previous, last = last, data
                if events is not None:  # event by event, the usage chunk kept back and counted
                    data = b"".join(self.without_usage(events.feed(data)))
                if data:
                    await out.write(data)
        except BROKEN as error:
            self.trace.error_type = "api_error"
            message = f"the model server broke the stream off ({type(error).__name__})"
            await out.end(
                b"data: " + msgspec.json.encode({"error": {"message": message, "type": "api_error"}}) + b"\n\n"
            )
            return
        finally:
            out.stop()
            self.serving.open_streams.dec()
        if events is None:
            for payload in reversed(SseParser().feed(previous + last)):
                if self.count_usage(payload):
                    break
        await out.end()

    def without_usage(self, payloads: list[bytes]) -> Iterator[bytes]:
        """The events as vLLM sent them (`data:` lines), but the usage chunk the client did not ask for: counted."""
        for payload in payloads:
            if is_usage_chunk(payload):
                self.count_usage(payload)
            else:
                yield b"data: " + payload + b"\n\n"

    def count_usage(self, content: bytes) -> bool:
        """Take `usage` from an OpenAI response or chunk, if it has one."""
        try:
            usage = msgspec.json.decode(content).get("usage")
        except (msgspec.DecodeError, AttributeError):
            return False
        if not isinstance(usage, dict):
            return False
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.trace.count_tokens((usage.get("prompt_tokens") or 0) - cached, cached, usage.get("completion_tokens") or 0)
        return True
