"""`/v1/messages` through the bridge to real vLLM, with the `anthropic` SDK as the client.

Every feature is asked twice, streamed and not (`ask`): the SDK's stream helper rejects malformed
or out-of-order events, and the tiny scripted model makes every reply exact.
"""

from __future__ import annotations

import base64
import itertools
from typing import TYPE_CHECKING, Any

import pytest

from runtime.engine import tinymodel as tiny
from tests.support.sdk import anthropic

if TYPE_CHECKING:
    from anthropic.types import Message

TOOLS = [{
    "name": tiny.TOOL_NAME, "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    "cache_control": {"type": "ephemeral"},
}]  # fmt: skip
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)).decode()  # fmt: skip


def ask(client: anthropic.Anthropic, stream: bool, **request: Any) -> Message:
    request.setdefault("model", "claude-tiny")
    request.setdefault("max_tokens", 300)
    if stream:
        with client.messages.stream(**request) as events:
            return events.get_final_message()
    return client.messages.create(**request)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def blocks(message: Message) -> list[tuple[str, Any]]:
    """(type, the block's main value) for each block."""
    values = {"text": "text", "thinking": "thinking", "tool_use": "input"}
    return [(block.type, getattr(block, values[block.type])) for block in message.content]


def pondered(tokens: int) -> str:
    """What the model thinks in `tokens` tokens of `[ponder]`: the cycle's pieces, one per token."""
    return "".join(itertools.islice(itertools.cycle(tiny.PONDER_PIECES), tokens))


# --- text, thinking and reasoning control ---


def test_text_reply(client: anthropic.Anthropic, stream: bool) -> None:
    message = ask(client, stream, messages=user(f"hello {tiny.MARK_TEXT}"))
    assert blocks(message) == [("text", tiny.ANSWER)]
    assert (message.stop_reason, message.role, message.model) == ("end_turn", "assistant", "claude-tiny")
    assert message.usage.output_tokens > 0 and message.usage.input_tokens > 0


@pytest.mark.parametrize("thinking", [{"type": "adaptive"}, {"type": "enabled", "budget_tokens": 2048}])
def test_thinking_comes_as_a_signed_thinking_block(client: anthropic.Anthropic, stream: bool, thinking: dict) -> None:
    message = ask(client, stream, messages=user("hello"), thinking=thinking)
    assert blocks(message) == [("thinking", tiny.THINKING), ("text", tiny.ANSWER)]
    assert message.content[0].signature


def test_no_thinking_unless_asked_as_in_anthropic_s_api(client: anthropic.Anthropic, stream: bool) -> None:
    """The chat template thinks by default; the API does not (clients read `content[0].text`)."""
    message = ask(client, stream, messages=user("hello"))
    assert blocks(message) == [("text", tiny.ANSWER)] and message.content[0].text == tiny.ANSWER


@pytest.mark.parametrize("off", ["disabled", "between_tools"])  # 2.1.332's between_tools: no thinking, as in vLLM
def test_thinking_disabled_turns_reasoning_off(client: anthropic.Anthropic, stream: bool, off: str) -> None:
    message = ask(client, stream, messages=user("hello"), thinking={"type": off})
    assert blocks(message) == [("text", tiny.ANSWER)]


@pytest.mark.parametrize(
    ("thinking", "effort", "tokens"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, None, 1024),
        ({"type": "adaptive"}, "low", 1024),
        ({"type": "adaptive"}, "medium", 4096),
        ({"type": "enabled", "budget_tokens": 1024}, "max", 1024),  # an explicit budget wins over effort
    ],
    ids=["budget", "effort-low", "effort-medium", "budget-wins"],
)
def test_reasoning_budget_closes_the_thought(
    client: anthropic.Anthropic, stream: bool, thinking: dict | None, effort: str | None, tokens: int
) -> None:
    request: dict[str, Any] = {"messages": user(f"think hard {tiny.MARK_PONDER}"), "max_tokens": 6000}
    if thinking:
        request["thinking"] = thinking
    if effort:
        request["output_config"] = {"effort": effort}
    message = ask(client, stream, **request)
    # vLLM counts the prompt's mode token as the first of the budget (see runtime.engine.tinymodel).
    assert blocks(message) == [("thinking", pondered(tokens - 1)), ("text", tiny.ANSWER)]
    assert message.stop_reason == "end_turn"


def test_effort_max_is_unlimited_and_reasoning_alone_is_repeated_as_text(
    client: anthropic.Anthropic, stream: bool
) -> None:
    """No budget: the thought runs into max_tokens; with no text nor tool call, the reasoning is
    also given as text (the seeds' empty compactions came from answers that were all reasoning)."""
    message = ask(client, stream, messages=user(f"think {tiny.MARK_PONDER}"), thinking={"type": "adaptive"},
                  output_config={"effort": "max"}, max_tokens=1500)  # fmt: skip
    thought = pondered(1500)
    assert blocks(message) == [("thinking", thought), ("text", thought)]
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 1500)


# --- tools ---


def test_tool_call(client: anthropic.Anthropic, stream: bool) -> None:
    message = ask(client, stream, messages=user(f"run it {tiny.MARK_TOOL}"), tools=TOOLS)
    assert blocks(message) == [("tool_use", tiny.TOOL_ARGUMENTS)]
    assert message.content[0].name == tiny.TOOL_NAME and message.content[0].id.startswith("toolu_")
    assert message.stop_reason == "tool_use" and message.id.startswith("msg_")


def test_a_server_tool_is_refused_with_its_type_named(client: anthropic.Anthropic, stream: bool) -> None:
    tools = [*TOOLS, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(client, stream, messages=user(f"search {tiny.MARK_TEXT}"), tools=tools)
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "the server tool 'web_search_20250305' is not supported here" in refused.value.body["error"]["message"]


def test_tool_choice_none_keeps_the_call_as_text(client: anthropic.Anthropic, stream: bool) -> None:
    message = ask(client, stream, messages=user(f"run it {tiny.MARK_TOOL}"), tools=TOOLS, tool_choice={"type": "none"})
    assert [kind for kind, _ in blocks(message)] == ["text"]
    assert tiny.TOOL_COMMAND in message.content[0].text and message.stop_reason == "end_turn"


def tool_round(client: anthropic.Anthropic, result: dict) -> list[dict]:
    """A conversation up to the model's tool call, then `result` for it (with thinking in history)."""
    call = client.messages.create(
        model="claude-tiny", max_tokens=300, messages=user(f"run it {tiny.MARK_TOOL}"), tools=TOOLS
    )
    history = [{"type": "thinking", "thinking": "I should run it.", "signature": "sig"},
               {"type": "redacted_thinking", "data": "b3BhcXVl"}, *[block.model_dump() for block in call.content]]  # fmt: skip
    return [
        *user(f"run it {tiny.MARK_TOOL}"),
        {"role": "assistant", "content": history},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.content[0].id, **result}]},
    ]


@pytest.mark.parametrize(
    "result",
    [
        {"content": "tiny-model-was-here"},
        {"content": [{"type": "text", "text": "line 1"}, {"type": "text", "text": "line 2"}]},
        {"content": "command not found", "is_error": True},
    ],
    ids=["text", "blocks", "error"],
)
def test_reply_after_a_tool_result(client: anthropic.Anthropic, stream: bool, result: dict) -> None:
    message = ask(client, stream, messages=tool_round(client, result), tools=TOOLS)
    assert blocks(message) == [("text", tiny.AFTER_TOOL)]


# --- images: translated to image parts, which this text-only model refuses (its words mapped to Claude Code's
# `capability_rejected: image_block`, which only vLLM's own refusal of the image parts yields) ---


@pytest.mark.parametrize(
    "source",
    [
        {"type": "base64", "media_type": "image/png", "data": PNG},
        {"type": "url", "url": "https://example.invalid/a.png"},
    ],
    ids=["base64", "url"],
)
def test_images_reach_vllm_as_image_parts(client: anthropic.Anthropic, stream: bool, source: dict) -> None:
    content = [{"type": "image", "source": source}, {"type": "text", "text": "what is it?"}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        ask(client, stream, messages=[{"role": "user", "content": content}])
    assert refused.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "capability_rejected: image_block",
    }


def test_images_inside_a_tool_result_reach_vllm(client: anthropic.Anthropic) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    result = {"content": [{"type": "text", "text": "a screenshot"}, image]}
    with pytest.raises(anthropic.BadRequestError, match=r"capability_rejected: image_block"):
        ask(client, False, messages=tool_round(client, result), tools=TOOLS)


# --- stops and usage ---


def test_stop_sequence(client: anthropic.Anthropic, stream: bool) -> None:
    message = ask(
        client,
        stream,
        messages=user(f"hello {tiny.MARK_TEXT}"),
        stop_sequences=[" the tiny"],
        thinking={"type": "disabled"},
    )
    assert blocks(message) == [("text", tiny.ANSWER_PIECES[0])]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " the tiny")


def test_max_tokens(client: anthropic.Anthropic, stream: bool) -> None:
    message = ask(client, stream, messages=user(f"go on {tiny.MARK_LONG}"), max_tokens=6, thinking={"type": "disabled"})
    assert blocks(message) == [("text", "".join(itertools.islice(itertools.cycle(tiny.LONG_PIECES), 6)))]
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 6)


def test_cached_prompt_tokens_are_reported_apart(client: anthropic.Anthropic, stream: bool) -> None:
    prompt = user(f"{tiny.MARK_TEXT} " + " ".join(f"word{n}" for n in range(400)) + (" streamed" if stream else ""))
    total = client.messages.count_tokens(model="claude-tiny", messages=prompt).input_tokens
    first = ask(client, stream, messages=prompt, max_tokens=5)
    second = ask(client, stream, messages=prompt, max_tokens=5)
    assert first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0) == total
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total  # input excludes cached


def test_a_long_stream_says_its_usage_once_after_its_last_block(client: anthropic.Anthropic) -> None:
    """Anthropic's streaming order: one `message_delta` (stop reason and final usage) after the last
    `content_block_stop`, then `message_stop`. Claude Code 2.1.332 counts its tokens from the deltas themselves
    and takes the first `message_delta` with usage as the answer's end (docs/explanation/decisions.md)."""
    events = list(
        client.messages.create(model="claude-tiny", max_tokens=2000, messages=user(tiny.MARK_LONG), stream=True)
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert kinds.count("message_delta") == 1 and kinds.count("content_block_delta") > 100
    assert (events[-2].delta.stop_reason, events[-2].usage.output_tokens) == ("max_tokens", 2000)


def test_message_start_says_the_prompt_s_size_as_anthropic_s_api_does(client: anthropic.Anthropic) -> None:
    """Clients that track their context read it from `message_start`: a small prompt is not counted before
    the engine, whose first chunk says its size; its cached part comes with the usage that follows."""
    prompt = user(f"{tiny.MARK_TEXT} " + " ".join(f"start{n}" for n in range(300)))
    total = client.messages.count_tokens(model="claude-tiny", messages=prompt).input_tokens
    for turn in range(2):
        events = list(client.messages.create(model="claude-tiny", max_tokens=5, messages=prompt, stream=True))
        start, final = events[0], [e for e in events if e.type == "message_delta"][-1]
        assert start.type == "message_start"
        said = start.message.usage
        assert said.input_tokens + (said.cache_read_input_tokens or 0) == total
        assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == total
        assert bool(final.usage.cache_read_input_tokens) == (turn == 1)  # the second reads its prefix from the cache


def test_signature_comes_before_a_thinking_block_closes(client: anthropic.Anthropic) -> None:
    events = list(client.messages.create(model="claude-tiny", max_tokens=300, messages=user("hello"),
                                         thinking={"type": "adaptive"}, stream=True))  # fmt: skip
    kinds = [
        (e.type, getattr(getattr(e, "delta", None), "type", None)) for e in events if getattr(e, "index", None) == 0
    ]
    assert kinds[0] == ("content_block_start", None)
    assert kinds[-2:] == [("content_block_delta", "signature_delta"), ("content_block_stop", None)]


# --- Claude Code's request shapes ---


def test_claude_code_request_shape(client: anthropic.Anthropic, stream: bool) -> None:
    """System blocks with cache_control and the billing header, a system message inside `messages`,
    unknown fields, metadata, `?beta=true` (the beta client), effort and adaptive thinking."""
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cch=0f3a;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    messages = [
        {"role": "system", "content": "<system-reminder>Be brief.</system-reminder>"},
        {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": tiny.MARK_TEXT, "cache_control": {"type": "ephemeral"}}]},
    ]  # fmt: skip
    request = dict(model="claude-sonnet-4-5", max_tokens=32000 if stream else 16000, system=system, messages=messages, tools=TOOLS,
                   thinking={"type": "adaptive"}, output_config={"effort": "high"}, metadata={"user_id": "u"},
                   extra_body={"context_management": {"edits": []}, "some_future_field": 1})  # fmt: skip
    beta = client.beta.messages
    if stream:
        with beta.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = beta.create(**request)
    assert [(b.type, b.text) for b in message.content] == [("text", tiny.ANSWER)]
    assert message.model == "claude-sonnet-4-5"


def test_billing_header_is_stripped(client: anthropic.Anthropic) -> None:
    """It changes on every request: left in, it would defeat vLLM's prefix cache."""

    def count(system: list[dict]) -> int:
        return client.messages.count_tokens(model="claude-tiny", system=system, messages=user("hi")).input_tokens

    plain = [{"type": "text", "text": "You are Claude Code."}]
    assert count([{"type": "text", "text": "x-anthropic-billing-header: cch=1234;"}, *plain]) == count(plain)


def test_prefill_continues_the_last_assistant_message(client: anthropic.Anthropic, stream: bool) -> None:
    messages = [*user(f"hello {tiny.MARK_TEXT}"), {"role": "assistant", "content": tiny.ANSWER_PIECES[0]}]
    message = ask(client, stream, messages=messages, thinking={"type": "disabled"})
    assert message.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in message.content] == [("text", "".join(tiny.ANSWER_PIECES[1:]))]  # its space kept


# --- count_tokens ---


def test_count_tokens_is_the_prompt_vllm_reads(client: anthropic.Anthropic) -> None:
    request = dict(
        system="You are terse.", messages=user(f"hello {tiny.MARK_TEXT} fresh-prefix-{id(client)}"), tools=TOOLS
    )
    counted = client.messages.count_tokens(model="claude-tiny", **request).input_tokens
    used = client.messages.create(model="claude-tiny", max_tokens=20, **request).usage
    assert counted == used.input_tokens + (used.cache_read_input_tokens or 0)
    without_tools = client.messages.count_tokens(
        model="claude-tiny", system="You are terse.", messages=request["messages"]
    )
    without_system = client.messages.count_tokens(model="claude-tiny", messages=request["messages"], tools=TOOLS)
    assert counted > without_tools.input_tokens and counted > without_system.input_tokens


def test_prompt_too_long_is_refused_before_the_engine(client: anthropic.Anthropic, vllm_server) -> None:
    """The wording makes Claude Code compact; vLLM never receives the request."""
    messages = user("lorem ipsum " * 40000)
    count = client.messages.count_tokens(model="claude-tiny", messages=messages).input_tokens
    assert count > vllm_server.max_model_len
    generations_before = vllm_server.log().count("chatcmpl-msg_")
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-tiny", max_tokens=100, messages=messages)
    error = refused.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f"prompt is too long: {count} tokens > {vllm_server.max_model_len - 1} maximum"
    assert vllm_server.log().count("chatcmpl-msg_") == generations_before


# --- models ---


def test_models_in_anthropic_shape_with_the_context_window(client: anthropic.Anthropic, vllm_server) -> None:
    models = client.models.list()
    ids = [model.id for model in models.data]
    assert ids == ["claude-tiny", "tiny", "tiny[1m]", "sonnet-for-tests", "haiku-for-tests[1m]"]  # claude-* first
    assert {model.max_input_tokens for model in models.data} == {vllm_server.max_model_len}
    assert client.models.retrieve("claude-tiny").max_input_tokens == vllm_server.max_model_len


@pytest.mark.parametrize(
    "model", ["tiny", "claude-tiny", "tiny[1m]", "haiku-for-tests[1m]", "gpt-4o", "claude-opus-4-1"]
)
def test_any_model_name_reaches_the_served_model(client: anthropic.Anthropic, model: str) -> None:
    message = ask(client, False, model=model, messages=user(tiny.MARK_TEXT))
    assert (message.model, blocks(message)) == (model, [("text", tiny.ANSWER)])
