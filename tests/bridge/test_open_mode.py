"""The open bridge (no VL_API_KEYS) against web pages: a cross-site POST must not run, a rebound DNS
name must not be answered; with keys, clients keep working whatever their Host or body type.

Real bridges in front of the stand-in upstream, real HTTP requests shaped as a browser sends them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.bridge import Process, start_bridge, start_stand_in
from tests.support.sdk import anthropic

pytestmark = pytest.mark.slow  # bridge processes

ASK = {"model": "fake", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
BODY = json.dumps(ASK).encode()
POD_ID = "abc123xyz"
EXTRA_HOST = "llm.example.org"
KEY = "sk-open-mode-test-0123456789"
# What a page on another site may POST without a CORS preflight (a "simple" request), and no type at all.
SIMPLE_TYPES = ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                "multipart/form-data; boundary=x", None]  # fmt: skip


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with start_stand_in(tmp_path_factory.mktemp("upstream") / "upstream.log", "--tokens", "3") as running:
        yield running


@pytest.fixture(scope="module")
def open_bridge(upstream: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("open")
    settings = {"VL_ALLOWED_HOSTS": EXTRA_HOST.upper(), "RUNPOD_POD_ID": POD_ID, "VL_STATE_DIR": str(root / "state")}
    with start_bridge(upstream.url, root / "bridge.log", settings) as bridge:
        yield bridge


def post(
    bridge: Process,
    content_type: str | None = "application/json",
    host: str | None = None,
    path: str = "/v1/messages",
    **headers: str,
) -> httpx.Response:
    """A POST of a valid Messages body, with this body type and Host, as a page's fetch() sends it."""
    sent = {"origin": "https://attacker.example", **headers}
    if content_type is not None:
        sent["content-type"] = content_type
    if host is not None:
        sent["host"] = host
    return httpx.post(bridge.url + path, content=BODY, headers=sent, timeout=60)


def assert_refused(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == error_type


@pytest.mark.parametrize("content_type", SIMPLE_TYPES, ids=str)
def test_a_cross_site_simple_post_is_refused_with_415(open_bridge: Process, content_type: str | None) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "/tokenize"):
        assert_refused(post(open_bridge, content_type, path=path), 415, "invalid_request_error")


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_bodies_are_served(open_bridge: Process, content_type: str) -> None:
    response = post(open_bridge, content_type)
    assert response.status_code == 200 and "event: message_stop" in response.text


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8080", "localhost.attacker.example",
                                  f"{POD_ID}-8080.proxy.runpod.net.attacker.example", "other-8080.proxy.runpod.net",
                                  f"x{POD_ID}-8080.proxy.runpod.net"])  # fmt: skip
def test_a_foreign_host_is_refused_with_403(open_bridge: Process, host: str) -> None:
    """DNS rebinding: the attacker's name resolves to the pod; the browser sends that name in Host."""
    assert_refused(post(open_bridge, host=host), 403, "permission_error")
    assert_refused(httpx.get(f"{open_bridge.url}/v1/models", headers={"host": host}), 403, "permission_error")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8080", "203.0.113.7:40123", "[::1]:8080", "[2001:db8::1]",
                                  "localhost:8080", "LocalHost.", f"{POD_ID}-8080.proxy.runpod.net",
                                  f"{POD_ID.upper()}-22.proxy.runpod.net", EXTRA_HOST,
                                  f"{EXTRA_HOST}:443"])  # fmt: skip
def test_the_pods_own_names_and_any_address_are_served(open_bridge: Process, host: str) -> None:
    """An IP address in Host means the page itself was loaded from that address: the same origin."""
    response = post(open_bridge, host=host)
    assert response.status_code == 200 and "event: message_stop" in response.text


def test_health_and_warm_up_answer_whatever_the_host(open_bridge: Process) -> None:
    assert httpx.get(f"{open_bridge.url}/health", headers={"host": "attacker.example"}).status_code == 200
    assert httpx.head(f"{open_bridge.url}/", headers={"host": "attacker.example"}).status_code == 200


def test_the_start_up_warning_says_what_the_open_bridge_accepts(open_bridge: Process) -> None:
    log = open_bridge.log()
    assert "VL_API_KEYS is empty: the bridge is OPEN" in log
    assert (
        f"POST bodies must be application/json (else 415), and Host an IP address, {EXTRA_HOST}, localhost, "
        f"{POD_ID}-<port>.proxy.runpod.net (else 403; VL_ALLOWED_HOSTS adds names)"
    ) in log


def test_with_keys_clients_keep_working_whatever_their_host_and_body_type(upstream: Process, tmp_path: Path) -> None:
    settings = {"VL_API_KEYS": f"ci:{KEY}", "VL_STATE_DIR": str(tmp_path / "state")}
    with start_bridge(upstream.url, tmp_path / "bridge.log", settings) as bridge:
        response = post(bridge, "text/plain", "bridge.internal.example", authorization=f"Bearer {KEY}")
        assert response.status_code == 200 and "event: message_stop" in response.text
        assert_refused(post(bridge, host="attacker.example"), 401, "authentication_error")  # no key: the key decides
        client = anthropic.Anthropic(base_url=bridge.url, api_key=KEY, max_retries=0, timeout=60)
        with client.messages.stream(**{k: v for k, v in ASK.items() if k != "stream"}) as stream:
            assert stream.get_final_message().stop_reason is not None
