"""A previous assistant turn's thinking, in a tool loop, reaches the model's chat template where the
template expects it: the bridge's translation (Anthropic `thinking` blocks → one `reasoning` key) sent
to real vLLM, whose `/tokenize` renders the prompt with the template given.

The recipes' templates are on the Hub, out of reach here; the test uses a template with the
rule of the Qwen3 family's (qwen, codernext, ornith, qwen38, flashnext): `reasoning_content` rendered in
`<think>` for the assistant turns after the last user query (the tool loop in progress), dropped before
it. vLLM 0.32 hands the key to templates under both names, `reasoning_content` and `reasoning`: whichever
a recipe's template reads, it gets the bridge's one key. This template shows both."""

from __future__ import annotations

import httpx
import msgspec

from runtime.bridge.schema import MessagesRequest, decode
from runtime.bridge.translate import Translator
from tests.support.vllm_server import VllmServer

TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}{%- elif content -%}{%- for part in content -%}{{ part.text }}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
<|{{ m.role }}|>
{%- if m.role == 'assistant' -%}
{%- if loop.index0 > ns.last_query and m.reasoning_content -%}<think>{{ m.reasoning_content }}</think>{%- endif -%}
{%- if m.reasoning -%}(reasoning: {{ m.reasoning | length }} characters){%- endif -%}
{{ text(m.content) }}
{%- for call in m.tool_calls or [] -%}<tool_call>{{ call.function.name }}</tool_call>{%- endfor -%}
{%- else -%}{{ text(m.content) }}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}
"""
# Claude Code's shape: a question answered earlier, then a new one worked through a loop of tool calls.
CONVERSATION = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "Greet back.", "signature": "s"},
                                      {"type": "text", "text": "Hello."}]},
    {"role": "user", "content": "What is in this folder?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "List the files first.", "signature": "s"},
                                      {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "One file: read it.", "signature": "s"},
                                      {"type": "tool_use", "id": "t2", "name": "Read", "input": {"path": "a.txt"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "hello"}]},
]  # fmt: skip


def rendered(engine: VllmServer, payload: dict) -> str:
    """The prompt vLLM builds for the bridge's payload with TEMPLATE, as text."""
    body = {"messages": payload["messages"], "tools": payload.get("tools"), "add_generation_prompt": True,
            "chat_template": TEMPLATE}  # fmt: skip
    tokens = httpx.post(f"{engine.url}/tokenize", json=body, timeout=60).json()["tokens"]
    return httpx.post(f"{engine.url}/detokenize", json={"tokens": tokens}, timeout=60).json()["prompt"]


def test_thinking_in_a_tool_loop_is_rendered_before_each_call_and_dropped_before_the_last_question(
    vllm_server: VllmServer,
) -> None:
    request = {"model": "claude-tiny", "max_tokens": 100, "messages": CONVERSATION,
               "tools": [{"name": name, "input_schema": {"type": "object"}} for name in ("Bash", "Read")]}  # fmt: skip
    payload = Translator().translate(decode(msgspec.json.encode(request), MessagesRequest), None).payload
    text = rendered(vllm_server, payload)
    loop = text[text.index("<|user|>What is in this folder?") :]
    assert "<think>List the files first.</think>(reasoning: 21 characters)<tool_call>Bash</tool_call>" in loop, text
    assert "<think>One file: read it.</think>(reasoning: 18 characters)<tool_call>Read</tool_call>" in loop, text
    assert loop.index("List the files first.") < loop.index("<|tool|>a.txt") < loop.index("One file: read it."), text
    earlier = text[: text.index("<|user|>What is in this folder?")]
    assert "<|assistant|>(reasoning: 11 characters)Hello." in earlier and "<think>" not in earlier, text
