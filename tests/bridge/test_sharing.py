"""Fair sharing of the engine (issue 9, item 4): one key cannot hold more than its share of the
upstream pool with streams it never reads, and a client that stops reading is dropped.

The client that reads nothing is a raw socket with a tiny receive buffer; the stand-in upstream
(`tests/support/upstream.py`) plays an engine whose streams outlast any test.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from runtime.bridge.errors import RETRY_AFTER_S
from runtime.bridge.sharing import key_cap
from tests.support.bridge import SLOW_WAIT_S, Process, start_bridge, start_stand_in
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow  # bridge processes, and a client that stalls until the bridge drops it

KEY_A, KEY_B = "a" * 24, "b" * 24
KEYS = f"alice:{KEY_A} bob:{KEY_B}:admin"  # bob reads /metrics while alice holds all her share
POOL = 4  # the bridge's upstream pool (--max-connections) in these tests: two keys, a fair share of 2
USER = {"role": "user", "content": "hi"}
ENDLESS = {  # streams of a million tokens at the stand-in's pace: they outlast the test
    "/v1/messages": {"model": "claude-test", "max_tokens": 1_000_000, "stream": True, "messages": [USER]},
    "/v1/chat/completions": {"max_tokens": 1_000_000, "stream": True, "messages": [USER]},
}
SHORT = {"model": "claude-test", "max_tokens": 2, "messages": [USER]}
STATUS_LINE = len(b"HTTP/1.1 200")
TINY_BUFFER = 1024  # bytes asked for: the kernel gives its least receive buffer (~2 KiB), full after a few events
STALL_S = "2"  # VL_CLIENT_STALL_S here: above the least ping interval (1 s), so that pings could hide a stall


def test_the_default_cap_splits_the_pool_among_keys_and_never_binds_one_user_before_the_pool() -> None:
    assert key_cap(512, 0, None) is None  # open: one label, the only user; a full pool stays a 529
    assert key_cap(512, 1, None) is None
    assert key_cap(512, 3, None) == 170
    assert key_cap(2, 5, None) == 1  # more keys than slots: each key still gets one
    assert key_cap(512, 0, 8) == 8  # VL_KEY_CONCURRENCY: as set, open or not
    assert key_cap(512, 3, 512) is None


@contextmanager
def unread_stream(bridge: Process, route: str, key: str | None = None) -> Iterator[tuple[int, socket.socket]]:
    """A streamed request from a client that reads its answer's status and nothing more: (status, socket)."""
    body = json.dumps(ENDLESS[route]).encode()
    head = [
        f"POST {route} HTTP/1.1",
        "Host: 127.0.0.1",
        "content-type: application/json",
        f"content-length: {len(body)}",
    ]
    if key is not None:
        head.append(f"x-api-key: {key}")
    host, port = bridge.url.removeprefix("http://").split(":")
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, TINY_BUFFER)  # before connecting: the window follows it
        sock.settimeout(SLOW_WAIT_S)
        sock.connect((host, int(port)))
        sock.sendall("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        status = b""
        while len(status) < STATUS_LINE:
            status += sock.recv(STATUS_LINE - len(status))
        yield int(status.split()[1]), sock


def read_until_closed(sock: socket.socket) -> bytes:
    """What the bridge had still to send, until it closed the connection (a reset counts as the close)."""
    received = b""
    try:
        while data := sock.recv(65536):
            received += data
    except ConnectionResetError:
        pass
    return received


def test_a_key_beyond_its_share_gets_429_while_another_key_still_gets_200(tmp_path: Path) -> None:
    """Key A tries to take the whole pool with streams it never reads: beyond its share it gets 429
    `rate_limit_error` with `retry-after` (traced, counted), while key B is served from the same pool.
    A request counts until its stream ends: once A's streams are gone, A is served again."""
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "1000000", "--pace-ms", "20") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log", {"VL_API_KEYS": KEYS}, "--max-connections", str(POOL),
                     "--pool-timeout", "1") as bridge,
    ):  # fmt: skip
        with ExitStack() as streams:
            statuses = [streams.enter_context(unread_stream(bridge, "/v1/messages", KEY_A))[0] for _ in range(POOL)]
            assert statuses == [200, 200, 429, 429]
            with httpx.stream("POST", f"{bridge.url}/v1/messages", json=ENDLESS["/v1/messages"],
                              headers={"x-api-key": KEY_A}, timeout=SLOW_WAIT_S) as refused:  # fmt: skip
                refused.read()
            assert refused.status_code == 429 and refused.headers["retry-after"] == str(RETRY_AFTER_S[429])
            assert refused.headers["x-should-retry"] == "true"
            assert refused.json()["error"]["type"] == "rate_limit_error", refused.text
            assert "VL_KEY_CONCURRENCY" in refused.json()["error"]["message"]

            served = httpx.post(
                f"{bridge.url}/v1/messages", json=SHORT, headers={"x-api-key": KEY_B}, timeout=SLOW_WAIT_S
            )
            assert served.status_code == 200, served.text
            assert served.json()["content"][0]["text"] == "tok tok "

            bridge.wait_for_log(r"trace id=\S+ POST /v1/messages 429 key=alice .*error=rate_limit_error")
            metrics = httpx.get(f"{bridge.url}/metrics", headers={"x-api-key": KEY_B}, timeout=SLOW_WAIT_S).text
            assert (
                'bridge_requests_total{error_type="rate_limit_error",key="alice",route="/v1/messages",status="429"} 3.0'
                in metrics
            )
        gone = re.compile(r"trace id=\S+ POST /v1/messages 200 key=alice .*stop=client_gone")
        wait_until(lambda: len(gone.findall(bridge.log())) == 2, "both of A's streams to end", SLOW_WAIT_S)
        again = httpx.post(f"{bridge.url}/v1/messages", json=SHORT, headers={"x-api-key": KEY_A}, timeout=SLOW_WAIT_S)
        assert again.status_code == 200, again.text


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/chat/completions"])
def test_a_client_that_stops_reading_is_dropped_and_its_generation_aborted(route: str, tmp_path: Path) -> None:
    """Once its socket is full, a write waits: after VL_CLIENT_STALL_S of that the bridge stops
    serving the client, asks the engine to abort the generation by name, and traces `client_stalled`.
    The ping interval (1 s) is shorter than the stall timeout: the pings written meanwhile keep nobody alive."""
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "1000000", "--pace-ms", "1") as upstream,
        start_bridge(
            upstream.url, tmp_path / "bridge.log", {"VL_CLIENT_STALL_S": STALL_S, "VL_BRIDGE_PING_S": "1"}
        ) as bridge,
        unread_stream(bridge, route) as (status, sock),
    ):
        assert status == 200
        trace = bridge.wait_for_log(rf"trace id=\S+ POST {re.escape(route)} 200 .*stop=client_stalled", SLOW_WAIT_S)
        generation = "chatcmpl-" + re.search(r"trace id=(\S+)", trace)[1]
        upstream.wait_for_log(f"abort requested: {re.escape(generation)}", SLOW_WAIT_S)
        assert not read_until_closed(sock).endswith(b"0\r\n\r\n")  # closed, and never at the stream's end
