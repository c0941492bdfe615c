"""Anthropic Messages requests as the bridge accepts them: msgspec structs, validated on decode.

Unknown fields are ignored (Claude Code sends `context_management`, `metadata`, `cache_control`, …);
unknown content block types are refused with a 400 that names them, rather than dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from runtime.bridge.errors import BridgeError
from runtime.bridge.nesting import refuse_deep_nesting


class Block(Struct, tag_field="type", kw_only=True):
    """A content block; the subclass is chosen by its `type`."""


class Text(Block, tag="text"):
    text: str


class Base64Source(Struct, tag_field="type", tag="base64"):
    media_type: str
    data: str


class UrlSource(Struct, tag_field="type", tag="url"):
    url: str


class TextSource(Struct, tag_field="type", tag="text"):
    data: str


class Image(Block, tag="image"):
    source: Base64Source | UrlSource


class Document(Block, tag="document"):
    source: TextSource | Base64Source | UrlSource
    title: str | None = None


class Thinking(Block, tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinking(Block, tag="redacted_thinking"):
    data: str = ""


class ToolUse(Block, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolReference(Block, tag="tool_reference"):
    """A tool a tool search loaded (Claude Code's ToolSearch result): its definition is shown from then on."""

    tool_name: Annotated[str, Meta(max_length=128)]


class ToolResult(Block, tag="tool_result"):
    tool_use_id: str
    content: str | list[Text | Image | Document | ToolReference] | None = None
    is_error: bool = False


ContentBlock = Text | Image | Document | Thinking | RedactedThinking | ToolUse | ToolResult


class Message(Struct):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


ToolName = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_.:-]{1,128}$")]
ToolType = Annotated[str, Meta(pattern=r"^[a-zA-Z0-9_.:-]{1,64}$")]  # quoted in a refusal: plain and short


class Tool(Struct, kw_only=True):
    name: ToolName | None = None  # required of a client tool; some server tools (mcp_toolset) have none
    input_schema: dict[str, Any] | None = None
    description: str | None = None
    type: ToolType | None = None  # Anthropic's own tools (web_search_…) have a type and no schema
    defer_loading: bool = False  # shown to the model only once a tool search's result references it


class ChoiceAuto(Struct, tag_field="type", tag="auto", kw_only=True):
    disable_parallel_tool_use: bool = False


class ChoiceAny(Struct, tag_field="type", tag="any", kw_only=True):
    disable_parallel_tool_use: bool = False


class ChoiceTool(Struct, tag_field="type", tag="tool", kw_only=True):
    name: ToolName
    disable_parallel_tool_use: bool = False


class ChoiceNone(Struct, tag_field="type", tag="none"):
    pass


class ThinkingEnabled(Struct, tag_field="type", tag="enabled", kw_only=True):
    budget_tokens: Annotated[int, Meta(ge=1)]


class ThinkingDisabled(Struct, tag_field="type", tag="disabled"):
    pass


class ThinkingAdaptive(Struct, tag_field="type", tag="adaptive"):
    pass


class ThinkingBetweenTools(Struct, tag_field="type", tag="between_tools"):
    """Claude Code 2.1.332's thinking between tool calls only: vLLM and the SDK map it to no thinking."""


class JsonFormat(Struct, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]


class OutputConfig(Struct, kw_only=True):
    effort: Annotated[str, Meta(max_length=64)] | None = None
    format: JsonFormat | None = None


class Diagnostics(Struct, kw_only=True):
    """Anthropic's `diagnostics`: the client's previous message, for why this one missed the prompt cache."""

    previous_message_id: Annotated[str, Meta(max_length=64)] | None = None


class Metadata(Struct, kw_only=True):
    user_id: Annotated[str, Meta(max_length=256)] | None = None  # Claude Code names its session there (affinity)


class CountTokensRequest(Struct, kw_only=True):
    """What `count_tokens` reads; `MessagesRequest` adds the generation fields."""

    model: Annotated[str, Meta(min_length=1)]
    messages: Annotated[list[Message], Meta(min_length=1)]
    system: str | list[Text] | None = None
    tools: list[Tool] | None = None
    tool_choice: ChoiceAuto | ChoiceAny | ChoiceTool | ChoiceNone | None = None
    thinking: ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive | ThinkingBetweenTools | None = None
    output_config: OutputConfig | None = None
    safeguards: Any = msgspec.UNSET  # Anthropic's own checks (auto mode): refused, so the client runs its own


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    stream: bool = False
    stop_sequences: list[Annotated[str, Meta(min_length=1)]] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: Metadata | None = None
    diagnostics: Diagnostics | msgspec.UnsetType | None = msgspec.UNSET  # null opts in on a first turn


R = TypeVar("R", CountTokensRequest, MessagesRequest)


def decode(body: bytes, kind: type[R]) -> R:
    """The validated request, or a 400 that says what is wrong and where."""
    refuse_deep_nesting(body)
    try:
        request = msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as error:
        raise BridgeError(400, f"invalid request: {error}") from None
    except msgspec.DecodeError as error:
        raise BridgeError(400, f"the request body is not valid JSON: {error}") from None
    if request.safeguards not in (msgspec.UNSET, None):
        raise BridgeError(400, SAFEGUARDS_REFUSED)
    return request


# Claude Code's contract: a gateway that cannot apply `safeguards` refuses it in a 400 whose message starts with
# the field's name; the client then sends the request without it and runs its own check.
SAFEGUARDS_REFUSED = "safeguards: not supported: this pod's model runs no safeguards of Anthropic's; send none"


def block_type(block: Struct) -> str:
    return str(block.__struct_config__.tag)  # every block's tag is its `type`, a string
