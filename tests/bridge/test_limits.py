"""The bridge's public port under hostile and careless clients (issue 9, items 1, 2 and 5): how much
a client may send and for how long is bounded, `/health` answers however many connections pile up,
and a request that meets the engine's keep-alive expiry is not lost. Real bridges, raw sockets.

The bridges here get timeouts of a second (`--keep-alive-s`, `--head-timeout-s`, `--body-timeout-s`);
each test's own timeouts are only deadlines for what must happen long before them.
"""

from __future__ import annotations

import json
import re
import select
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.bridge import (
    Process,
    clean_environment,
    start_bridge,
    start_stand_in,
    started,
)
from tests.support.net import free_port

pytestmark = pytest.mark.slow  # bridge processes held at their real deadlines

DEADLINE_S = 30.0  # for what the bridge must do within a second or two
SHORT = ("--keep-alive-s", "1", "--head-timeout-s", "1", "--body-timeout-s", "1")
HOST = b"Host: 127.0.0.1\r\n"  # an open bridge answers only to its own names
BODY_HEAD = (
    b"POST /v1/messages HTTP/1.1\r\n" + HOST + b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n{"
)


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """An open bridge with one-second timeouts, in front of nothing (no test here needs the engine)."""
    log_path = tmp_path_factory.mktemp("bridge") / "bridge.log"
    with start_bridge(f"http://127.0.0.1:{free_port()}", log_path, {}, *SHORT) as running:
        yield running


def connect(bridge: Process) -> socket.socket:
    host, port = bridge.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=DEADLINE_S)


def read_some(sock: socket.socket) -> bytes | None:
    """What the bridge has sent, or None once it closed the connection (a reset counts as the close)."""
    try:
        return sock.recv(65536) or None
    except ConnectionResetError:
        return None


def answer_then_close(sock: socket.socket) -> bytes:
    """All the bridge sends until it closes the connection."""
    received = b""
    while (data := read_some(sock)) is not None:
        received += data
    return received


def drip(sock: socket.socket, start: bytes, byte: bytes) -> bytes:
    """Send `start`, then `byte` every 0.2 s, answered or not, until the bridge closes the
    connection; all it sent back."""
    sock.sendall(start)
    received = b""
    for _ in range(int(DEADLINE_S / 0.2)):
        if select.select([sock], [], [], 0.2)[0]:
            if (data := read_some(sock)) is None:
                return received
            received += data
            continue
        try:
            sock.sendall(byte)
        except (BrokenPipeError, ConnectionResetError):
            return received + answer_then_close(sock)
    raise AssertionError(
        f"the bridge still takes a byte every 0.2 s after {DEADLINE_S:g} s; it answered {received[:300]!r}"
    )


def flood(sock: socket.socket, total: int) -> tuple[int, bytes]:
    """Send up to `total` bytes of header value, stopping as soon as the bridge answers: (sent, answer)."""
    sock.setblocking(False)
    chunk, sent, deadline = b"a" * 65536, 0, time.monotonic() + DEADLINE_S
    while sent < total:
        assert time.monotonic() < deadline, (
            f"the bridge read {sent} bytes of header in {DEADLINE_S:g} s, still no answer"
        )
        readable, writable, _ = select.select([sock], [sock], [], DEADLINE_S)
        if readable:
            break
        assert writable, f"the bridge neither read nor answered for {DEADLINE_S:g} s"
        try:
            sent += sock.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            break
    sock.settimeout(DEADLINE_S)
    return sent, answer_then_close(sock)


def envelope_of(answer: bytes, status: int) -> str:
    """The message of a raw HTTP answer that is Anthropic's error envelope with `status`."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:300]
    error = json.loads(body)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
    return error["error"]["message"]


# --- 1. the head: size and count ---


def test_an_endless_header_gets_a_431_before_it_is_read_whole(bridge: Process) -> None:
    """256 MiB of one header cost 82 s of CPU: now the bridge answers past 64 KiB and reads no more
    (the client cannot even send 64 MiB before the answer), and `/health` answers as before."""
    total = 64 * 2**20
    with connect(bridge) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n" + HOST + b"X-Big: ")
        sent, answer = flood(sock, total)
    assert "64 KiB" in envelope_of(answer, 431)
    assert sent < total
    assert httpx.get(f"{bridge.url}/health", timeout=DEADLINE_S).status_code == 200


@pytest.mark.parametrize(
    ("headers", "status"),
    [({f"x-extra-{n}": "1" for n in range(101)}, 431), ({"x-big": "a" * 70000}, 431),
     ({f"x-extra-{n}": "1" for n in range(90)}, 200), ({"x-big": "a" * 60000}, 200)],
    ids=["101 headers", "a 70 KB header", "90 headers", "a 60 KB header"],
)  # fmt: skip
def test_heads_over_the_limits_get_a_431_and_those_within_pass(
    bridge: Process, headers: dict[str, str], status: int
) -> None:
    response = httpx.get(f"{bridge.url}/health", headers=headers, timeout=DEADLINE_S)
    assert response.status_code == status
    if status == 431:
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert response.headers["connection"] == "close"


# --- 2. slow and idle clients ---


def test_an_idle_connection_is_closed(bridge: Process) -> None:
    """Fresh ones too: uvicorn times out only a connection kept alive after an answer."""
    with connect(bridge) as sock:
        assert answer_then_close(sock) == b""


def test_a_slow_head_is_closed_at_its_deadline(bridge: Process) -> None:
    """A byte every 0.2 s would reset any per-read timeout: the head has a deadline in all."""
    with connect(bridge) as sock:
        assert drip(sock, b"GET /health HTTP/1.1\r\n" + HOST + b"X-Slow: ", b"a") == b""


def test_a_slow_body_gets_a_408_and_a_trace(bridge: Process) -> None:
    with connect(bridge) as sock:
        answer = drip(sock, BODY_HEAD, b" ")
    assert "did not arrive in time" in envelope_of(answer, 408)
    assert "error=invalid_request_error" in bridge.wait_for_log(r"trace id=\S+ POST /v1/messages 408 ")
    assert "Traceback" not in bridge.log()


def test_a_client_that_leaves_mid_body_leaves_a_trace_and_no_traceback(bridge: Process) -> None:
    with connect(bridge) as sock:
        sock.sendall(BODY_HEAD.replace(b"/v1/messages", b"/v1/messages/count_tokens"))
    bridge.wait_for_log(r"trace id=\S+ POST /v1/messages/count_tokens 408 ")
    assert "Traceback" not in bridge.log()


def test_a_slow_body_after_a_401_is_closed(tmp_path: Path) -> None:
    """Without a key the bridge answers before reading the body: dripping the rest holds nothing."""
    with (
        start_bridge(
            f"http://127.0.0.1:{free_port()}",
            tmp_path / "bridge.log",
            {"VL_API_KEYS": "sk-test-key-0123456789"},
            *SHORT,
        ) as bridge,
        connect(bridge) as sock,
    ):
        answer = drip(sock, BODY_HEAD, b" ")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401 ") and json.loads(body)["error"]["type"] == "authentication_error"


def test_health_answers_however_many_connections_pile_up(tmp_path: Path) -> None:
    """At 256 open files, 200 idle connections made `/health` fail. Now connections are capped below
    that (here 64: 4 per upstream slot, 16 slots), the one idle the longest is closed for a new one, and
    a stream in progress is never among those closed."""
    limited = ("import resource, runpy; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); "
               "runpy.run_module('runtime', run_name='__main__', alter_sys=True)")  # fmt: skip
    with start_stand_in(tmp_path / "upstream.log", "--tokens", "500", "--pace-ms", "20") as upstream:  # 10 s
        argv = [sys.executable, "-c", limited, "bridge", "--upstream", upstream.url, "--host", "127.0.0.1", "--port", "0",
                "--max-connections", "16"]  # fmt: skip
        with started(argv, tmp_path / "bridge.log", clean_environment({})) as bridge:
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
            with httpx.stream("POST", f"{bridge.url}/v1/chat/completions", json=body, timeout=DEADLINE_S) as stream:
                lines = stream.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                idle = [connect(bridge) for _ in range(300)]
                slow = [connect(bridge) for _ in range(50)]
                for sock in slow:
                    sock.sendall(b"GET /health HTTP/1.1\r\n" + HOST)
                assert httpx.get(f"{bridge.url}/health", timeout=DEADLINE_S).status_code == 200
                assert list(lines)[-2:] == ["data: [DONE]", ""]  # the stream went on to its end
                for sock in idle + slow:
                    sock.close()
            assert "at most 64 client connections" in bridge.log()
            assert "client connections open, the most allowed" in bridge.log()


# --- 5. the engine's keep-alive ---


def test_a_request_that_meets_the_engines_keep_alive_expiry_is_not_lost(tmp_path: Path) -> None:
    """vLLM closes a connection idle 5 s; the bridge kept them 15 s, and a request sent on one as it
    closed got a 529. The stand-in here drops any request that arrives after its keep-alive ran out,
    as a close crossing the request on the wire does; the test sends right then."""
    argv = [sys.executable, "-m", "tests.support.expiring_upstream", "--keep-alive-s", "5"]
    with (
        started(argv, tmp_path / "upstream.log", clean_environment({})) as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log") as bridge,
    ):
        body = {"prompt": "hello"}
        assert httpx.post(f"{bridge.url}/tokenize", json=body, timeout=DEADLINE_S).status_code == 200
        upstream.wait_for_log("keep-alive expired: connection")
        response = httpx.post(f"{bridge.url}/tokenize", json=body, timeout=DEADLINE_S)
        assert response.status_code == 200, response.text


def test_a_head_pipelined_after_a_large_body_is_not_counted_with_that_body(bridge: Process) -> None:
    """The head counter once added everything a read held, the previous request's body too: a request
    pipelined after a large body got a false 431 and a closed connection, the first answer lost."""
    body = b"[" + b"0," * 60_000 + b"0]"  # 120 kB of JSON that is no message: a 400, no engine needed
    first = b"POST /v1/messages HTTP/1.1\r\n" + HOST + b"content-type: application/json\r\n"
    first += b"content-length: %d\r\n\r\n" % len(body)
    health = b"GET /health HTTP/1.1\r\n" + HOST + b"\r\n"
    with connect(bridge) as sock:
        sock.sendall(first + body + health[:12])  # the next head begins in the read that ends the body
        received = b""
        while b"HTTP/1.1 " not in received and (data := read_some(sock)) is not None:
            received += data  # the first answer: the read with the head's beginning was parsed
        sock.sendall(health[12:])
        received += answer_then_close(sock)  # the bridge closes the kept-alive connection after a second
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", received) == [b"400", b"200"]  # each answer's status line


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"identity", b"deflate"])  # `chunked, chunked`: the parser's 400
def test_a_transfer_coding_other_than_chunked_is_refused(bridge: Process, coding: bytes) -> None:
    head = b"POST /v1/messages HTTP/1.1\r\n" + HOST + b"content-type: application/json\r\n"
    with connect(bridge) as sock:
        sock.sendall(head + b"transfer-encoding: " + coding + b'\r\n\r\n5\r\n{"a":\r\n0\r\n\r\n')
        answer = answer_then_close(sock)
    assert answer.startswith(b"HTTP/1.1 501 ")
    assert b"the only transfer coding the bridge reads is `chunked`, alone" in answer


def test_a_chunked_body_is_read(bridge: Process) -> None:
    body = b'{"model":"m"}'
    head = (
        b"POST /v1/messages HTTP/1.1\r\n" + HOST + b"content-type: application/json\r\ntransfer-encoding: chunked\r\n"
    )
    with connect(bridge) as sock:
        sock.sendall(head + b"\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        answer = answer_then_close(sock)
    assert answer.startswith(b"HTTP/1.1 400 ") and b"messages" in answer  # read whole, then judged: no messages
