"""A stand-in for vLLM's OpenAI server that streams scripted chunks fast, or at a set pace.

Used by `benchmarks/bridge.py` (an upstream that costs next to nothing, so the bridge's own cost shows)
and by tests that need what the shared vLLM cannot promise: silence before the first token, a
stream that outlasts any machine stall. It speaks just enough HTTP/1.1 on raw asyncio for that:
`GET /v1/models`, `POST /tokenize`, streamed `POST /v1/chat/completions` whose chunks have the shape
and size of vLLM 0.32's (named `chatcmpl-<x-request-id>`, as vLLM names them), and
`POST /inference/v1/abort_requests`, which ends every running stream of that name, as vLLM does (the last
chunk says `finish_reason: "abort"`). It prints each abort asked for, each stream it ended so, and each
stream its client dropped.

    python -m tests.support.upstream --port 0 [--tokens 200] [--pace-ms 0] [--first-token-delay-s 0] [--no-reasoning]
        [--end-apart-ms 0]

`--end-apart-ms` writes the chunked body's end that long after `[DONE]`, as vLLM's uvicorn may (two
writes, two TCP segments): an answer whose last event is read is then not yet at its body's end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from tests.support.http_framing import next_request, response

SERVED = "fake"
WINDOW = 65536
TOKEN = "tok "  # what every content delta carries; the bench client spots the first one by it
# vLLM's words for a thinking budget when it runs without a reasoning parser (vllm/v1/engine/input_processor.py).
NO_REASONING = (b'{"error":{"message":"thinking_token_budget is set but reasoning_config is not configured. Please set '
                b'--reasoning-parser and/or --reasoning-config to use thinking_token_budget.","type":"BadRequestError",'
                b'"param":null,"code":400}}')  # fmt: skip
STREAMS: dict[str, set[Upstream]] = {}  # the running streams by name: an abort ends every one of a name


def chunk(request_id: str, delta: dict, completion_tokens: int, finish: str | None = None) -> bytes:
    """One vLLM-shaped streaming chunk with continuous usage, framed as SSE and HTTP chunked."""
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": None}
    if finish:
        choice["stop_reason"] = None
    body = {
        "id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": SERVED,
        "choices": [choice],
        "usage": {"prompt_tokens": 20, "total_tokens": 20 + completion_tokens, "completion_tokens": completion_tokens,
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    }  # fmt: skip
    return http_chunk(b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def final_chunks(request_id: str, tokens: int, finish: str | None = None) -> bytes:
    usage = {"prompt_tokens": 20, "total_tokens": 20 + tokens, "completion_tokens": tokens,
             "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip
    body = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": SERVED,
            "choices": [], "usage": usage}  # fmt: skip
    return (
        chunk(request_id, {}, tokens, finish or ("stop" if tokens else "length"))
        + http_chunk(b"data: " + json.dumps(body).encode() + b"\n\n")
        + http_chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )


class Upstream(asyncio.Protocol):
    """One client connection; requests on it are served one after the other (HTTP/1.1 keep-alive)."""

    def __init__(
        self, tokens: int, pace_s: float, first_token_delay_s: float, reasoning: bool, end_apart_s: float = 0.0
    ) -> None:
        self.tokens, self.pace_s, self.first_token_delay_s, self.reasoning = (
            tokens,
            pace_s,
            first_token_delay_s,
            reasoning,
        )
        self.end_apart_s = end_apart_s
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.streaming: asyncio.Task[None] | None = None
        self.aborted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streaming is not None:
            self.streaming.cancel()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            request, self.buffer = next_request(self.buffer)
            if request is None:
                return
            request_id = request.headers.get(b"x-request-id")
            if (rank := request.headers.get(b"x-data-parallel-rank")) is not None:  # vLLM's own pin (VL_DP)
                key = request.headers.get(b"x-smg-routing-key", b"-").decode()
                print(f"data-parallel rank {rank.decode()} for {key}", flush=True)
            self.serve(request.method, request.path, request.body, request_id.decode() if request_id else None)

    def serve(self, method: bytes, path: bytes, body: bytes, request_id: str | None) -> None:
        assert self.transport is not None
        if path == b"/v1/models":
            listing = {
                "object": "list",
                "data": [{"id": SERVED, "object": "model", "created": 0, "max_model_len": WINDOW}],
            }
            self.transport.write(response(200, json.dumps(listing).encode()))
        elif path == b"/tokenize":
            self.transport.write(
                response(200, json.dumps({"count": len(body) // 4, "max_model_len": WINDOW, "tokens": []}).encode())
            )
        elif path == b"/v1/chat/completions":
            request = json.loads(body)
            if "thinking_token_budget" in request and not self.reasoning:
                print("refused thinking_token_budget: no reasoning parser", flush=True)
                self.transport.write(response(400, NO_REASONING))
                return
            tokens = request.get("max_tokens") or self.tokens
            # Named like vLLM names it, so that the bridge's abort can be matched to it.
            name = f"chatcmpl-{request_id or f'{id(self):x}{time.monotonic_ns():x}'}"
            self.streaming = asyncio.ensure_future(self.stream(name, min(tokens, self.tokens)))
        elif path == b"/inference/v1/abort_requests":
            names = json.loads(body)["request_ids"]
            print(f"abort requested: {' '.join(names)}", flush=True)
            for name in names:
                for stream in STREAMS.get(name, ()):
                    stream.aborted = True
            self.transport.write(response(200, b""))
        elif path == b"/health":
            self.transport.write(response(200, b""))
        else:
            self.transport.write(response(404, b'{"error":{"message":"no such route","code":404}}'))

    async def stream(self, request_id: str, tokens: int) -> None:
        transport = self.transport
        assert transport is not None
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        if self.first_token_delay_s:
            await asyncio.sleep(self.first_token_delay_s)
        transport.write(chunk(request_id, {"role": "assistant", "content": ""}, 0))
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.aborted = False
        STREAMS.setdefault(request_id, set()).add(self)
        try:
            for n in range(1, tokens + 1):
                if self.aborted:
                    print(f"stream aborted: {request_id}", flush=True)
                    transport.write(final_chunks(request_id, n - 1, "abort"))
                    return
                transport.write(chunk(request_id, {"content": TOKEN}, n))
                if self.pace_s:  # on a schedule, like an engine's steps, not drifting with our own delays
                    await asyncio.sleep(max(0.0, start + n * self.pace_s - loop.time()))
                else:
                    await asyncio.sleep(0)  # one write per token, as an engine emits them
        except asyncio.CancelledError:
            print(f"stream dropped by its client: {request_id}", flush=True)
            raise
        finally:
            STREAMS[request_id].discard(self)
            if not STREAMS[request_id]:
                del STREAMS[request_id]
        ending = final_chunks(request_id, tokens)
        if self.end_apart_s:
            body_end = len(b"0\r\n\r\n")
            transport.write(ending[:-body_end])
            await asyncio.sleep(self.end_apart_s)
            ending = ending[-body_end:]
        transport.write(ending)


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Upstream(
            args.tokens, args.pace_ms / 1000, args.first_token_delay_s, not args.no_reasoning, args.end_apart_ms / 1000
        ),
        args.host, args.port, backlog=4096,
    )  # fmt: skip
    print(f"listening on http://{args.host}:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=200, help="content tokens per answer (capped by max_tokens)")
    parser.add_argument("--pace-ms", type=float, default=0.0, help="time between tokens; 0 = as fast as possible")
    parser.add_argument("--first-token-delay-s", type=float, default=0.0, help="silence before the first token")
    parser.add_argument("--no-reasoning", action="store_true", help="refuse thinking_token_budget, as vLLM does "
                        "without a reasoning parser")  # fmt: skip
    parser.add_argument("--end-apart-ms", type=float, default=0.0, help="time between [DONE] and the body's end")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
