"""WebSockets (issue 21, item 9): the bridge relays none. Its server speaks no WebSocket (uvicorn's
`ws="none"`, runtime/bridge/server.py), so an upgrade is answered as the plain GET it also is: by the
same key checks, in the Anthropic envelope, traced and counted like any request, and its connection
closed; no WebSocket opens, whatever the path or the key.

A real WebSocket client (tests/support/websocket.py) against real bridges in front of the session's vLLM:
a module's own with keys, one more for the refusals' summary, and the session's open one.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.http11 import Response

from runtime.engine import tinymodel as tiny
from runtime.logsafe import loggable
from tests.support.bridge import Process, start_bridge
from tests.support.polling import wait_until
from tests.support.vllm_server import VllmServer
from tests.support.websocket import refused_upgrade

ALICE, OTHER = "sk-alice-ws-0123456789", "sk-other-ws-9876543210"
KEYS = f"alice:{ALICE}, other:{OTHER}"  # alice, the first entry, is the admin (/metrics is hers)
ASK = {"model": "claude-tiny", "max_tokens": 20, "messages": [{"role": "user", "content": tiny.MARK_TEXT}]}
OPEN_PATHS = ("/", "/api/hello", "/health", "/console")  # answered to anyone, as their plain GET is
KEYED_PATHS = ("/v1/messages", "/v1/realtime", "/metrics", "/v1/no-such-route")  # vLLM's realtime API included
# What alice's upgrade gets on those: what her GET gets. None of them is a 101.
WITH_A_KEY = {"/v1/messages": (405, "invalid_request_error"), "/v1/realtime": (501, "not_supported"),
              "/v1/no-such-route": (501, "not_supported"), "/metrics": (200, None)}  # fmt: skip
WRONG_KEYS = [{}, {"x-api-key": "sk-wrong-0123456789"}, {"authorization": "Bearer sk-wrong-0123456789"},
              {"authorization": f"Bearer {ALICE}", "x-api-key": OTHER}]  # fmt: skip
WRONG_IDS = ["none", "wrong-x-api-key", "wrong-bearer", "two-different-keys"]
# What a WebSocket refusal must never leave in the bridge's log: the lines uvicorn and the `websockets`
# library write for each handshake they refuse (two per stranger, never summarised), its warning for
# each upgrade it does not perform, and a traceback.
NOT_IN_THE_LOG = ('"WebSocket ', "connection rejected", "Unsupported upgrade", "WebSocket library", "Traceback")


@pytest.fixture(scope="module")
def guarded(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("ws-guarded")
    with start_bridge(vllm_server.url, root / "bridge.log", {"VL_API_KEYS": KEYS, "VL_STATE_DIR": str(root)}) as bridge:
        yield bridge


def error_type(answer: Response) -> str:
    return json.loads(answer.body)["error"]["type"]


def assert_quiet(bridge: Process, since: int = 0) -> None:
    """Nothing of NOT_IN_THE_LOG in the bridge's log (from the offset `since`: a shared bridge's)."""
    log = bridge.log()[since:]
    assert not [line for line in log.splitlines() if any(word in line for word in NOT_IN_THE_LOG)], log[-4000:]


@pytest.mark.parametrize("headers", WRONG_KEYS, ids=WRONG_IDS)
def test_without_a_valid_key_no_websocket_opens_on_any_path(guarded: Process, headers: dict[str, str]) -> None:
    """Where a key is needed, the upgrade gets the 401 of any request without one (its challenge and
    envelope); the paths open to anyone answer as their GET does, 200, and still open no WebSocket."""
    for path in KEYED_PATHS:
        answer = refused_upgrade(guarded.url, path, headers)
        assert answer.status_code == 401, (path, answer.status_code, answer.body)
        assert answer.headers["www-authenticate"] == "Bearer" and error_type(answer) == "authentication_error"
    for path in OPEN_PATHS:
        assert refused_upgrade(guarded.url, path, headers).status_code == 200, path
        assert httpx.get(guarded.url + path, headers=headers).status_code == 200, path
    assert_quiet(guarded)


@pytest.mark.parametrize("headers", [{"x-api-key": ALICE}, {"authorization": f"Bearer {ALICE}"}],
                         ids=["x-api-key", "bearer"])  # fmt: skip
def test_with_a_valid_key_no_websocket_opens_either(guarded: Process, headers: dict[str, str]) -> None:
    """The bridge relays no WebSocket, not even to vLLM's /v1/realtime: with a key the upgrade is the
    GET it also is (405 on /v1/messages, 501 on an API the pod does not serve), traced once under the key's name."""
    for path, (status, problem) in WITH_A_KEY.items():
        answer = refused_upgrade(guarded.url, path, headers)
        assert answer.status_code == status, (path, answer.status_code, answer.body)
        assert problem is None or error_type(answer) == problem
    for path in OPEN_PATHS:
        assert refused_upgrade(guarded.url, path, headers).status_code == 200, path
    marker = f"ws-keyed-{next(iter(headers))}"
    refused_upgrade(guarded.url, "/v1/realtime", {**headers, "x-request-id": marker})
    guarded.wait_for_log(f"client_id={marker}$")
    traced = [line for line in guarded.log().splitlines() if f"client_id={marker}" in line]
    assert len(traced) == 1 and re.search(rf" trace id=- GET other 501 key=alice dur_ms=\d+ client_id={marker}$",
                                          traced[0]), traced  # fmt: skip
    assert_quiet(guarded)


def test_http_is_served_after_upgrades(guarded: Process) -> None:
    for path in (*KEYED_PATHS, *OPEN_PATHS):
        refused_upgrade(guarded.url, path)
        refused_upgrade(guarded.url, path, {"x-api-key": OTHER})
    answer = httpx.post(f"{guarded.url}/v1/messages", json=ASK, headers={"x-api-key": OTHER}, timeout=60)
    assert answer.status_code == 200 and answer.json()["content"][0]["text"] == tiny.ANSWER
    assert httpx.get(f"{guarded.url}/health").status_code == 200
    assert_quiet(guarded)


def read_answer(client: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP answer's head and body (by its content-length) from a raw connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(65536) or pytest.fail(f"the connection closed before an answer: {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(body) < length:
        body += client.recv(65536) or pytest.fail("the connection closed in the middle of an answer")
    return head, body


def rest_until_closed(client: socket.socket) -> bytes:
    rest = b""
    try:
        while chunk := client.recv(65536):
            rest += chunk
    except ConnectionResetError:  # closed with our bytes unread: closed all the same
        pass
    return rest


@pytest.mark.parametrize("upgrade", ["websocket", "h2c"])
def test_an_upgrade_not_performed_ends_its_connection_after_the_answer(guarded: Process, upgrade: str) -> None:
    """To the parser, what follows an upgrade request's head is the other protocol's, a body included:
    the bridge answers the request (`connection: close`) and reads nothing more. Read on, a body written
    as a request was answered as one, and a proxy's connection shared by clients would be out of step."""
    smuggled = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-api-key: " + OTHER.encode() + b"\r\n\r\n"
    head = (f"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: {OTHER}\r\n"
            f"connection: Upgrade\r\nupgrade: {upgrade}\r\ncontent-length: {len(smuggled)}\r\n\r\n")  # fmt: skip
    address = urlsplit(guarded.url)
    with socket.create_connection((address.hostname, address.port), timeout=60) as client:
        client.sendall(head.encode())
        answered, body = read_answer(client)  # answered before its body came: the parser took it for complete
        assert answered.startswith(b"HTTP/1.1 400 ") and b"connection: close" in answered.lower(), answered
        assert json.loads(body)["error"]["type"] == "invalid_request_error"
        with contextlib.suppress(OSError):  # the bridge may have closed already
            client.sendall(smuggled)
        assert rest_until_closed(client) == b""
    assert_quiet(guarded)


def test_a_strangers_upgrades_leave_one_trace_line_in_the_bridges_words(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    """A burst of upgrades without a key is summarised as strangers' requests are: the first leaves its
    trace line, made of the bridge's own words (the route's label, never the path sent) and the
    client's id escaped (a quote and spaces cannot pass for more fields); every one is in /metrics.

    A bridge of its own: the minute of refusals must open with this burst, not another test's."""
    settings = {"VL_API_KEYS": KEYS, "VL_STATE_DIR": str(tmp_path)}
    burst = 20
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", settings) as bridge:
        ids = [f'ws-stranger-{n}" 101 key=alice path=/v1/messages' for n in range(burst)]
        for client_id in ids:
            answer = refused_upgrade(bridge.url, "/v1/realtime?model=x%22y", {"x-request-id": client_id})
            assert answer.status_code == 401
        assert httpx.get(f"{bridge.url}/v1/models", headers={"x-api-key": ALICE, "x-request-id": "ws-after"}).is_success
        bridge.wait_for_log("client_id=ws-after$")
        lines = bridge.log().splitlines()
        traced = [line for line in lines if "ws-stranger-" in line]
        summaries = [line for line in lines if "more requests without a valid key" in line]  # a minute went by
        own_words = r"\S+ \S+ INFO runtime\.bridge: trace id=- GET other 401 key=- dur_ms=\d+ client_id="
        assert re.fullmatch(own_words + re.escape(loggable(ids[0])), traced[0]), traced
        assert len(traced) <= 1 + len(summaries), traced
        assert_quiet(bridge)

        def refusals_counted() -> bool:
            metrics = httpx.get(f"{bridge.url}/metrics", headers={"x-api-key": ALICE}).text
            return (f'bridge_requests_total{{error_type="authentication_error",key="-",route="other",status="401"}} '
                    f"{burst}.0") in metrics  # fmt: skip

        wait_until(refusals_counted, f"the {burst} refusals in /metrics")


def test_a_web_page_cannot_open_a_websocket_to_the_open_bridge(bridge: Process) -> None:
    """Browsers let any page open a WebSocket to any address without asking (no CORS preflight): the
    open bridge (the session's, no keys) opens none; the upgrade is its GET, in the envelope."""
    page, since = "https://attacker.example", len(bridge.log())
    for path, (status, problem) in {"/v1/messages": (405, "invalid_request_error"),
                                    "/v1/realtime": (501, "not_supported")}.items():  # fmt: skip
        answer = refused_upgrade(bridge.url, path, origin=page)
        assert answer.status_code == status and error_type(answer) == problem, (path, answer.status_code)
    assert refused_upgrade(bridge.url, "/health", origin=page).status_code == 200
    assert httpx.get(f"{bridge.url}/health").status_code == 200
    assert_quiet(bridge, since)
