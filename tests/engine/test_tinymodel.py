"""The tiny scripted model, served by a real vLLM and asked through the real OpenAI SDK.

Every mode must give exactly its scripted reply, streamed or not, since the bridge and Claude Code
tests build their expectations on these texts.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from runtime.engine import tinymodel
from runtime.engine.tinymodel import (
    AFTER_TOOL,
    ANSWER,
    LONG_CYCLE,
    MARK_LONG,
    MARK_PONDER,
    MARK_TEXT,
    MARK_TOOL,
    MARK_WRITE,
    PONDER_CYCLE,
    THINK_START,
    THINKING,
    TOOL_ARGUMENTS,
    TOOL_COMMAND,
    TOOL_NAME,
    WRITE_ARGUMENTS,
    WRITE_TOOL,
    mode_token,
)
from tests.support.sdk import openai

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@dataclass
class Reply:
    """A chat completion reduced to what the modes script: the same shape streamed or not."""

    reasoning: str | None
    content: str | None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON)
    finish_reason: str | None = None
    usage: openai.types.CompletionUsage | None = None


@pytest.fixture(scope="module")
def client(vllm_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=vllm_server.openai_url, api_key="unused", max_retries=0, timeout=300)


def ask(client: openai.OpenAI, messages: list[dict], *, stream: bool, **params) -> Reply:
    """One chat completion from the tiny model, read the way a client reads it."""
    if not stream:
        response = client.chat.completions.create(model=tinymodel.SERVED_NAME, messages=messages, **params)
        choice = response.choices[0]
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        reasoning = getattr(choice.message, "reasoning", None)  # vLLM 0.32's name; no reasoning_content
        return Reply(reasoning, choice.message.content, calls, choice.finish_reason, response.usage)
    chunks = client.chat.completions.create(
        model=tinymodel.SERVED_NAME, messages=messages, stream=True, stream_options={"include_usage": True}, **params
    )
    reasoning, content, reply = "", "", Reply(None, None)
    parts: dict[int, tuple[str, str]] = {}
    for chunk in chunks:
        reply.usage = chunk.usage or reply.usage
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning", None) or ""
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name, arguments = parts.get(call.index, ("", ""))
                parts[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
            reply.finish_reason = choice.finish_reason or reply.finish_reason
    reply.reasoning, reply.content, reply.tool_calls = reasoning or None, content or None, list(parts.values())
    return reply


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def text_block(text: str) -> dict:
    return {"type": "text", "text": text}


def after_a_tool_call() -> list[dict]:
    function = {"name": TOOL_NAME, "arguments": json.dumps(TOOL_ARGUMENTS)}
    call = {"id": "call_1", "type": "function", "function": function}
    return [
        {"role": "user", "content": f"{MARK_TOOL} write the proof"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
    ]


def is_cycle_prefix(text: str, cycle: str) -> bool:
    return text == (cycle * (len(text) // len(cycle) + 1))[: len(text)]


streamed = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


@streamed
def test_no_marker_reasons_then_answers(client, stream):
    reply = ask(client, user("Say hello."), stream=stream)
    assert (reply.reasoning, reply.content, reply.finish_reason) == (THINKING, ANSWER, "stop")
    assert reply.tool_calls == []


@streamed
@pytest.mark.parametrize(
    ("messages", "params"),
    [
        (user(f"{MARK_TEXT} Say hello."), {}),
        (user("Say hello."), {"extra_body": THINKING_OFF}),
        ([{"role": "user", "content": [text_block("Say"), text_block(f"hello {MARK_TEXT}")]}], {}),
    ],
    ids=["text-marker", "thinking-off", "text-blocks"],
)
def test_text_mode_answers_without_reasoning(client, stream, messages, params):
    reply = ask(client, messages, stream=stream, **params)
    assert (reply.reasoning, reply.content, reply.finish_reason) == (None, ANSWER, "stop")


@streamed
@pytest.mark.parametrize("params", [{}, {"extra_body": THINKING_OFF}], ids=["thinking-on", "thinking-off"])
def test_tool_marker_calls_bash(client, stream, params):
    messages = [{"role": "user", "content": [text_block(f"{MARK_TOOL} write the proof")]}]
    reply = ask(client, messages, stream=stream, tools=[BASH_TOOL], **params)
    assert reply.tool_calls == [(TOOL_NAME, json.dumps({"command": TOOL_COMMAND}))]
    assert json.loads(reply.tool_calls[0][1]) == TOOL_ARGUMENTS
    assert (reply.reasoning, reply.content, reply.finish_reason) == (None, None, "tool_calls")


@streamed
def test_write_marker_writes_a_whole_file_that_elides_it(client, stream):
    """The guard's real input: vLLM's hermes parser streams a Write whose content holds an elision marker."""
    write = {"type": "function", "function": {"name": WRITE_TOOL, "parameters": {"type": "object"}}}
    reply = ask(client, user(f"{MARK_WRITE} rewrite app.py"), stream=stream, tools=[BASH_TOOL, write])
    assert [(name, json.loads(arguments)) for name, arguments in reply.tool_calls] == [(WRITE_TOOL, WRITE_ARGUMENTS)]
    assert reply.finish_reason == "tool_calls"


@streamed
def test_tool_marker_without_tools_reasons_and_answers(client, stream):
    reply = ask(client, user(f"{MARK_TOOL} write the proof"), stream=stream)
    assert (reply.reasoning, reply.content, reply.tool_calls) == (THINKING, ANSWER, [])


@streamed
@pytest.mark.parametrize("params", [{}, {"extra_body": THINKING_OFF}], ids=["thinking-on", "thinking-off"])
def test_tool_result_gets_the_after_tool_text(client, stream, params):
    reply = ask(client, after_a_tool_call(), stream=stream, tools=[BASH_TOOL], **params)
    assert (reply.reasoning, reply.content, reply.finish_reason) == (None, AFTER_TOOL, "stop")


@streamed
@pytest.mark.parametrize("params", [{}, {"extra_body": THINKING_OFF}], ids=["thinking-on", "thinking-off"])
def test_long_mode_runs_until_max_tokens(client, stream, params):
    reply = ask(client, user(f"{MARK_LONG} talk"), stream=stream, max_tokens=50, **params)
    assert reply.finish_reason == "length"
    assert reply.reasoning is None
    assert len(reply.content) > 3 * len(LONG_CYCLE) and is_cycle_prefix(reply.content, LONG_CYCLE)
    assert reply.usage.completion_tokens == 50


@streamed
def test_ponder_mode_reasons_until_max_tokens(client, stream):
    reply = ask(client, user(f"{MARK_PONDER} think hard"), stream=stream, max_tokens=30)
    assert (reply.content, reply.finish_reason) == (None, "length")
    assert len(reply.reasoning) > 3 * len(PONDER_CYCLE) and is_cycle_prefix(reply.reasoning, PONDER_CYCLE)


@streamed
@pytest.mark.parametrize("budget", [0, 1, 7, 20])
def test_thinking_token_budget_closes_ponder_reasoning_then_answers(client, stream, budget):
    budgeted = {"thinking_token_budget": budget}  # a top-level field of vLLM's request
    reply = ask(client, user(f"{MARK_PONDER} think hard"), stream=stream, max_tokens=100, extra_body=budgeted)
    assert (reply.content, reply.finish_reason) == (ANSWER, "stop")
    assert is_cycle_prefix(reply.reasoning or "", PONDER_CYCLE)
    # vLLM counts the prompt's mode token, after <think>, as the first token of thought.
    assert reply.usage.completion_tokens_details.reasoning_tokens == max(budget - 1, 0)


@pytest.mark.parametrize("temperature", [None, 0.0, 1.0, 2.0], ids=["client-default", "greedy", "t1", "t2"])
def test_replies_do_not_depend_on_sampling(client, temperature):
    params = {} if temperature is None else {"temperature": temperature}
    for _ in range(3):
        reply = ask(client, user("Say hello."), stream=False, **params)
        assert (reply.reasoning, reply.content) == (THINKING, ANSWER)


@streamed
def test_stop_sequence_cuts_the_answer(client, stream):
    reply = ask(client, user(f"{MARK_TEXT} Say hello."), stream=stream, stop=["tiny"])
    assert (reply.content, reply.finish_reason) == (ANSWER[: ANSWER.index("tiny")], "stop")


def test_a_raw_completion_prompt_gets_the_answer(client, vllm_server):
    completion = client.completions.create(model=vllm_server.model, prompt="Hello there", max_tokens=20)
    assert (completion.choices[0].text, completion.choices[0].finish_reason) == (ANSWER, "stop")


def test_tokenize_counts_a_chat_like_the_completion_does(client, vllm_server):
    messages = [{"role": "system", "content": "Be brief."}, *user("Say hello.")]
    request = {"model": vllm_server.model, "messages": messages}
    with httpx.Client(base_url=vllm_server.url, timeout=60) as http:
        bare = http.post("/tokenize", json=request).json()
        with_tools = http.post("/tokenize", json=request | {"tools": [BASH_TOOL]}).json()
    assert bare["count"] == len(bare["tokens"]) > 0
    assert bare["max_model_len"] == vllm_server.max_model_len
    assert with_tools["count"] > bare["count"]
    assert ask(client, messages, stream=False).usage.prompt_tokens == bare["count"]
    assert ask(client, messages, stream=False, tools=[BASH_TOOL]).usage.prompt_tokens == with_tools["count"]


@pytest.mark.slow  # writes the model twice with torch, once in another process
def test_writing_the_model_is_deterministic(tmp_path):
    first = tinymodel.write_tiny_model(tmp_path / "here")
    # Another process too: the BPE trainer's hash maps are seeded per process.
    write_elsewhere = (
        "import sys, pathlib, runtime.engine.tinymodel as m; m.write_tiny_model(pathlib.Path(sys.argv[1]))"
    )
    repository = Path(__file__).parents[2]
    subprocess.run([sys.executable, "-c", write_elsewhere, tmp_path / "there"], check=True, cwd=repository)
    assert digests(first) == digests(tmp_path / "there")
    assert set(digests(first)) >= {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"}


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer  # slow to import: only for these tests

    return AutoTokenizer.from_pretrained(tinymodel.write_tiny_model(tmp_path_factory.mktemp("tiny")))


THINK = THINK_START + mode_token("think")
PONDER = THINK_START + mode_token("ponder")


@pytest.mark.slow  # transformers' tokenizer: seconds to import
@pytest.mark.parametrize("as_blocks", [False, True], ids=["string", "blocks"])
@pytest.mark.parametrize(
    ("text", "template_args", "expected"),
    [
        ("hi", {}, THINK),
        ("hi", {"enable_thinking": True}, THINK),
        (f"hi {MARK_TEXT}", {}, mode_token("text", thinking=True)),
        ("hi", {"enable_thinking": False}, mode_token("text")),
        (f"{MARK_TOOL} go", {"tools": [BASH_TOOL]}, mode_token("tool", thinking=True)),
        (f"{MARK_TOOL} go", {}, THINK),
        (f"{MARK_TOOL} go {MARK_LONG}", {"tools": [BASH_TOOL], "enable_thinking": False}, mode_token("tool")),
        (f"{MARK_WRITE} go", {"tools": [BASH_TOOL]}, mode_token("write", thinking=True)),
        (MARK_WRITE, {}, THINK),
        (f"{MARK_LONG} {MARK_PONDER}", {}, mode_token("long", thinking=True)),
        (f"{MARK_PONDER} {MARK_TEXT}", {}, PONDER),
        (MARK_PONDER, {"enable_thinking": False}, mode_token("text")),
    ],
)
def test_the_template_picks_the_mode_from_the_last_user_message(tokenizer, as_blocks, text, template_args, expected):
    content = [text_block("Please:"), text_block(text)] if as_blocks else text
    earlier = [*user(f"{MARK_LONG} earlier"), {"role": "assistant", "content": "ok"}]
    prompt = tokenizer.apply_chat_template(
        [*earlier, {"role": "user", "content": content}], tokenize=False, add_generation_prompt=True, **template_args
    )
    assert prompt.endswith(f"<|im_start|>assistant\n{expected}")
    assert sum(prompt.count(m) for m in tinymodel.MODE_TOKENS) == 1
