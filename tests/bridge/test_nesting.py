"""Deeply nested JSON on the public port: a 400 in the Anthropic envelope, never a RecursionError.

A recursive decoder overflows Python's stack near 1000 levels, so 2 KB of brackets once gave a 500,
an 84-line traceback in the bridge's log and a dropped connection; the bridge now measures the nesting
first. Real bridge, real vLLM: a body just under the limit is served, one just over is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import msgspec
import pytest

from runtime.bridge.nesting import MAX_JSON_DEPTH, nests_deeper_than
from runtime.bridge.stream import MessageAssembler, StreamTranslator
from tests.support.bridge import SLOW_WAIT_S, Process, start_bridge
from tests.support.vllm_server import VllmServer

USER = {"role": "user", "content": "hi"}
ROUTES = {
    "/v1/messages": {"model": "claude-tiny", "max_tokens": 2, "messages": [USER]},
    "/v1/messages/count_tokens": {"model": "claude-tiny", "messages": [USER]},
    "/v1/chat/completions": {"model": "tiny", "max_tokens": 2, "messages": [USER]},  # relayed to vLLM
}
FAR_OVER = (975, 5000, 100_000)  # where the stack overflowed, and well past it (200 KB of brackets)


def with_depth(body: dict, depth: int) -> bytes:
    """`body` plus an unknown field of nested arrays that makes the whole body `depth` levels deep
    (its own object is the first); written by hand, as `json.dumps` itself stops near 1000 levels."""
    arrays = depth - 1
    return f'{json.dumps(body)[:-1]}, "nesting_probe": {"[" * arrays}{"]" * arrays}}}'.encode()


@pytest.fixture(scope="module")
def own_bridge(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A bridge whose log holds only this module's requests, so that a traceback in it is ours."""
    with start_bridge(vllm_server.url, tmp_path_factory.mktemp("nesting") / "bridge.log") as bridge:
        yield bridge


def post(bridge: Process, route: str, content: bytes) -> httpx.Response:
    return httpx.post(
        bridge.url + route, content=content, headers={"content-type": "application/json"}, timeout=SLOW_WAIT_S
    )


@pytest.mark.parametrize("route", ROUTES)
def test_a_body_at_the_limit_is_served(own_bridge: Process, route: str) -> None:
    content = with_depth(ROUTES[route], MAX_JSON_DEPTH)
    assert nests_deeper_than(content, MAX_JSON_DEPTH - 1) and not nests_deeper_than(content, MAX_JSON_DEPTH)
    response = post(own_bridge, route, content)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, *FAR_OVER])
def test_a_body_over_the_limit_is_a_400_envelope(own_bridge: Process, route: str, depth: int) -> None:
    response = post(own_bridge, route, with_depth(ROUTES[route], depth))
    assert response.status_code == 400, response.text
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"the request body nests JSON deeper than {MAX_JSON_DEPTH} levels",
        },
    }


def test_no_traceback_reaches_the_log(own_bridge: Process) -> None:
    """Every refusal above is one trace line; the last request's line proves the log is written up to it."""
    for route, body in ROUTES.items():
        assert post(own_bridge, route, with_depth(body, FAR_OVER[-1])).status_code == 400
    assert httpx.get(f"{own_bridge.url}/nesting-done").status_code == 404  # a trace line after theirs
    own_bridge.wait_for_log("GET other 404", SLOW_WAIT_S)
    log = own_bridge.log()
    assert "Traceback" not in log and "RecursionError" not in log, log[-4000:]
    assert log.count("400 key=open") >= len(ROUTES)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"1", 0),
        (b"{}", 1),
        (b'{"a": [[1], {"b": [2]}]}', 4),
        (b'{"code": "x = [[[[[[1]]]]]]; y = {{"}', 1),  # brackets inside strings do not nest
        (b'{"a": "say \\"[[[\\" twice", "b": ["\\\\", [[]]]}', 4),  # escaped quotes and backslashes
        (b'"' + b'\\"[' * 100_000, 0),  # one unterminated string: nothing opened
        (b"[" * 200_000 + b"]" * 200_000, 200_000),  # deeper than any stack: measured all the same
    ],
)
def test_nesting_is_measured_outside_strings(text: bytes, depth: int) -> None:
    assert not nests_deeper_than(text, depth)
    assert depth == 0 or nests_deeper_than(text, depth - 1)


@pytest.mark.parametrize(("depth", "kept"), [(MAX_JSON_DEPTH, True), (5000, False)])
def test_a_tool_call_nested_past_the_limit_is_sent_with_empty_input(depth: int, kept: bool) -> None:
    """The model writes any JSON it likes: its arguments, assembled for a non-streamed answer, must not
    overflow the decoder either (they are sent as `{}`, like arguments cut short by max_tokens)."""
    arguments = '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"
    call = {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "Bash", "arguments": arguments}}]}
    sink = MessageAssembler()
    translator = StreamTranslator(sink, "msg_1", "m")
    translator.feed(msgspec.json.encode({"choices": [{"index": 0, "delta": call, "finish_reason": "tool_calls"}]}))
    translator.feed(b"[DONE]")
    tool_use = sink.message["content"][0]
    assert tool_use["type"] == "tool_use"
    assert tool_use["input"] == (msgspec.json.decode(arguments) if kept else {})
