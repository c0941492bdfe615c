"""The client's side of a request: its head and body under limits of size and time, and a cap on open
connections (an answer's own life, leaving a client that left or stalled, is `answer`'s).

The port is public: `GuardedHttp` bounds what uvicorn does not (a 256 MiB header cost 82 s of CPU,
idle connections stayed open by thousands). Only reading a request is bounded, never an answer:
Claude Code's streams last minutes.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import socket
import struct
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Literal

from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from runtime.bridge.errors import BridgeError, envelope

log = logging.getLogger("runtime.bridge")

MAX_HEAD_BYTES = 64 * 2**10  # request line and headers: Claude Code sends ~2 KiB, nginx refuses beyond 32 KiB
MAX_HEADERS = 100  # Apache's default; Claude Code sends ~20
BODY_MIN_RATE = 8 * 2**10  # bytes/s a body must average after its grace: one byte every few seconds is cut off
LINGER_S = 2.0  # after a refusal, for the answer to reach a client still sending (closing sooner resets it)
WARN_EVERY_S = 60.0  # the full-house warning, at most this often: a flood must not flood the log
# In `scope["extensions"]`, a dict as ASGI has them, what an answer needs to leave its client: "gone", a
# future done once the client left (or the answer is refused), and "drop", which resets the connection now.
CONNECTION = "vlpod.connection"
RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset and discards what is unsent


@dataclass
class ReadLimits:
    """How long a client may take to send a request, how many connections may be open, and what the
    connections share to keep that number: the idle ones, the one idle the longest first."""

    head_timeout_s: float
    body_timeout_s: float
    max_connections: int
    idle: dict[GuardedHttp, None] = field(default_factory=dict)
    warned_at: float = -math.inf


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the bounds it lacks on reading a request.

    A head (request line and headers) must arrive within `head_timeout_s` and stay within
    MAX_HEAD_BYTES and MAX_HEADERS (else 431, counted as it arrives, before its parsing costs grow);
    a body must start within `body_timeout_s` and then average BODY_MIN_RATE (else 408). A fresh
    connection may idle as long as a kept-alive one (uvicorn times out only the latter). Beyond
    `max_connections`, the connection idle the longest is closed, so that `/health` always gets in.
    """

    def __init__(self, *args: Any, limits: ReadLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.reading: Literal["head", "body"] | None = None  # the part of a request under a deadline
        self.deadline = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.head_bytes = 0
        self.head_began_in_read = False  # a pipelined head began after a body in the read being parsed
        self.refused = False  # answered by this protocol, or past an upgrade not performed: nothing more is read
        self.gone: asyncio.Future[None] = self.loop.create_future()  # what an answer watches, without a task
        self.extension: dict[object, object] = {"gone": self.gone, "drop": self.drop}  # CONNECTION's

    # --- connections: a cap, and idle ones make room ---

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.become_idle()
        if len(self.connections) > self.limits.max_connections:
            self.make_room()
        # uvicorn times out only a connection kept alive after an answer: a fresh one gets as long.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_clock()
        self.limits.idle.pop(self, None)
        self.client_left()
        super().connection_lost(exc)
        # The extension's `drop` is this protocol's: left there, it keeps every connection's objects in a
        # cycle (protocol, scope, extension), for the cycle collector to find (~30 objects, ~30 µs a request).
        self.extension["drop"] = already_closed

    def client_left(self) -> None:
        """Tell the answer under way, if any, that its client is gone (`gone` in the extension)."""
        if not self.gone.done():
            self.gone.set_result(None)

    def become_idle(self) -> None:
        """Count this connection among the idle ones, the last to make room; not while it serves a request."""
        if (
            self.transport.is_closing()
            or self.pipeline
            or (self.cycle is not None and not self.cycle.response_complete)
        ):
            return
        self.limits.idle.pop(self, None)
        self.limits.idle[self] = None

    def make_room(self) -> None:
        """Close the connection idle the longest: this new one when every other is serving a request,
        unless it comes from this machine (the supervisor's watchdog must reach `/health`)."""
        victim = next(iter(self.limits.idle))
        if victim is self and self.client is not None and ipaddress.ip_address(self.client[0]).is_loopback:
            return
        del self.limits.idle[victim]
        self.connections.discard(victim)  # counted out now, not when the loop gets to its close
        victim.transport.close()
        now = self.loop.time()
        if now - self.limits.warned_at >= WARN_EVERY_S:
            self.limits.warned_at = now
            log.warning(
                "%d client connections open, the most allowed: closing the idle ones, longest idle first "
                "(this warning at most once a minute)",
                self.limits.max_connections,
            )

    def _unsupported_upgrade_warning(self) -> None:
        """uvicorn's call for a request asking for an upgrade it does not perform (the bridge performs none:
        a WebSocket, h2c): that request is answered as plain HTTP (RFC 9110 allows it) and traced like any
        other, then the connection closes. The parser takes all that follows its head for the other
        protocol's bytes, a body included: read on, that body would be parsed as a request of its own, and a
        proxy's connection shared by several clients would be out of step. No warning: it was a line per
        request, anyone's to send."""
        self.refused = True
        if self.cycle is not None:
            self.cycle.keep_alive = False  # `connection: close` on its answer, and the close after it

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.become_idle()

    # --- reading a request: deadlines and sizes ---

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if self.reading is None:  # the first bytes of a head
            self.start_clock("head", self.limits.head_timeout_s)
            self.become_idle()  # a request may follow: the last to make room
        self.head_began_in_read = False
        super().data_received(data)
        # The head is still incomplete after this read: count it, unless the head began after a body in it
        # (the previous request's bytes are not this head's; its own are counted exactly once complete).
        if self.reading == "head" and not self.transport.is_closing() and not self.head_began_in_read:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                self.refuse(431, f"the request's head exceeds the bridge's limit of {MAX_HEAD_BYTES // 2**10} KiB")

    def on_message_begin(self) -> None:
        if self.refused:
            return
        super().on_message_begin()
        self.scope.setdefault("extensions", {})[CONNECTION] = self.extension
        if self.reading is None:  # a pipelined request, begun in the read that ended the one before
            self.start_clock("head", self.limits.head_timeout_s)
            self.head_began_in_read = True

    def on_headers_complete(self) -> None:
        if self.refused:
            return
        if len(self.headers) > MAX_HEADERS:
            self.refuse(431, f"the request has more than {MAX_HEADERS} headers, the bridge's limit")
            return
        if len(self.url) + sum(map(len, chain.from_iterable(self.headers))) + 4 * len(self.headers) > MAX_HEAD_BYTES:
            self.refuse(431, f"the request's head exceeds the bridge's limit of {MAX_HEAD_BYTES // 2**10} KiB")
            return
        codings = b",".join(value for name, value in self.headers if name == b"transfer-encoding")  # names: lower case
        if codings and [c.strip().lower() for c in codings.split(b",")] != [b"chunked"]:
            # The parser would read `gzip, chunked` as chunked and hand on a body still compressed.
            self.refuse(501, "the only transfer coding the bridge reads is `chunked`, alone")
            return
        self.start_clock("body", self.limits.body_timeout_s)
        self.limits.idle.pop(self, None)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self.refused:
            return
        self.deadline += len(body) / BODY_MIN_RATE
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.refused:
            return
        self.stop_clock()
        super().on_message_complete()

    def start_clock(self, part: Literal["head", "body"], timeout_s: float) -> None:
        """Give the client `timeout_s` to send this part of its request (a body earns more as it comes). A timer
        due sooner stays (`time_up` waits on to the deadline): the body's clock takes over the head's."""
        self.reading, self.deadline, self.head_bytes = part, self.loop.time() + timeout_s, 0
        if self.timer is None or self.timer.when() > self.deadline:
            self.stop_timer()
            self.timer = self.loop.call_at(self.deadline, self.time_up)

    def stop_clock(self) -> None:
        self.stop_timer()
        self.reading = None

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def time_up(self) -> None:
        """A slow head is closed; a slow body gets a 408, unless the app has answered already. Never
        while an earlier request's answer is being sent: a request behind it waits, unread."""
        now = self.loop.time()
        if self.pipeline or (self.reading == "head" and self.cycle is not None and not self.cycle.response_complete):
            self.deadline = now + self.limits.head_timeout_s
        if now < self.deadline:  # more time: a body earned it as it came, or an answer is under way
            self.timer = self.loop.call_at(self.deadline, self.time_up)
            return
        if self.reading == "body" and not self.cycle.response_started:
            self.refuse(408, "the request body did not arrive in time: the client sent it too slowly, or stopped")
        else:
            self.stop_clock()
            self.transport.close()

    def drop(self) -> None:
        """Reset the connection, unsent bytes and all: a plain close waits for a client that stopped reading
        to take them, forever (and even an abort leaves them to the kernel). The answer under way ends as if
        its client had left (no error logged)."""
        if self.cycle is not None:
            self.cycle.disconnected = True
        self.client_left()
        self.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_ON_CLOSE)
        self.transport.abort()

    def refuse(self, status: int, message: str) -> None:
        """Answer `status` in the Anthropic envelope and read no more; close once the answer could
        reach a client that is still sending (closing with unread data resets the connection)."""
        self.refused = True
        self.stop_clock()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app stops reading, and nothing it sends goes out
            self.cycle.message_event.set()
            self.client_left()
        body = envelope(status, message)
        head = [
            STATUS_LINE[status],
            *(name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers),
            b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body),
        ]
        self.transport.write(b"".join(head) + body)
        self.flow.pause_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)
        log.info("refused a request from %s: %d %s", self.client[0] if self.client else "?", status, message)


def already_closed() -> None:
    """The `drop` of a connection that is gone: nothing left to reset."""


async def read_body(request: Request, limit: int, which: str = "") -> bytes:
    """The whole body, or a 413 as soon as it is known to exceed `limit` bytes (`which` limit, when it is not
    VL_MAX_BODY_MB: the 413 names the limit the body passed), or a 408 when it stops."""
    which = which or f"the bridge's limit of {limit // 2**20} MiB (VL_MAX_BODY_MB)"
    too_large = BridgeError(413, f"the request body exceeds {which}")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # the client left, or `GuardedHttp` cut it off and answered 408 itself
        raise BridgeError(
            408, "the request body did not arrive in full: the client stopped sending it, or left"
        ) from None
    return b"".join(chunks)
