"""One answer's life on the client's side: its writes, a ping while the engine is silent, and leaving
the moment its client leaves or stops reading.

Leaving matters: Claude Code re-sends a request after ~300 s without a byte while the first one is still
being served (the seeds' first bridge generated for nobody until its pool filled), and a client that stops
reading would hold an upstream slot for as long as it liked. The answer runs in the request's own task,
cancelled on either: the upstream response closes, and vLLM aborts the generation. A busy stream pays
one clock read per write, and no task, timer or lock per token.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import Gauge
from starlette.types import Message, Receive, Scope, Send

from runtime.bridge.cachemiss import Prompts
from runtime.bridge.connection import CONNECTION
from runtime.bridge.models import Catalog
from runtime.bridge.swaps import Swaps
from runtime.bridge.trace import Trace
from runtime.bridge.upstream import Upstream

GONE = "client_gone"  # the trace's `stop` for a client that closed its connection before the end
STALLED = "client_stalled"  # for one that let a write wait `stall_s` (VL_CLIENT_STALL_S)


@dataclass(frozen=True)
class Serving:
    """What an answer is handed: the upstream, the served model, the open streams' gauge, and the settings
    that shape an answer (VL_BRIDGE_PING_S, VL_CLIENT_STALL_S, VL_LOG_PROMPTS, VL_GUARD with the count of
    the writes it blocked, by tool label)."""

    upstream: Upstream
    catalog: Catalog
    open_streams: Gauge
    ping_s: float
    stall_s: float
    log_prompts: bool
    swaps: Swaps | None = None  # VL_SWAP's: a request may have to wait for another model
    prompts: Prompts = field(default_factory=Prompts)  # the fingerprints behind `diagnostics.cache_miss_reason`
    guard: bool = True
    count_blocked_write: Callable[[str], None] = lambda label: None
    data_parallel: int = 1  # VL_DP: each conversation pinned to one of vLLM's data-parallel engines
    down_ranks: Callable[[], frozenset[int]] = frozenset  # those of a cluster's lost node (runtime.state.dpranks)


class Outbox:
    """The answer's way to its client: an ASGI `send` that notes when writes begin and end (uvicorn's waits
    while the client's socket is full: what the stall watch reads), and a stream's pings."""

    def __init__(self, send: Send) -> None:
        self.inner = send
        self.waiting = 0  # writes begun and not yet done (a ping can overlap a chunk)
        self.since = 0.0  # when the wait began: the first of these writes, or the last one done
        self.last_write = time.monotonic()  # what a stream's silence is measured from
        self.pings: Pings | None = None

    async def send(self, message: Message) -> None:
        now = self.last_write = time.monotonic()
        if not self.waiting:
            self.since = now
        self.waiting += 1
        try:
            await self.inner(message)
        finally:
            self.waiting -= 1
            if self.waiting:  # progress: the writes still waiting count from now
                self.since = time.monotonic()

    async def start(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        ping: bytes,
        interval: float,
        before_ping: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        """A stream's head; then `ping` after each `interval` without a write, until `end` or `stop`."""
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        self.pings = Pings(self, ping, interval, before_ping)

    def write(self, data: bytes) -> Awaitable[None]:  # `send`'s own awaitable: no coroutine more per write
        return self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.stop()
        await self.send({"type": "http.response.body", "body": data, "more_body": False})

    def stop(self) -> None:
        if self.pings is not None:
            self.pings.stop()
            self.pings = None


class Pings:
    """Writes `ping` to a stream after each `interval` without a write (`before`'s bytes first: what must
    precede it). One timer, re-armed from the last write when it fires: never per token."""

    def __init__(
        self, out: Outbox, ping: bytes, interval: float, before: Callable[[], Awaitable[bytes]] | None
    ) -> None:
        self.out = out
        self.ping = ping
        self.interval = interval
        self.before = before  # e.g. a message_start not said yet
        self.pinging: asyncio.Task[None] | None = None
        self.timer = asyncio.get_running_loop().call_later(interval, self.due)

    def due(self) -> None:
        silent = time.monotonic() - self.out.last_write
        if silent < self.interval:
            self.timer = asyncio.get_running_loop().call_later(self.interval - silent, self.due)
        else:
            self.pinging = asyncio.ensure_future(self.write())

    async def write(self) -> None:
        first = await self.before() if self.before is not None else b""
        await self.out.write(first + self.ping)
        self.due()

    def stop(self) -> None:
        self.timer.cancel()
        if self.pinging is not None:
            self.pinging.cancel()


class ClientWatch:
    """Cancels the task that serves an answer the moment its client leaves (`gone`, the connection's) or
    stalls (a write waiting `stall_s` with none completing), as `asyncio.timeout` cancels: its own
    cancellation is taken back, anyone else's (a shutdown) goes on. A callback and a timer, no task."""

    def __init__(self, out: Outbox, stall_s: float, gone: asyncio.Future[None]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task  # the one serving the answer: this watch is made, and runs, in it
        self.out = out
        self.stall_s = stall_s
        self.gone = gone
        self.left: str | None = None  # GONE or STALLED, once the client was left
        self.over = False
        self.stall_timer = asyncio.get_running_loop().call_later(stall_s, self.check_stall)

    async def run(self, work: Awaitable[None]) -> str | None:
        """Await `work`; None when it ended, else why its client was left."""
        cancelling = self.task.cancelling()
        self.gone.add_done_callback(self.client_gone)
        try:
            await work
        except asyncio.CancelledError:
            if self.left is None or self.task.uncancel() > cancelling:
                raise
            return self.left
        finally:
            self.over = True  # a callback already scheduled finds nothing left to do
            self.gone.remove_done_callback(self.client_gone)
            self.stall_timer.cancel()
        if self.left is not None:  # `work` swallowed the cancellation: it is taken back all the same
            self.task.uncancel()
        return self.left

    def client_gone(self, _: asyncio.Future[None]) -> None:
        self.leave(GONE)

    def check_stall(self) -> None:
        """Leave a client whose write waited `stall_s`; else look again `stall_s` after the wait (or now)
        began: once per `stall_s` at most, never per write."""
        now = time.monotonic()
        if self.out.waiting and now - self.out.since >= self.stall_s:
            self.leave(STALLED)
            return
        start = self.out.since if self.out.waiting else now
        self.stall_timer = asyncio.get_running_loop().call_later(start + self.stall_s - now, self.check_stall)

    def leave(self, why: str) -> None:
        if not self.over and self.left is None:
            self.left = why
            self.task.cancel()


class Answer:
    """An ASGI response whose `serve` stops the moment its client leaves or stops reading: its generation is
    aborted, the trace's `stop` says `client_gone` or `client_stalled`, and a stalled client is reset."""

    serving: Serving
    trace: Trace

    async def serve(self, out: Outbox) -> None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        connection = scope["extensions"][CONNECTION]  # GuardedHttp's, which the bridge always runs on
        out = Outbox(send)
        left = await ClientWatch(out, self.serving.stall_s, connection["gone"]).run(self.serve(out))
        if left is not None:
            self.trace.stop = left
        if left == STALLED:
            connection["drop"]()  # uvicorn's own close would wait for the client to read, forever
