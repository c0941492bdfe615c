"""The tiny model's chat template: the usual Qwen markup, ending the prompt with the mode token that the last
user message's marker, the tools and `enable_thinking` pick (the rules: the package's docstring)."""

from __future__ import annotations

import json

from runtime.engine.tinymodel.script import MARK_AGENT, MARK_LONG, MARK_PONDER, MARK_TEXT, MARK_TOOL, MARK_WRITE

CHAT_TEMPLATE = (
    "{%- set marks = "
    + json.dumps(
        {
            "text": MARK_TEXT,
            "tool": MARK_TOOL,
            "agent": MARK_AGENT,
            "write": MARK_WRITE,
            "long": MARK_LONG,
            "ponder": MARK_PONDER,
        }
    )
    + """ -%}
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}{%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
<|im_start|>system
# Tools
<tools>
{% for tool in tools -%}
{{ tool | tojson }}
{% endfor -%}
</tools><|im_end|>
{% endif -%}
{%- for message in messages -%}
<|im_start|>{{ message.role }}
{{ text(message.content) }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": {{ call.function.name | tojson }}, "arguments": \
{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}}
</tool_call>
{%- endfor -%}
<|im_end|>
{% endfor -%}
{%- if add_generation_prompt -%}
{%- set thinking = enable_thinking is not defined or enable_thinking -%}
{%- set ns = namespace(asked='', last='') -%}
{%- for message in messages if message.role == 'user' -%}{%- set ns.asked = text(message.content) -%}{%- endfor -%}
{%- for message in messages if message.role != 'system' -%}{%- set ns.last = message.role -%}{%- endfor -%}
{%- if ns.last == 'tool' -%}{%- set mode = 'after_tool' -%}
{%- elif tools and marks.tool in ns.asked -%}{%- set mode = 'tool' -%}
{%- elif tools and marks.agent in ns.asked -%}{%- set mode = 'agent' -%}
{%- elif tools and marks.write in ns.asked -%}{%- set mode = 'write' -%}
{%- elif marks.long in ns.asked -%}{%- set mode = 'long' -%}
{%- elif marks.ponder in ns.asked and thinking -%}{%- set mode = 'ponder' -%}
{%- elif marks.text in ns.asked or not thinking -%}{%- set mode = 'text' -%}
{%- else -%}{%- set mode = 'think' -%}
{%- endif -%}
<|im_start|>assistant
{% if mode in ('think', 'ponder') -%}
<think><|mode:{{ mode }}|>
{%- else -%}
<|mode:{{ mode }}{{ '+think' if thinking else '' }}|>
{%- endif -%}
{%- endif -%}
"""
)
