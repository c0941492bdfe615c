"""An Anthropic Messages request (`schema`) → the OpenAI chat request vLLM serves: messages, tools,
thinking and sampling, as the served model's traits allow (the catalog learns them: `models.Catalog`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime.bridge.errors import BridgeError, capability_rejected
from runtime.bridge.schema import (
    Base64Source,
    ChoiceAny,
    ChoiceAuto,
    ChoiceNone,
    ChoiceTool,
    ContentBlock,
    CountTokensRequest,
    Document,
    Image,
    Message,
    MessagesRequest,
    RedactedThinking,
    Text,
    TextSource,
    Thinking,
    ThinkingAdaptive,
    ThinkingBetweenTools,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolReference,
    ToolResult,
    ToolUse,
    UrlSource,
    block_type,
)

BILLING_HEADER = "x-anthropic-billing-header"  # dropped: it changes on every request, and would defeat prefix caching
# output_config.effort → vLLM's thinking_token_budget (the seeds' thresholds; "max", or a level we do
# not know yet, is unlimited: a newer Claude Code must not get a 400 for it).
EFFORT_BUDGETS: dict[str, int | None] = {"low": 1024, "medium": 4096, "high": 16384, "xhigh": 32768, "max": None}


@dataclass(frozen=True)
class Traits:
    """How the served model takes a request, as far as the translation must know: probed, learnt from a
    refusal, or said by the recipe. Replaced whole when one changes, never edited in place."""

    inline_system: bool = True  # some chat templates (Qwen3.5's) refuse a system message after the first: probed
    thinking_budget: bool = True  # vLLM refuses `thinking_token_budget` without a reasoning parser: learnt on refusal
    thinks_unasked: bool = False  # the recipe's (`--thinks-unasked`): the template's default, not Anthropic's


@dataclass
class Translation:
    """The OpenAI chat request for an Anthropic one, and what the bridge must remember about it."""

    payload: dict[str, Any]
    has_images: bool

    def tokenize_payload(self) -> dict[str, Any]:
        """The same conversation for vLLM's `/tokenize` (chat form, tools included): an exact count."""
        keys = ("model", "messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")
        return {key: self.payload[key] for key in keys if key in self.payload}


class Translator:
    """Anthropic → OpenAI for one request, for a model with these `traits` (a template that refuses inline
    system messages gets them as user messages: the prefix stays cacheable)."""

    def __init__(self, traits: Traits = Traits()) -> None:
        self.traits = traits
        self.has_images = False

    def translate(self, request: CountTokensRequest, model: str | None) -> Translation:
        messages = self.system_messages(request.system)
        for message in request.messages:
            messages += self.message(message)
        payload: dict[str, Any] = {"messages": messages}
        if model is not None:
            payload["model"] = model
        if self.is_prefill(request.messages[-1]):
            payload["add_generation_prompt"], payload["continue_final_message"] = False, True
        self.add_tools(payload, request)
        self.add_thinking(payload, request)
        if request.output_config and request.output_config.format:
            schema = request.output_config.format.schema
            payload["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        if isinstance(request, MessagesRequest):
            self.add_sampling(payload, request)
        return Translation(payload, self.has_images)

    # --- messages ---

    def system_messages(self, system: str | list[Text] | None) -> list[dict[str, Any]]:
        text = system if isinstance(system, str) else join_texts(system or [])
        return [{"role": "system", "content": text}] if text else []

    def message(self, message: Message) -> list[dict[str, Any]]:
        if message.role == "system":
            text = message.content if isinstance(message.content, str) else join_texts(message.content)
            return [{"role": "system" if self.traits.inline_system else "user", "content": text}] if text else []
        if isinstance(message.content, str):
            return [{"role": message.role, "content": message.content}]
        if message.role == "user":
            return self.user_message(message.content)
        return [self.assistant_message(message.content)]

    def user_message(self, blocks: list[ContentBlock]) -> list[dict[str, Any]]:
        """Tool results first (as tool messages, right after the assistant's calls), then the rest."""
        results: list[dict[str, Any]] = []
        parts: list[dict[str, Any]] = []
        for block in blocks:
            if isinstance(block, ToolResult):
                results.append(self.tool_result(block, parts))
            elif isinstance(block, (Thinking, RedactedThinking, ToolUse)):
                raise BridgeError(400, f"invalid request: a user message cannot contain a {block_type(block)} block")
            else:
                self.add_part(block, parts)
        return results + ([{"role": "user", "content": simplify(parts)}] if parts else [])

    def tool_result(self, block: ToolResult, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """A tool message; its images go to the user turn that follows (chat templates take none here)."""
        if isinstance(block.content, list):
            texts = []
            for item in block.content:
                if isinstance(item, Image):
                    self.add_part(item, parts)
                elif isinstance(item, ToolReference):
                    texts.append(f"Tool loaded: {item.tool_name}")  # its definition is in the tools from now on
                else:
                    texts.append(item.text if isinstance(item, Text) else document_text(item))
            text = "\n".join(texts)
        else:
            text = block.content or ""
        if block.is_error:
            text = f"Error: {text}"
        return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}

    def add_part(self, block: ContentBlock, parts: list[dict[str, Any]]) -> None:
        if isinstance(block, Text):
            if block.text:
                parts.append({"type": "text", "text": block.text})
        elif isinstance(block, Image):
            self.has_images = True
            parts.append({"type": "image_url", "image_url": {"url": image_url(block.source)}})
        elif isinstance(block, Document):
            parts.append({"type": "text", "text": document_text(block)})

    def assistant_message(self, blocks: list[ContentBlock]) -> dict[str, Any]:
        """Text → content, thinking → reasoning (the model keeps its plan across tool calls), tool_use → calls."""
        texts, reasoning, calls = [], [], []
        for block in blocks:
            if isinstance(block, Text):
                texts.append(block.text)
            elif isinstance(block, Thinking):
                reasoning.append(block.thinking)
            elif isinstance(block, ToolUse):
                arguments = msgspec.json.encode(block.input).decode()
                calls.append(
                    {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}
                )
            elif not isinstance(block, RedactedThinking):  # opaque by design: accepted, not forwarded
                raise BridgeError(
                    400, f"invalid request: an assistant message cannot contain a {block_type(block)} block"
                )
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if reasoning:
            message["reasoning"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        return message

    @staticmethod
    def is_prefill(last: Message) -> bool:
        """A final assistant message with text is a prefill: the model continues it."""
        if last.role != "assistant":
            return False
        if isinstance(last.content, str):
            return bool(last.content)
        return any(isinstance(b, Text) and b.text for b in last.content) and not any(
            isinstance(b, ToolUse) for b in last.content
        )

    # --- tools, thinking, sampling ---

    @staticmethod
    def add_tools(payload: dict[str, Any], request: CountTokensRequest) -> None:
        """The client's tools as functions; a `defer_loading` one only once a tool search loaded it (Anthropic's
        server shows the model no deferred tool: fewer prompt tokens, the same behaviour)."""
        tools = []
        deferred = any(tool.defer_loading for tool in request.tools or [])
        loaded = loaded_tools(request.messages) if deferred else set()  # a scan only when something waits on it
        for index, tool in enumerate(request.tools or []):
            if tool.defer_loading and tool.name not in loaded:
                continue
            if tool.type not in (None, "custom"):  # web search, tool search, MCP toolsets: Anthropic runs them
                raise BridgeError(
                    400,
                    f"invalid request: tools[{index}]: the server tool {tool.type!r} is not "
                    "supported here (no server tools run on this model server; client tools do)",
                )
            if tool.name is None or tool.input_schema is None:
                field = "name" if tool.name is None else "input_schema"
                raise BridgeError(400, f"invalid request: tools[{index}].{field} is required")
            function = {"name": tool.name, "parameters": tool.input_schema}
            if tool.description:
                function["description"] = tool.description
            tools.append({"type": "function", "function": function})
        choice = request.tool_choice
        if tools:
            payload["tools"] = tools
            payload["tool_choice"] = openai_tool_choice(choice)
        if choice is not None and not isinstance(choice, ChoiceNone) and choice.disable_parallel_tool_use:
            payload["parallel_tool_calls"] = False

    def add_thinking(self, payload: dict[str, Any], request: CountTokensRequest) -> None:
        """Thinking as in Anthropic's API: only when asked (`enabled`, `adaptive`); a chat template thinks
        by default, so an unasked request says `enable_thinking=false` unless the recipe keeps the default."""
        thinking = request.thinking
        if thinking is not None or not self.traits.thinks_unasked:
            asked = isinstance(thinking, (ThinkingEnabled, ThinkingAdaptive))
            payload["chat_template_kwargs"] = {"enable_thinking": asked}
        if isinstance(thinking, (ThinkingDisabled, ThinkingBetweenTools)):
            return
        budget = thinking_budget_of(request)
        if budget is not None and self.traits.thinking_budget:
            payload["thinking_token_budget"] = budget

    @staticmethod
    def add_sampling(payload: dict[str, Any], request: MessagesRequest) -> None:
        payload["max_tokens"] = request.max_tokens
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(request, name)
            if value is not None:
                payload[name] = value
        if request.stop_sequences:
            payload["stop"] = request.stop_sequences
        # Always streamed upstream, with usage on every chunk: the non-streamed answer is assembled
        # from the same events, so both modes share one translation and can notice a client leaving.
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}


def loaded_tools(messages: Sequence[Message]) -> set[str]:
    """The tools a tool search's results referenced (`tool_reference` blocks in tool results) so far."""
    return {
        item.tool_name
        for message in messages
        if isinstance(message.content, list)
        for block in message.content
        if isinstance(block, ToolResult) and isinstance(block.content, list)
        for item in block.content
        if isinstance(item, ToolReference)
    }


def thinking_budget_of(request: CountTokensRequest) -> int | None:
    """An explicit `thinking.budget_tokens` wins; else `output_config.effort`'s threshold; else none."""
    if isinstance(request.thinking, ThinkingEnabled):
        return request.thinking.budget_tokens
    effort = request.output_config.effort if request.output_config else None
    return EFFORT_BUDGETS.get(effort) if effort else None


def openai_tool_choice(choice: ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone | None) -> Any:
    if isinstance(choice, ChoiceAny):
        return "required"
    if isinstance(choice, ChoiceTool):
        return {"type": "function", "function": {"name": choice.name}}
    if isinstance(choice, ChoiceNone):
        return "none"
    return "auto"


def join_texts(blocks: list[Text] | list[ContentBlock]) -> str:
    """System text blocks joined, without Claude Code's per-request billing header."""
    texts = []
    for block in blocks:
        if not isinstance(block, Text):
            raise BridgeError(400, f"invalid request: system content takes text blocks, not {block_type(block)}")
        if block.text and not block.text.startswith(BILLING_HEADER):
            texts.append(block.text)
    return "\n\n".join(texts)


def simplify(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone text part as a plain string: the form every chat template understands."""
    return parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def image_url(source: Base64Source | UrlSource) -> str:
    if isinstance(source, UrlSource):
        return source.url
    return f"data:{source.media_type};base64,{source.data}"


def document_text(block: Document) -> str:
    if not isinstance(block.source, TextSource):  # no PDF reader behind the model: the client drops it and retries
        raise capability_rejected("document_block")
    return f"{block.title}\n\n{block.source.data}" if block.title else block.source.data
