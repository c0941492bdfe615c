"""The desktop's public door (port 6080): the password, checked before anything runs for a client, under
limits of time, number and rate.

websockify forks a process per connection and then waits for its head for ever: on the public port, 200
silent connections held 200 processes (479 MB) before any password was checked, and guesses ran at 82 a
second. The gate reads each head itself (a bounded time and size), keeps the number of connections (in all,
and per address) under a cap, checks the password, and slows repeated wrong ones, per address and in all.
Only then does it hand the request on to websockify, which listens on a loopback port and takes, in place
of the user's password, a token drawn at each start: websockify never sees the password, and nothing in
the pod reaches it without the gate.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus

from runtime.pod.desktop_auth import REALM, basic_password_matches
from runtime.ratelimit import RateLimit

log = logging.getLogger("runtime.pod.desktop")

MAX_HEAD_BYTES = 16 * 2**10  # request line and headers: a browser sends ~1 KiB here (no cookie of ours)
MAX_HEADERS = 64
HEAD_TIMEOUT_S = 10.0  # for the whole head: a browser sends it at once
MAX_CONNECTIONS = 32  # each one past the gate is a websockify process (~2.4 MB); a browser opens 6 at a time
MAX_PER_ADDRESS = 12  # RunPod's proxy is one address for every user: the cap in all is what protects there
BUSY_RETRY_S = 5
CHUNK = 64 * 2**10
LINGER_S = 2.0  # after an answer of its own, for it to reach a client still sending (closing sooner resets it)
WARN_EVERY_S = 60.0  # wrong passwords are told at most this often: guesses must not flood the log
MAX_ADDRESSES = 4096  # addresses remembered for their wrong passwords: the oldest forgiven first beyond
GATE_USER = "gate"  # the user name the gate's token goes with, in the head it hands to websockify

TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
REQUEST_LINE = re.compile(rb"([A-Z]{1,16}) (/[\x21-\x7e]*) (HTTP/1\.[01])")
FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([\x20-\x7e\t\x80-\xff]*?)[ \t]*")
# Not handed on: the user's password, and the hop-by-hop fields of a request that is not an upgrade (it is
# closed after its answer, so that a proxy's shared connection never carries a second, unchecked request).
DROPPED = {b"authorization", b"proxy-authorization"}
HOP_BY_HOP = {b"connection", b"keep-alive", b"upgrade", b"te", b"transfer-encoding"}


@dataclass
class Throttle:
    """Wrong passwords slowed per address (5, then one every 3 s) and in all (20, then one a second): the
    owner's own typo costs nothing, and a guesser gets a few thousand tries an hour, not 300,000."""

    clock: Callable[[], float] = time.monotonic
    total: RateLimit = field(init=False)
    by_address: dict[str, RateLimit] = field(default_factory=dict)
    unreported: Counter[str] = field(default_factory=Counter)  # wrong passwords since the last warning
    warned_at: float = -math.inf

    def __post_init__(self) -> None:
        self.total = RateLimit(20, 1.0, self.clock)

    def wait_s(self, address: str) -> float:
        own = self.by_address.get(address)
        return max(self.total.wait_s(), own.wait_s() if own else 0.0)

    def failed(self, address: str) -> None:
        now = self.clock()
        self.total.spend()
        self.by_address.setdefault(address, RateLimit(5, 3.0, self.clock)).spend()
        self.forget_forgiven()
        self.unreported[address] += 1
        if now - self.warned_at >= WARN_EVERY_S:
            self.warned_at = now
            worst = ", ".join(f"{count} from {where}" for where, count in self.unreported.most_common(3))
            log.warning(
                "desktop: %d wrong password(s) since the last such line (%s); repeated ones are slowed "
                "(this line at most once a minute)",
                self.unreported.total(),
                worst,
            )
            self.unreported.clear()

    def forget_forgiven(self) -> None:
        """Bound the memory an address flood can take: forgiven addresses first, then the oldest."""
        if len(self.by_address) <= MAX_ADDRESSES:
            return
        for address in [a for a, limit in self.by_address.items() if limit.level() == 0]:
            del self.by_address[address]
        while len(self.by_address) > MAX_ADDRESSES:
            del self.by_address[next(iter(self.by_address))]


@dataclass(frozen=True)
class Head:
    """A request's line and fields, as read (field names lower-cased for lookups)."""

    method: bytes
    target: bytes
    version: bytes
    fields: list[tuple[bytes, bytes]]

    def get(self, name: bytes) -> bytes | None:
        values = [value for field_name, value in self.fields if field_name.lower() == name]
        return b", ".join(values) if values else None

    def words(self, name: bytes) -> set[bytes]:
        return {word.strip().lower() for word in (self.get(name) or b"").split(b",")}

    @property
    def is_upgrade(self) -> bool:
        return b"upgrade" in self.words(b"connection") and b"websocket" in self.words(b"upgrade")


class Refusal(Exception):
    """An answer the gate gives itself: a status and one line."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, list(headers)


def parse_head(raw: bytes) -> Head:
    lines = raw.removesuffix(b"\r\n\r\n").split(b"\r\n")
    line = REQUEST_LINE.fullmatch(lines[0])
    if line is None:
        raise Refusal(400, "not an HTTP/1 request line")
    if len(lines) - 1 > MAX_HEADERS:
        raise Refusal(431, f"more than {MAX_HEADERS} header fields")
    fields = []
    for text in lines[1:]:
        match = FIELD.fullmatch(text)
        if match is None:
            raise Refusal(400, "a malformed header field")
        fields.append((match[1], match[2]))
    method, target, version = line.groups()
    return Head(method, target, version, fields)


def checked(head: Head) -> None:
    """What the desktop serves: files and its WebSocket, both by GET; nothing with a body."""
    if head.method not in (b"GET", b"HEAD"):
        raise Refusal(405, "the desktop answers GET only", [("Allow", "GET, HEAD")])
    if head.get(b"transfer-encoding") is not None or (head.get(b"content-length") or b"0").strip() != b"0":
        raise Refusal(400, "the desktop takes no request body")


def handed_on(head: Head, token: str) -> bytes:
    """The head websockify gets: the gate's token for the user's password; `Connection: close` unless it
    is a WebSocket upgrade."""
    upgrade = head.is_upgrade
    dropped = DROPPED if upgrade else DROPPED | HOP_BY_HOP
    credential = base64.b64encode(f"{GATE_USER}:{token}".encode())
    lines = [b"%s %s %s" % (head.method, head.target, head.version)]
    lines += [b"%s: %s" % (name, value) for name, value in head.fields if name.lower() not in dropped]
    lines.append(b"Authorization: Basic " + credential)
    if not upgrade:
        lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def closing(answer_head: bytes) -> bytes:
    """websockify's answer head, saying that the connection closes after it (websockify closes it, but says
    nothing: a browser would send its next request on a connection about to close)."""
    lines = answer_head.removesuffix(b"\r\n\r\n").split(b"\r\n")
    kept = [line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in (b"connection", b"keep-alive")]
    return b"\r\n".join([lines[0], *kept, b"Connection: close"]) + b"\r\n\r\n"


@dataclass
class Gate:
    """The door: `serve_client` is asyncio.start_server's callback for port 6080."""

    password: str
    upstream: tuple[str, int]  # websockify's loopback address
    token: str  # what websockify takes instead of the password
    throttle: Throttle = field(default_factory=Throttle)
    head_timeout_s: float = HEAD_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    max_per_address: int = MAX_PER_ADDRESS
    open: Counter[str] = field(default_factory=Counter)

    async def serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) else "local"
        try:
            if self.open.total() >= self.max_connections or self.open[address] >= self.max_per_address:
                raise Refusal(
                    503, "too many connections to the desktop; try again shortly", [("Retry-After", str(BUSY_RETRY_S))]
                )
            self.open[address] += 1
            try:
                await self.let_in(address, reader, writer)
            finally:
                self.open[address] -= 1
                if not self.open[address]:
                    del self.open[address]
        except Refusal as refusal:
            await answer(reader, writer, refusal)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the client left, sent no head in time, or websockify gave no answer: nothing to answer
        finally:
            writer.close()

    async def let_in(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout_s)
        except asyncio.LimitOverrunError:
            raise Refusal(431, f"the request's head exceeds {MAX_HEAD_BYTES // 2**10} KiB") from None
        head = parse_head(raw)
        checked(head)
        self.authenticate(address, head.get(b"authorization"))
        await self.hand_on(head, reader, writer)

    def authenticate(self, address: str, header: bytes | None) -> None:
        challenge = [("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')]
        if header is None:  # a browser's first request: it asks its user, then sends the password
            raise Refusal(401, "the desktop's password is needed", challenge)
        if wait := self.throttle.wait_s(address):  # refused before checking: a guess learns nothing
            raise Refusal(
                429, "too many wrong passwords: wait before trying again", [("Retry-After", str(math.ceil(wait)))]
            )
        if not basic_password_matches(header.decode("latin-1"), self.password.encode()):
            self.throttle.failed(address)
            raise Refusal(401, "wrong password", challenge)

    async def hand_on(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            raise Refusal(502, "the desktop is not up (yet): try again in a few seconds") from None
        try:
            upstream_writer.write(handed_on(head, self.token))
            copies = [copy(upstream_reader, writer)]
            if head.is_upgrade:  # the WebSocket's frames both ways
                copies.append(copy(reader, upstream_writer))
            else:  # the answer, saying that it is the connection's last; the client sends nothing more
                writer.write(closing(await upstream_reader.readuntil(b"\r\n\r\n")))
            tasks = [asyncio.ensure_future(one) for one in copies]
            try:
                await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            upstream_writer.close()


async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from one side to the other until the first side ends (or either fails)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass


async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refusal: Refusal) -> None:
    """The gate's own answer; then what the client still sends is read and dropped for a moment, so that the
    close does not reset the connection before the client has read why."""
    body = f"{refusal.message}\n".encode()
    head = [
        f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{n}: {v}" for n, v in refusal.headers),
    ]
    try:
        writer.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        await asyncio.wait_for(writer.drain(), LINGER_S)
        writer.write_eof()
        await asyncio.wait_for(drop_until_end(reader), LINGER_S)
    except (ConnectionError, TimeoutError):
        pass


async def drop_until_end(reader: asyncio.StreamReader) -> None:
    while await reader.read(CHUNK):
        pass
