"""The translations themselves, where the tiny model cannot show them: what vLLM is sent for
Anthropic shapes it would accept either way, and chunk shapes that vLLM 0.32 does not produce."""

from __future__ import annotations

import msgspec
import pytest

from runtime.bridge.errors import BridgeError
from runtime.bridge.schema import MessagesRequest, decode
from runtime.bridge.sse import AnthropicSse, SseParser
from runtime.bridge.stream import MessageAssembler, StreamTranslator
from runtime.bridge.translate import Traits, Translator

BASE = {"model": "m", "max_tokens": 100}
TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]


def translate(inline_system: bool = True, **request: object) -> dict:
    body = msgspec.json.encode(BASE | {"messages": [{"role": "user", "content": "hi"}]} | request)
    return Translator(Traits(inline_system=inline_system)).translate(decode(body, MessagesRequest), None).payload


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}),
        ({"type": "none"}, "none"),
    ],
)
def test_tool_choice(choice: dict, expected: object) -> None:
    payload = translate(tools=TOOLS, tool_choice=choice)
    assert payload["tool_choice"] == expected
    assert payload["tools"] == [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]
    assert "parallel_tool_calls" not in payload


def test_parallel_tool_calls_can_be_disabled() -> None:
    payload = translate(tools=TOOLS, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert payload["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("tool", "refusal"),
    [
        ({"type": "web_search_20250305", "name": "web_search"}, "tools[1]: the server tool 'web_search_20250305' is"),
        ({"type": "tool_search_tool_regex_20251119", "name": "tool_search"}, "'tool_search_tool_regex_20251119'"),
        (
            {"type": "mcp_toolset", "mcp_server_name": "docs"},
            "tools[1]: the server tool 'mcp_toolset' is not supported",
        ),
        ({"input_schema": {"type": "object"}}, "tools[1].name is required"),
        ({"name": "Grep"}, "tools[1].input_schema is required"),
    ],
)
def test_server_tools_are_refused_by_their_type_not_dropped(tool: dict, refusal: str) -> None:
    with pytest.raises(BridgeError) as refused:
        translate(tools=[{"name": "Read", "input_schema": {"type": "object"}}, tool])
    assert refused.value.status == 400 and refusal in refused.value.message


@pytest.mark.parametrize(
    ("thinking", "effort", "budget"),
    [(None, "low", 1024), (None, "medium", 4096), (None, "high", 16384), (None, "xhigh", 32768), (None, "max", None),
     ({"type": "enabled", "budget_tokens": 2000}, "low", 2000), ({"type": "adaptive"}, None, None), (None, None, None)],
)  # fmt: skip
def test_reasoning_budget(thinking: dict | None, effort: str | None, budget: int | None) -> None:
    request: dict = {}
    if thinking:
        request["thinking"] = thinking
    if effort:
        request["output_config"] = {"effort": effort}
    assert translate(**request).get("thinking_token_budget") == budget


def test_thinking_disabled() -> None:
    payload = translate(thinking={"type": "disabled"}, output_config={"effort": "high"})
    assert payload["chat_template_kwargs"] == {"enable_thinking": False} and "thinking_token_budget" not in payload


@pytest.mark.parametrize(
    ("thinking", "unasked", "kwargs"),
    [
        (None, False, {"enable_thinking": False}),  # Anthropic's API: no `thinking`, no thinking
        ({"type": "adaptive"}, False, {"enable_thinking": True}),  # what Claude Code sends
        ({"type": "enabled", "budget_tokens": 2048}, False, {"enable_thinking": True}),
        (None, True, None),  # a recipe's thinks_unasked: the template's own default
        ({"type": "disabled"}, True, {"enable_thinking": False}),
    ],
)
def test_thinking_only_when_asked(thinking: dict | None, unasked: bool, kwargs: dict | None) -> None:
    body = msgspec.json.encode(
        BASE | {"messages": [{"role": "user", "content": "hi"}]} | ({"thinking": thinking} if thinking else {})
    )
    payload = Translator(Traits(thinks_unasked=unasked)).translate(decode(body, MessagesRequest), None).payload
    assert payload.get("chat_template_kwargs") == kwargs


def test_history_images_and_tool_results() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                                     {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan", "signature": "s"},
                                          {"type": "redacted_thinking", "data": "opaque"},
                                          {"type": "text", "text": "Running."},
                                          {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                      "content": [{"type": "text", "text": "no"},
                                                  {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j"}}]},
                                     {"type": "text", "text": "and now?"}]},
    ]  # fmt: skip
    assert translate(messages=messages)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        {"role": "assistant", "content": "Running.", "reasoning": "plan",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "Error: no"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j"}},
                                     {"type": "text", "text": "and now?"}]},
    ]  # fmt: skip


@pytest.mark.parametrize(("inline", "role"), [(True, "system"), (False, "user")])
def test_system_blocks_and_inline_system_messages(inline: bool, role: str) -> None:
    system = [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"}, {"type": "text", "text": "A"},
              {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}}]  # fmt: skip
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
    ]
    payload = translate(inline, system=system, messages=messages, context_management={"edits": []})
    assert payload["messages"] == [{"role": "system", "content": "A\n\nB"}, {"role": "user", "content": "hi"},
                                   {"role": role, "content": "reminder"}]  # fmt: skip


def test_a_final_assistant_text_is_continued() -> None:
    payload = translate(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:"}])
    assert (payload["add_generation_prompt"], payload["continue_final_message"]) == (False, True)


def chunk(delta: dict, finish: str | None = None) -> bytes:
    return msgspec.json.encode({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def test_reasoning_content_is_read_like_reasoning() -> None:
    """Some vLLM versions stream `reasoning_content` rather than `reasoning`: both are thinking."""
    sink = MessageAssembler()
    translator = StreamTranslator(sink, "msg_1", "m")
    for payload in (
        chunk({"reasoning_content": "hm"}),
        chunk({"reasoning": " ok"}),
        chunk({"content": "\n\nYes"}, "stop"),
        b"[DONE]",
    ):
        translator.feed(payload)
    assert [(b["type"], b.get("thinking", b.get("text"))) for b in sink.message["content"]] == [
        ("thinking", "hm ok"),
        ("text", "Yes"),
    ]
    assert sink.message["content"][0]["signature"] and sink.message["stop_reason"] == "end_turn"


def test_streamed_events_are_well_formed_json() -> None:
    sink = AnthropicSse()
    translator = StreamTranslator(sink, "msg_1", "m")
    for payload in (chunk({"content": 'say "hi"\n'}), chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "Bash", "arguments": '{"a"'}}]}),
                    chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}, "tool_calls"), b"[DONE]"):  # fmt: skip
        translator.feed(payload)
    events = [msgspec.json.decode(data) for data in SseParser().feed(sink.take())]
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                                           "content_block_start", "content_block_delta", "content_block_delta",
                                           "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    assert events[2]["delta"] == {"type": "text_delta", "text": 'say "hi"\n'}
    assert "".join(e["delta"]["partial_json"] for e in events[5:7]) == '{"a": 1}'
    assert events[8]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_sse_parser_takes_any_framing() -> None:
    parser = SseParser()
    assert parser.feed(b'data: {"a":') == []
    assert parser.feed(b" 1}\r\n\r\n: comment\n\nevent: x\ndata: 1\ndata: 2\n\ndata: [DONE]\n\n") == [
        b'{"a": 1}',
        b"1\n2",
        b"[DONE]",
    ]


def test_a_deferred_tool_is_shown_only_once_a_tool_search_loaded_it() -> None:
    """Claude Code 2.1.332 defers tools behind its ToolSearch (`defer_loading: true`); Anthropic's server shows the
    model none of them until a search's result references one (`tool_reference`), and neither does the bridge."""
    tools = [
        {"name": "ToolSearch", "input_schema": {"type": "object"}},
        {"name": "mcp__docs__fetch", "input_schema": {"type": "object"}, "defer_loading": True},
        {"name": "DeferredToolPlaceholder", "input_schema": {"type": "object"}, "defer_loading": True},
    ]
    before = translate(tools=tools)
    assert [tool["function"]["name"] for tool in before["tools"]] == ["ToolSearch"]
    search = {"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {"query": "docs"}}
    found = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "tool_reference", "tool_name": "mcp__docs__fetch"}],
    }
    after = translate(tools=tools, messages=[
        {"role": "user", "content": "read the docs"},
        {"role": "assistant", "content": [search]},
        {"role": "user", "content": [found]},
    ])  # fmt: skip
    assert [tool["function"]["name"] for tool in after["tools"]] == ["ToolSearch", "mcp__docs__fetch"]
    assert after["messages"][-1] == {"role": "tool", "tool_call_id": "t1", "content": "Tool loaded: mcp__docs__fetch"}
