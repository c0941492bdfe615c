"""The client's side of a request: its body under a size limit, noticing at once when it leaves,
and keeping a silent stream alive.

Leaving matters: Claude Code re-sends a request after ~300 s without a byte while the first one is
still being served, and the seeds' first bridge kept generating for nobody until its pool filled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from runtime.bridge.errors import BridgeError

T = TypeVar("T")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or a 413 as soon as it is known to exceed `limit` bytes."""
    too_large = BridgeError(413, f"the request body exceeds the bridge's limit of {limit // 2**20} MiB (VL_MAX_BODY_MB)")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class ClientGone(Exception):
    """The client closed its connection before the answer was complete."""


async def unless_client_leaves(receive: Receive, work: Awaitable[T]) -> T:
    """Run `work`; cancel it the moment the client disconnects (then raise ClientGone).

    Cancelling closes the upstream response inside `work`, and vLLM aborts the request.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            watcher.cancel()
            raise ClientGone
        watcher.cancel()
    return task.result()


class LeavableAnswer:
    """An ASGI response whose `serve` stops the moment its client leaves (the trace says `client_gone`)."""

    trace: dict[str, Any]

    async def serve(self, send: Send) -> None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_client_leaves(receive, self.serve(send))
        except ClientGone:
            self.trace["stop"] = "client_gone"


class Writer:
    """Writes body chunks to the client; a keepalive task writes `ping` after `interval` of silence.

    Silence is measured from the last write, so a busy stream never pays for a timer per token.
    """

    def __init__(self, send: Send, ping: bytes, interval: float) -> None:
        self.send = send
        self.ping = ping
        self.interval = interval
        self.last_write = time.monotonic()
        self.keepalive: asyncio.Task[None] | None = None

    async def start(self, status: int, headers: list[tuple[bytes, bytes]], first: bytes = b"") -> None:
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        if first:
            await self.write(first)
        self.keepalive = asyncio.ensure_future(self.keep_alive())

    async def write(self, data: bytes) -> None:
        self.last_write = time.monotonic()
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self.last_write + self.interval - time.monotonic())
            if time.monotonic() - self.last_write >= self.interval:
                await self.write(self.ping)

    async def end(self, data: bytes = b"") -> None:
        self.stop()
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    def stop(self) -> None:
        if self.keepalive is not None:
            self.keepalive.cancel()
            self.keepalive = None
