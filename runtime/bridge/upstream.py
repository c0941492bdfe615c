"""The one bounded HTTP connection pool to vLLM, and how its failures become Anthropic errors.

Bounded on purpose (the seeds' first bridge hung when httpx's default 100 connections filled up
with streams that nobody read any more): a full pool answers a fast 529 after `pool_timeout`.
aiohttp rather than httpx here: reading a streamed chunk costs ~10 µs of CPU with aiohttp's C
parser against ~45 µs through httpx/httpcore/h11/anyio (measured on this project's machine), and
the bridge's whole budget is 20 µs per relayed token (`benchmarks/bridge.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from runtime.bridge.errors import JSON_CONTENT_TYPE, BridgeError

log = logging.getLogger("runtime.bridge")

JSON_HEADERS = {"content-type": JSON_CONTENT_TYPE}  # of a request with a JSON body
# vLLM names a generation after the request's x-request-id, behind a prefix per route (and, for
# completions, a suffix per prompt: the bridge relays one prompt, index 0).
GENERATION_IDS = {"/v1/chat/completions": "chatcmpl-{}", "/v1/completions": "cmpl-{}-0"}
ABORT_PATH = "/inference/v1/abort_requests"
# What a broken upstream raises once its answer began (reset, truncated body, …).
BROKEN = (aiohttp.ClientError,)
# After an answer's last event, what is left of its body (vLLM's end of the chunked body, at most) is
# read for this long, then the answer is closed all the same (and, being unfinished to aiohttp, aborted).
BODY_DRAIN_S = 1.0
DRAIN_BYTES = 64 * 2**10
# Idle upstream connections are not reused after this long: vLLM's uvicorn closes them after 5 s, and a
# request sent as it closed one was lost (7 in 300 got a spurious 529 with aiohttp's default 15 s).
KEEPALIVE_S = 4.0
# What a kept-alive connection raises when the upstream closed it as the request went out: no answer
# began, so the request is sent once more (as aiohttp does for idempotent methods only; a generation
# is safe to repeat: vLLM drops a request whose connection closed before its answer).
CLOSED_UNDER_US = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError)


# Generations go through the router when there is one (it keeps each conversation on its engine); the
# rest is answered by any engine: the router does not route /tokenize, and /metrics is each engine's own.
ROUTED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})  # the generations the bridge sends


class Upstream:
    """vLLM's OpenAI server at `base_url` (an engine, or the router in front of `engines`): streamed
    requests, plain requests, and the pool's use."""

    def __init__(
        self,
        base_url: str,
        max_connections: int = 512,
        pool_timeout: float = 10.0,
        engines: Sequence[str] = (),
        engine_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.engines = tuple(url.rstrip("/") for url in engines) or (self.base_url,)
        # A gateway's engines are other pods' bridges: its key for them on what it asks them directly, and
        # no abort (they have no such route: each aborts its own generation when the router lets go of it).
        self.engine_headers = {"authorization": f"Bearer {engine_key}"} if engine_key else {}
        self.aborts_engines = engine_key is None
        self.max_connections = max_connections
        self.pool_timeout = pool_timeout
        self.in_use = 0
        self.tasks: set[asyncio.Task[None]] = set()  # aborts and drains under way (`background`)
        self.finished: set[aiohttp.ClientResponse] = set()  # answers read to their last event (`finish`)
        self.session: aiohttp.ClientSession | None = None  # made in the serving event loop, on first use

    def client(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
                ),
                # `connect` bounds the wait for a pooled connection; no read timeout: a cold prefill
                # of a long prompt is silent for minutes (pings cover the client meanwhile).
                timeout=aiohttp.ClientTimeout(total=None, connect=self.pool_timeout, sock_connect=10, sock_read=None),
                auto_decompress=False,
                trust_env=False,  # never route loopback traffic through an HTTP(S)_PROXY from the environment
            )
        return self.session

    @asynccontextmanager
    async def open(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request and yield the response with its body unread; leaving early aborts it upstream."""
        try:
            response = await self.send(method, path, body, headers)
        except aiohttp.ConnectionTimeoutError:
            if self.in_use >= self.max_connections:
                raise BridgeError(
                    529, "the bridge is at its limit of concurrent upstream requests; retry shortly"
                ) from None
            raise BridgeError(529, "the model server does not accept connections in time") from None
        except aiohttp.ClientError as error:
            raise BridgeError(
                529, f"the model server is unreachable ({type(error).__name__}); it may be starting"
            ) from None
        self.in_use += 1
        try:
            yield response
        finally:
            self.in_use -= 1
            finished = response in self.finished
            self.finished.discard(response)  # in every case: kept, it would hold every answer read to its end
            if response.content.is_eof():
                response.release()
            elif finished:
                self.background(self.drain(response))
            else:
                response.close()  # drops the connection, and nothing is read from it any more
                self.abort(path, headers or {})

    def finish(self, response: aiohttp.ClientResponse) -> None:
        """Say that an answer's last event was read: vLLM may send `[DONE]` and the body's end apart,
        and an answer closed before its end is an abort (8 in 100 finished ones were, before this).
        What is left is read in the background (the client may leave at once: nothing to cancel)."""
        self.finished.add(response)

    async def drain(self, response: aiohttp.ClientResponse) -> None:
        """Read what is left of a finished answer (its body's end, at most DRAIN_BYTES within BODY_DRAIN_S),
        then hand its connection back to the pool, or close it: never an abort."""
        left = DRAIN_BYTES
        with contextlib.suppress(TimeoutError, *BROKEN):
            async with asyncio.timeout(BODY_DRAIN_S):
                while left > 0 and not response.content.is_eof():
                    data = await response.content.readany()
                    if not data:
                        break
                    left -= len(data)
        if response.content.is_eof():
            response.release()
        else:
            response.close()

    async def send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str] | None
    ) -> aiohttp.ClientResponse:
        """The response to a request, its body unread; sent a second time when the connection broke
        before any answer (a kept-alive one, closed by the upstream as the request went out). What is
        not a generation goes to the first engine that accepts a connection."""
        if path in ROUTED_PATHS:
            return await self.send_to(self.base_url, method, path, body, headers)
        headers = {**(headers or {}), **self.engine_headers}
        for base in self.engines[:-1]:
            try:
                return await self.send_to(base, method, path, body, headers)
            except aiohttp.ClientConnectorError:
                continue  # that engine is down (restarting): another answers
        return await self.send_to(self.engines[-1], method, path, body, headers)

    async def send_to(
        self, base: str, method: str, path: str, body: bytes | None, headers: dict[str, str] | None
    ) -> aiohttp.ClientResponse:
        try:
            return await self.client().request(method, base + path, data=body, headers=headers)
        except aiohttp.ClientConnectorError:
            raise  # no connection at all: the upstream is down, not a stale connection
        except CLOSED_UNDER_US:
            log.info("the model server closed a connection under %s %s: sent again", method, path)
            return await self.client().request(method, base + path, data=body, headers=headers)

    def abort(self, path: str, headers: dict[str, str]) -> None:
        """Tell vLLM to stop a generation nobody will read, in the background.

        Dropping the connection is not enough: vLLM 0.32 aborts on a disconnect only when the
        cancellation reaches its generator while it awaits a token; caught while writing, the
        generator is left to the garbage collector and the engine generates on (a minute and more
        for nobody, seen in this project's tests). Before its response head, vLLM cancels the
        request itself when the connection drops: that is what leaving `open` early does.
        """
        pattern, request_id = GENERATION_IDS.get(path), headers.get("x-request-id")
        if pattern is None or request_id is None or not self.aborts_engines:
            return
        for engine in self.engines:  # behind a router, only the engine that runs it knows the name
            self.background(self.post_abort(engine, pattern.format(request_id)))

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` on its own (an abort, a drain), kept until done: the loop keeps only weak references."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def post_abort(self, engine: str, generation_id: str) -> None:
        try:
            async with self.client().post(
                engine + ABORT_PATH,
                json={"request_ids": [generation_id]},
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response:
                if response.status != 200:
                    log.warning("vLLM refused to abort %s: %s", generation_id, response.status)
        except (TimeoutError, aiohttp.ClientError) as error:
            log.warning("could not ask vLLM to abort %s: %s", generation_id, type(error).__name__)

    async def fetch(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes, str]:
        """A whole request: (status, body, content type)."""
        async with self.open(method, path, body, headers) as response:
            try:
                content = await response.read()
            except BROKEN as error:
                raise BridgeError(500, f"the model server closed the connection ({type(error).__name__})") from None
        return response.status, content, response.headers.get("content-type", JSON_CONTENT_TYPE)

    async def fetch_each(self, path: str, timeout_s: float) -> list[tuple[bool, bytes | None]]:
        """GET `path` from every engine at once: whether each answered (a slow one is busy, not gone: a
        dead one refuses at once, a hung one is the watchdog's), and its body when it answered 200."""

        async def one(engine: str) -> tuple[bool, bytes | None]:
            try:
                timeout = aiohttp.ClientTimeout(total=timeout_s)
                async with self.client().get(engine + path, headers=self.engine_headers, timeout=timeout) as answer:
                    return True, await answer.read() if answer.status == 200 else None
            except TimeoutError:
                return True, None
            except aiohttp.ClientError:
                return False, None

        return list(await asyncio.gather(*(one(engine) for engine in self.engines)))

    async def aclose(self) -> None:
        await asyncio.gather(*self.tasks, return_exceptions=True)  # aborts already asked for still go out
        if self.session is not None:
            await self.session.close()
