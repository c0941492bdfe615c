"""The OpenAI routes relayed to vLLM (with the `openai` SDK), the bridge's metrics, health and trace."""

from __future__ import annotations

import http.client
import json
import re
import uuid
from pathlib import Path

import httpx
import pytest

from runtime.engine import tinymodel as tiny
from runtime.engine.recipes import load_recipe
from tests.support.bridge import LONG_STREAM_TOKENS, SLOW_WAIT_S, Process, start_bridge
from tests.support.sdk import anthropic, openai
from tests.support.vllm_server import VllmServer


@pytest.fixture(scope="module")
def oai(bridge: Process) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{bridge.url}/v1", api_key="unused", max_retries=0)


def test_chat_completions_relayed(oai: openai.OpenAI) -> None:
    reply = oai.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": tiny.MARK_TEXT}], max_tokens=50
    )
    assert reply.choices[0].message.content == tiny.ANSWER
    assert reply.model == tiny.SERVED_NAME  # an unknown name falls back to the served model


def test_chat_completions_streamed_with_reasoning(oai: openai.OpenAI) -> None:
    chunks = list(oai.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                              max_tokens=50, stream=True, stream_options={"include_usage": True}))  # fmt: skip
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert "".join(d.content or "" for d in deltas) == tiny.ANSWER
    assert "".join(getattr(d, "reasoning", None) or "" for d in deltas) == tiny.THINKING
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_relayed(oai: openai.OpenAI) -> None:
    reply = oai.completions.create(model="tiny", prompt="Say it", max_tokens=len(tiny.ANSWER_PIECES) + 1)
    assert reply.choices[0].text == tiny.ANSWER


def test_tokenize_relayed(bridge: Process, vllm_server: VllmServer) -> None:
    mine = httpx.post(f"{bridge.url}/tokenize", json={"model": "whatever", "prompt": "hello there"}).json()
    theirs = httpx.post(f"{vllm_server.url}/tokenize", json={"prompt": "hello there"}).json()
    assert mine == theirs and mine["count"] > 0


def test_models_in_openai_shape_without_anthropic_version(oai: openai.OpenAI, vllm_server: VllmServer) -> None:
    models = oai.models.list().data
    assert [model.id for model in models] == list(load_recipe(tiny.SERVED_NAME).names)  # as a pod serves them
    assert models[0].max_model_len == vllm_server.max_model_len  # type: ignore[attr-defined]  # vLLM's own field


def test_relayed_stream_is_aborted_when_the_client_leaves(bridge: Process, vllm_server: VllmServer) -> None:
    """The client reads the response head, then closes its socket; vLLM is told to abort the request by
    the bridge's own id (the trace line gives it, beside the client's x-request-id). (A plain socket
    client: its close is a close, whatever a pool would keep.)"""
    request_id = f"relay-{uuid.uuid4().hex}"
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": tiny.MARK_LONG}],
                       "max_tokens": LONG_STREAM_TOKENS, "stream": True})  # fmt: skip
    host, port = bridge.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=SLOW_WAIT_S)
    connection.request(
        "POST", "/v1/chat/completions", body, {"content-type": "application/json", "x-request-id": request_id}
    )
    assert connection.getresponse().status == 200  # the stream began
    connection.close()
    trace = bridge.wait_for_log(f"trace id=relay_.* client_id={request_id}$", SLOW_WAIT_S)
    upstream_id = re.search(r"trace id=(\S+)", trace)[1]
    vllm_server.wait_for_abort(f"chatcmpl-{upstream_id}", SLOW_WAIT_S)


def test_health_and_warm_up_need_no_engine_call(bridge: Process) -> None:
    health = httpx.get(f"{bridge.url}/health").json()
    assert health == {"status": "ok", "model": tiny.SERVED_NAME, "context_window": 65536, "checked": "off"}
    assert httpx.head(f"{bridge.url}/").status_code == 200  # Claude Code's warm-up


def test_metrics_merge_the_bridge_and_vllm(bridge: Process) -> None:
    client = anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0)
    client.messages.create(model="claude-tiny", max_tokens=50, messages=[{"role": "user", "content": tiny.MARK_TEXT}])
    httpx.post(f"{bridge.url}/v1/messages", json={"model": "x"})
    text = httpx.get(f"{bridge.url}/metrics").text
    assert re.search(r'bridge_requests_total\{error_type="",key="open",route="/v1/messages",status="200"\} [1-9]', text)
    assert re.search(
        r'bridge_requests_total\{error_type="invalid_request_error",key="open",route="/v1/messages",status="400"\}',
        text,
    )
    assert re.search(r'bridge_tokens_total\{key="open",kind="output"\} [1-9]', text)
    assert re.search(r'bridge_tokens_total\{key="open",kind="input"\} [1-9]', text)
    assert re.search(r"bridge_time_to_first_token_seconds_count [1-9]", text)
    assert "bridge_open_streams 0.0" in text and "bridge_upstream_connections_in_use" in text
    assert "vllm:num_requests_running" in text  # vLLM's own, after ours


def test_trace_line_per_request_without_prompt_content(bridge: Process) -> None:
    secret = "purple-elephant-7731"
    client = anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0)
    message = client.messages.create(
        model="claude-tiny", max_tokens=50, messages=[{"role": "user", "content": f"{secret} {tiny.MARK_TEXT}"}]
    )
    line = bridge.wait_for_log(f"trace id={message.id} ")
    assert re.search(rf"POST /v1/messages 200 key=open model=claude-tiny stream=False in=\d+ cached=\d+ out={message.usage.output_tokens} "
                     r"ttft_ms=\d+ dur_ms=\d+ stop=end_turn$", line), line  # fmt: skip
    assert secret not in bridge.log()
    assert "VL_API_KEYS is empty: the bridge is OPEN" in bridge.log()


def test_prompts_are_logged_only_when_asked(vllm_server: VllmServer, tmp_path: Path) -> None:
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", {"VL_LOG_PROMPTS": "on"}) as bridge:
        client = anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0)
        message = client.messages.create(
            model="x", max_tokens=50, messages=[{"role": "user", "content": f"green-giraffe {tiny.MARK_TEXT}"}]
        )
        assert "prompt='green-giraffe [text]'" in bridge.wait_for_log(f"trace id={message.id} ")
