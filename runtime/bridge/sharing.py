"""Fair sharing of the engine among keys: a cap on each key's requests in flight, and leaving a
client that stops reading.

Without them one key could hold every upstream slot with streams it never read, and every other key
got 529 for as long as it liked. Beyond its cap a key gets 429 at once, never a queue (Claude Code and
the SDKs retry it after `retry-after`); 529 keeps its meaning: the engine is full for everyone.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.bridge.auth import UNGUARDED
from runtime.bridge.connection import DROP, ClientGone, LeavableAnswer, unless_client_leaves
from runtime.bridge.errors import BridgeError

T = TypeVar("T")


def key_cap(pool: int, keys: int, setting: int | None) -> int | None:
    """Each key's cap: VL_KEY_CONCURRENCY, else the pool split evenly among the keys (the caps add up to
    the pool: no key can take another's share). None when it cannot bind before the pool does, as with
    one key or none: a full pool is then everyone's, and its 529 says so."""
    cap = setting or max(1, pool // max(1, keys))
    return cap if cap < pool else None


class KeyShare:
    """ASGI middleware: at most `cap` requests in flight per key label (`scope["state"]["key"]`), each
    counted from its start to its response's last byte; one more gets a 429 `rate_limit_error`. No cap: None."""

    def __init__(self, app: ASGIApp, cap: int | None) -> None:
        self.app = app
        self.cap = cap
        self.in_flight: Counter[str] = Counter()  # by label: as many entries as configured keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cap is None or scope["type"] != "http" or scope["path"] in UNGUARDED:
            await self.app(scope, receive, send)
            return
        state = scope["state"]
        key = state["key"]
        if self.in_flight[key] >= self.cap:
            refusal = BridgeError(429, f"this API key already has {self.cap} requests in flight, the most allowed "
                                       "(VL_KEY_CONCURRENCY); retry once one has ended")  # fmt: skip
            state["trace"]["error_type"] = refusal.type
            await refusal.response()(scope, receive, send)
            return
        self.in_flight[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[key] -= 1


class ClientStalled(Exception):
    """The client read nothing for the stall timeout while the bridge had bytes waiting for it."""


class StallGuard:
    """An ASGI `send` that notes how long its writes wait: uvicorn's `send` waits while the client's
    socket is full, so a write that waits `stall_s` with none completing means a client that stopped reading.

    Pings go through it like any write: once the socket is full they wait too, and keep nobody alive.
    """

    def __init__(self, send: Send, stall_s: float) -> None:
        self.inner = send
        self.stall_s = stall_s
        self.waiting = 0  # writes begun and not yet done (a ping can overlap a chunk)
        self.since = 0.0  # when the wait began: the first of these writes, or the last one done

    async def send(self, message: Message) -> None:
        if not self.waiting:
            self.since = time.monotonic()
        self.waiting += 1
        try:
            await self.inner(message)
        finally:
            self.waiting -= 1
            if self.waiting:  # progress: the writes still waiting count from now
                self.since = time.monotonic()

    async def stalled(self) -> None:
        """Returns once a write has waited `stall_s` with none completing; wakes once per `stall_s`
        at most, never per write (a busy stream pays no timer per token)."""
        while True:
            start = self.since if self.waiting else time.monotonic()
            await asyncio.sleep(start + self.stall_s - time.monotonic())
            if self.waiting and time.monotonic() - self.since >= self.stall_s:
                return

    async def unless_stalled(self, work: Awaitable[T]) -> T:
        """Run `work` (which writes through `send`); cancel it when the client stalls (then raise
        ClientStalled). Cancelling closes the upstream response inside `work`, and vLLM aborts it."""
        task = asyncio.ensure_future(work)
        watchdog = asyncio.ensure_future(self.stalled())
        try:
            await asyncio.wait((task, watchdog), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watchdog.cancel()
            if not task.done():  # stalled, or cancelled from outside: the client left
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise ClientStalled
        return task.result()


class WatchedAnswer(LeavableAnswer):
    """A LeavableAnswer that also leaves a client that stops reading for `stall_s` (VL_CLIENT_STALL_S): its
    generation is aborted like a departed client's, and the trace says `client_stalled`."""

    stall_s: float

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guard = StallGuard(send, self.stall_s)
        try:
            await unless_client_leaves(receive, guard.unless_stalled(self.serve(guard.send)))
        except ClientGone:
            self.trace["stop"] = "client_gone"
        except ClientStalled:
            self.trace["stop"] = "client_stalled"
            scope["extensions"][DROP]["drop"]()  # uvicorn's own close would wait for the client to read, forever
