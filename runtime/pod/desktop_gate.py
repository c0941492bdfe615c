"""The desktop's public door (port 6080): the password, checked before anything runs for a client, under
limits of time, number and rate that never keep out the one who has it.

websockify forks a process per connection and then waits for its head for ever: on the public port, 200
silent connections held 200 processes (479 MB) before any password was checked, and guesses ran at 82 a
second. The gate reads each head itself (a bounded time and size; the connections still sending theirs are
capped apart, the one waiting longest closed for a newcomer), checks the password, answers repeated wrong
ones 429, per client and in all, and caps the connections it lets in (in all, and per client). Only then does
it hand the request on to websockify, which listens on a loopback port and takes, in place of the user's
password, a token drawn at each start: websockify never sees the password, and nothing in the pod reaches
it without the gate.

Behind RunPod's proxy every client has the proxy's address, so nothing a stranger does may refuse the right
password: it is checked first, whatever the wrong ones before it, and strangers' slow heads take no room
from the connections let in. A client is the address the proxy says (X-Forwarded-For's last entry) only
when the peer is the proxy (a private network); anyone else could write any address there.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus

from runtime.pod.desktop_auth import REALM, basic_password_matches
from runtime.ratelimit import RateLimit

log = logging.getLogger("runtime.pod.desktop")

MAX_HEAD_BYTES = 16 * 2**10  # request line and headers: a browser sends ~1 KiB here (no cookie of ours)
MAX_HEADERS = 64
HEAD_TIMEOUT_S = 10.0  # for the whole head: a browser sends it at once
MAX_HEADS = 64  # connections still sending their head (~32 KiB each at most): the oldest closed for a newcomer
MAX_SESSIONS = 32  # each one past the gate is a websockify process (~2.4 MB); a browser opens 6 at a time
MAX_PER_ADDRESS = 12  # sessions per client: behind RunPod's proxy, unless it says whose, one address for all
# Where RunPod's proxy reaches a pod from (its own network, never the internet, never the pod itself): a peer
# there may say whose request it carries. Loopback is left out: a process in the pod must not pick its address.
PROXY_NETWORKS = tuple(
    ipaddress.ip_network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
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
    """Wrong passwords answered 429 past 5 per client (then one every 3 s) and 20 in all (then one a second),
    and told in the log. The right password is never slowed, so a 429 tells a guesser it guessed wrong."""

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

    def failed(self, address: str) -> float:
        """Counts a wrong password from `address` unless it came while slowed (so a flood's wait stays ~3 s),
        and tells of it in the log; returns the seconds it had to wait (0: it was answered 401)."""
        wait = self.wait_s(address)
        if not wait:
            self.total.spend()
            self.by_address.setdefault(address, RateLimit(5, 3.0, self.clock)).spend()
            self.forget_forgiven()
        self.told(address)
        return wait

    def told(self, address: str) -> None:
        """One line a minute at most, naming the worst addresses: guesses must not flood the log (nor its
        count the memory: past MAX_ADDRESSES, new ones are counted together)."""
        now = self.clock()
        known = address in self.unreported or len(self.unreported) < MAX_ADDRESSES
        self.unreported[address if known else "other addresses"] += 1
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


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def peer_address(writer: asyncio.StreamWriter) -> str:
    """The connection's other end, an IPv4 client of a dual-stack socket as IPv4 (`::ffff:10.0.0.1` is 10.0.0.1)."""
    peer = writer.get_extra_info("peername")
    if not isinstance(peer, tuple):
        return "local"
    address = ipaddress.ip_address(str(peer[0]).partition("%")[0])
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return str(mapped or address)


def client_address(peer: str, head: Head, proxies: Iterable[Network]) -> str:
    """Whose request it is: the last X-Forwarded-For entry (the one the proxy wrote; a client writes those
    before it) when the peer is a proxy, else the peer itself."""
    if peer == "local" or not any(ipaddress.ip_address(peer) in net for net in proxies):
        return peer
    said = (head.get(b"x-forwarded-for") or b"").split(b",")[-1].strip().decode("latin-1")
    try:
        return str(ipaddress.ip_address(said))
    except ValueError:
        return peer


@dataclass
class Heads:
    """The connections not let in (yet): their head on its way, or the gate's own answer. At most `cap`; a
    newcomer past it closes the one here longest, so slow heads never keep out a browser that sends its own."""

    cap: int = MAX_HEADS
    waiting: dict[asyncio.StreamWriter, None] = field(default_factory=dict)  # the oldest first

    def enter(self, writer: asyncio.StreamWriter) -> None:
        while len(self.waiting) >= self.cap:
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            oldest.transport.abort()  # its reader ends: the head it waits for never comes
        self.waiting[writer] = None

    def leave(self, writer: asyncio.StreamWriter) -> None:
        self.waiting.pop(writer, None)


@dataclass
class Sessions:
    """The connections let in, each a websockify process: at most `cap` in all and `per_client` per client;
    past either, 503 at once (only to someone with the password: strangers never get this far)."""

    cap: int = MAX_SESSIONS
    per_client: int = MAX_PER_ADDRESS
    open: Counter[str] = field(default_factory=Counter)

    @contextmanager
    def held(self, client: str) -> Iterator[None]:
        if self.open.total() >= self.cap or self.open[client] >= self.per_client:
            raise Refusal(
                503, "too many connections to the desktop; try again shortly", [("Retry-After", str(BUSY_RETRY_S))]
            )
        self.open[client] += 1
        try:
            yield
        finally:
            self.open[client] -= 1
            if not self.open[client]:
                del self.open[client]


@dataclass
class Gate:
    """The door: `serve_client` is asyncio.start_server's callback for port 6080."""

    password: str
    upstream: tuple[str, int]  # websockify's loopback address
    token: str  # what websockify takes instead of the password
    throttle: Throttle = field(default_factory=Throttle)
    head_timeout_s: float = HEAD_TIMEOUT_S
    heads: Heads = field(default_factory=Heads)
    sessions: Sessions = field(default_factory=Sessions)
    proxies: tuple[Network, ...] = PROXY_NETWORKS  # peers whose X-Forwarded-For names the client

    async def serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.heads.enter(writer)
        try:
            head, client = await self.admitted(peer_address(writer), reader)
            with self.sessions.held(client):
                self.heads.leave(writer)
                await self.hand_on(head, reader, writer)
        except Refusal as refusal:
            await answer(reader, writer, refusal)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass  # the client left, sent no head in time, or websockify gave no answer: nothing to answer
        finally:
            self.heads.leave(writer)
            writer.close()

    async def admitted(self, peer: str, reader: asyncio.StreamReader) -> tuple[Head, str]:
        """The head, once it came in time, is one the desktop serves and carries the password; and whose it is."""
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout_s)
        except asyncio.LimitOverrunError:
            raise Refusal(431, f"the request's head exceeds {MAX_HEAD_BYTES // 2**10} KiB") from None
        head = parse_head(raw)
        checked(head)
        client = client_address(peer, head, self.proxies)
        self.authenticate(client, head.get(b"authorization"))
        return head, client

    def authenticate(self, client: str, header: bytes | None) -> None:
        """The right password first, in constant time, and never slowed; wrong ones get 401, or 429 while slowed."""
        challenge = [("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')]
        if header is None:  # a browser's first request: it asks its user, then sends the password
            raise Refusal(401, "the desktop's password is needed", challenge)
        if basic_password_matches(header.decode("latin-1"), self.password.encode()):
            return  # whatever others sent from the same address (behind RunPod's proxy: everyone)
        if wait := self.throttle.failed(client):
            raise Refusal(
                429, "too many wrong passwords: wait before trying again", [("Retry-After", str(math.ceil(wait)))]
            )
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
