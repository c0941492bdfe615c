"""vLLM's OpenAI chat chunks → Anthropic's message events, streamed or assembled into one message.

One translator serves both modes: it calls an event sink, either `sse.AnthropicSse` (bytes for a
stream) or `MessageAssembler` (the non-streamed response). Reasoning is read from `delta.reasoning`
and `delta.reasoning_content` (vLLM versions differ; the seeds' first bridge read only one and
showed no thinking at all). With VL_GUARD, a whole-file write's block is held until its arguments end,
then said whole or replaced by a text (`runtime.bridge.guard`): one path for both modes.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any, Protocol

import msgspec
from msgspec import Struct

from runtime.bridge.errors import BridgeError, status_from_upstream
from runtime.bridge.guard import BlockedWrite, notice, truncated_write, whole_file_write
from runtime.bridge.nesting import MAX_JSON_DEPTH, nests_deeper_than

log = logging.getLogger("runtime.bridge")

VLLM_TOOL_ID = re.compile(r"chatcmpl-tool-([0-9a-zA-Z]+)")


class FunctionDelta(Struct):
    """A piece of a tool call: its name in the first chunk, then its arguments' JSON a piece at a time."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Struct):
    """Which tool call a piece belongs to (`index`), with its id when it begins."""

    index: int = 0
    id: str | None = None
    function: FunctionDelta | None = None


class Delta(Struct):
    """What a chunk adds: text, reasoning (under either name vLLM versions use) or tool calls."""

    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class Choice(Struct):
    """The one choice the bridge asks for; `finish_reason` and `stop_reason` come with its last chunk."""

    delta: Delta | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class PromptDetails(Struct):
    """How many of the prompt's tokens the prefix cache served."""

    cached_tokens: int | None = None


class ChunkUsage(Struct):
    """A chunk's `usage` (vLLM's continuous usage stats): the prompt's tokens, and the output's so far."""

    prompt_tokens: int = 0
    completion_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None


class UpstreamError(Struct):
    """An error the engine sends as an event of its stream (after its 200)."""

    message: str = "the model server reported an error"
    code: int | None = None


class Chunk(Struct):
    """One `data:` payload of the engine's stream: choices, usage, or an error."""

    choices: list[Choice] = []
    usage: ChunkUsage | None = None
    error: UpstreamError | None = None


DECODE_CHUNK = msgspec.json.Decoder(Chunk).decode


def decoded(payload: bytes) -> Chunk:
    try:
        return DECODE_CHUNK(payload)
    except msgspec.DecodeError as error:
        raise BridgeError(500, f"the model server sent an unreadable event: {error}") from None


def refusal_of(error: UpstreamError) -> BridgeError:
    """An error event of the upstream's stream, as ours."""
    return BridgeError(status_from_upstream(error.code or 500), error.message)


class Sink(Protocol):
    def message_start(self, message: dict[str, Any]) -> None: ...
    def block_start(self, index: int, block: dict[str, Any]) -> None: ...
    def delta(self, piece: str) -> None: ...
    def signature(self, index: int, signature: str) -> None: ...
    def block_stop(self, index: int) -> None: ...
    def message_delta(self, stop_reason: str | None, stop_sequence: str | None, usage: dict[str, int]) -> None: ...
    def message_stop(self) -> None: ...


class StreamTranslator:
    """Feeds on upstream `data:` payloads and drives a sink with Anthropic's events, in order."""

    def __init__(self, sink: Sink, message_id: str, model: str, input_tokens: int = 0, guard: bool = True) -> None:
        self.sink = sink
        self.diagnostics: Any = msgspec.UNSET  # Anthropic's `diagnostics` for message_start, when the client asked
        self.index = -1
        self.open: str | None = None  # "thinking", "text", "tool_use" or None
        self.tool_index: int | None = None
        self.tools_started: set[int] = set()
        self.answered = False  # some text or a tool call: else the reasoning is repeated as text
        self.tool_used = False  # a tool_use block said: the stop reason is `tool_use`
        self.guard = guard  # VL_GUARD: whole-file writes are held back and checked
        self.held: dict[str, Any] | None = None  # the open block, when it is a held whole-file write
        self.held_arguments: list[str] = []
        self.blocked: list[BlockedWrite] = []  # the writes replaced by a text, for the trace and the metrics
        self.reasoning: list[str] = []
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None
        self.stop_reason: str | None = None
        self.input_tokens, self.cached_tokens, self.output_tokens = input_tokens, 0, 0
        self.first_token_at: float | None = None
        self.done = False
        self.message_id, self.model = message_id, model
        self.started = False  # message_start said: at the engine's first chunk, whose usage counts the prompt

    def begin(self) -> None:
        """`message_start`, once, with the prompt's size as known now (input and cache read, as Anthropic's)."""
        if self.started:
            return
        self.started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": self.usage(),
        }
        if self.diagnostics is not msgspec.UNSET:  # asked for: why the prompt missed the cache (or null)
            message["diagnostics"] = self.diagnostics
        self.sink.message_start(message)

    def feed(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.finish()
            return
        chunk = decoded(payload)
        if chunk.error is not None:
            raise refusal_of(chunk.error)
        if chunk.usage is not None:
            self.take_usage(chunk.usage)
        if not self.started:
            self.begin()
        for choice in chunk.choices:
            delta = choice.delta
            if delta is not None:
                reasoning = delta.reasoning or delta.reasoning_content
                if reasoning:
                    self.thinking(reasoning)
                if delta.content:
                    self.text(delta.content)
                if delta.tool_calls:
                    self.tool_calls(delta.tool_calls)
            if choice.finish_reason is not None:
                self.finish_reason, self.matched_stop = choice.finish_reason, choice.stop_reason

    def usage(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
        }

    # --- blocks ---

    def thinking(self, piece: str) -> None:
        if self.open != "thinking":
            self.start_block({"type": "thinking", "thinking": "", "signature": ""}, "thinking")
        self.reasoning.append(piece)
        self.sink.delta(piece)

    def text(self, piece: str) -> None:
        if self.open != "text":
            piece = piece.lstrip("\n")  # the template's newlines after reasoning; spaces are the answer's
            if not piece:
                return
            self.start_block({"type": "text", "text": ""}, "text")
            self.answered = True
        self.sink.delta(piece)

    def tool_calls(self, calls: list[ToolCallDelta]) -> None:
        for call in calls:
            function = call.function
            if function is None:
                continue
            if call.index not in self.tools_started and call.id and function.name:
                self.tools_started.add(call.index)
                block = {"type": "tool_use", "id": tool_use_id(call.id), "name": function.name, "input": {}}
                if self.guard and whole_file_write(function.name):
                    self.hold(block)
                else:
                    self.start_block(block, "tool_use")
                    self.tool_used = True
                self.tool_index, self.answered = call.index, True
            if function.arguments and self.open == "tool_use" and call.index == self.tool_index:
                if self.held is not None:
                    self.held_arguments.append(function.arguments)
                else:
                    self.sink.delta(function.arguments)

    def start_block(self, block: dict[str, Any], kind: str) -> None:
        self.next_block(kind)
        self.sink.block_start(self.index, block)

    def next_block(self, kind: str) -> None:
        """Close the open block and take the next index, as every block does before its start is said."""
        self.close_block()
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        self.index += 1
        self.open = kind

    def hold(self, block: dict[str, Any]) -> None:
        """Open a whole-file write's block without saying it: its arguments are kept until they end (the
        next block, or the stream's end), when `release` says it whole or the text that replaces it. Its
        index is taken now, and nothing else is said meanwhile: the indexes stay consecutive."""
        self.next_block("tool_use")
        self.held, self.held_arguments = block, []

    def release(self) -> None:
        """The held write, said at once: its tool_use block with all its arguments in one delta, or, when its
        content elides the file (`guard.truncated_write`), a text block at its place that says so."""
        block, arguments = self.held, "".join(self.held_arguments)
        assert block is not None
        self.held, self.held_arguments = None, []
        blocked = truncated_write(block["name"], arguments)
        if blocked is None:
            self.sink.block_start(self.index, block)
            if arguments:
                self.sink.delta(arguments)
            self.tool_used = True
        else:
            self.blocked.append(blocked)
            self.sink.block_start(self.index, {"type": "text", "text": ""})
            self.sink.delta(notice(blocked))

    def close_block(self) -> None:
        if self.open is None:
            return
        if self.held is not None:
            self.release()
        if self.open == "thinking":  # clients expect a signature before a thinking block closes
            self.sink.signature(self.index, uuid.uuid4().hex)
        self.sink.block_stop(self.index)
        self.open = None

    # --- the end ---

    def take_usage(self, usage: ChunkUsage) -> None:
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else None
        self.cached_tokens = cached or 0
        self.input_tokens = max(0, usage.prompt_tokens - self.cached_tokens)  # Anthropic's excludes cached
        if usage.completion_tokens is not None:
            self.output_tokens = usage.completion_tokens

    def finish(self) -> None:
        """Close the last block, repeat reasoning as text if nothing else came, then the stop events."""
        if self.done:
            return
        self.begin()
        self.close_block()
        if not self.answered and self.reasoning:  # the seeds' empty-compaction bug: all in reasoning
            self.start_block({"type": "text", "text": ""}, "text")
            self.sink.delta("".join(self.reasoning))
            self.close_block()
        self.done = True
        self.stop_reason, stop_sequence = anthropic_stop(
            self.finish_reason, self.matched_stop, self.tool_used, bool(self.blocked)
        )
        self.sink.message_delta(self.stop_reason, stop_sequence, self.usage())
        self.sink.message_stop()


def tool_use_id(engine_id: str) -> str:
    """Anthropic's `toolu_…` form of vLLM's own tool call ids (`chatcmpl-tool-<hex>`), their unique part
    kept; an id a tool parser took from the model (Kimi's `functions.name:0`) stays, its template reads it back."""
    generic = VLLM_TOOL_ID.fullmatch(engine_id)
    return f"toolu_{generic.group(1)}" if generic else engine_id


def anthropic_stop(
    finish_reason: str | None, matched: str | int | None, tool_used: bool, blocked: bool = False
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from vLLM's finish_reason and stop_reason (the matched string); calls all
    `blocked` by the guard leave no tool to run: the turn ends (`end_turn`) on the text that replaced them."""
    if finish_reason == "length":
        return "max_tokens", None
    if tool_used or (finish_reason == "tool_calls" and not blocked):
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


class MessageAssembler:
    """A sink that builds the non-streamed Anthropic message from the same events."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.pieces: list[str] = []

    def message_start(self, message: dict[str, Any]) -> None:
        self.message = message

    def block_start(self, index: int, block: dict[str, Any]) -> None:
        self.message["content"].append(dict(block))
        self.pieces = []

    def delta(self, piece: str) -> None:
        self.pieces.append(piece)

    def signature(self, index: int, signature: str) -> None:
        self.message["content"][index]["signature"] = signature

    def block_stop(self, index: int) -> None:
        block = self.message["content"][index]
        joined = "".join(self.pieces)
        if block["type"] == "tool_use":
            block["input"] = tool_input(joined)
        else:
            block[block["type"]] = joined

    def message_delta(self, stop_reason: str | None, stop_sequence: str | None, usage: dict[str, int]) -> None:
        self.message.update(stop_reason=stop_reason, stop_sequence=stop_sequence, usage=usage)

    def message_stop(self) -> None:
        if not self.message["content"]:  # Anthropic's shape for an empty answer: one empty text block
            self.message["content"].append({"type": "text", "text": ""})


def tool_input(arguments: str) -> dict[str, Any]:
    """The parsed arguments; `{}` when the model's JSON was cut short (e.g. by max_tokens), or nests
    deeper than a request may (a model writes any JSON: it must not overflow the decoder's stack)."""
    if nests_deeper_than(arguments.encode(), MAX_JSON_DEPTH):
        log.warning(
            "tool call arguments nest deeper than %d levels (%d chars); sent as {}", MAX_JSON_DEPTH, len(arguments)
        )
        return {}
    try:
        value = msgspec.json.decode(arguments) if arguments else {}
    except msgspec.DecodeError:
        log.warning("tool call arguments are not valid JSON (%d chars); sent as {}", len(arguments))
        return {}
    return value if isinstance(value, dict) else {}
