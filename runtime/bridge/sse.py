"""Server-sent events both ways: reading the upstream's `data:` lines, writing Anthropic's events.

This is the per-token hot path, so events are written by joining pre-encoded byte fragments
(only the token's text goes through the JSON encoder) and many events may share one write.
"""

from __future__ import annotations

from typing import Any

import msgspec

encode = msgspec.json.encode

PING = b'event: ping\ndata: {"type":"ping"}\n\n'
COMMENT_PING = b": ping\n\n"  # for OpenAI clients, whose SDKs choke on unknown events
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


class SseParser:
    """Splits a byte stream into the payloads of its `data:` fields (comments and other fields dropped)."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        if self.pending:
            data = self.pending + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events = data.split(b"\n\n")
        self.pending = events.pop()
        payloads = []
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:  # the common case, one line
                payloads.append(event[6:])
            elif event:
                lines = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
                if lines:
                    payloads.append(b"\n".join(lines))
        return payloads


def event(name: bytes, data: Any) -> bytes:
    return b"event: " + name + b"\ndata: " + encode(data) + b"\n\n"


def delta_prefix(index: int, kind: bytes, field: bytes) -> bytes:
    """The bytes before a delta's text, e.g. `…"index":0,"delta":{"type":"text_delta","text":`."""
    return b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"%s","%s":' % (
        index,
        kind,
        field,
    )


DELTA_END = b"}}\n\n"


class AnthropicSse:
    """Renders the translator's events as Anthropic SSE bytes, collected until `take()`."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.prefix = b""

    def take(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def message_start(self, message: dict[str, Any]) -> None:
        self.out.append(event(b"message_start", {"type": "message_start", "message": message}))

    def block_start(self, index: int, block: dict[str, Any]) -> None:
        self.out.append(
            event(b"content_block_start", {"type": "content_block_start", "index": index, "content_block": block})
        )
        kind = block["type"]
        if kind == "text":
            self.prefix = delta_prefix(index, b"text_delta", b"text")
        elif kind == "thinking":
            self.prefix = delta_prefix(index, b"thinking_delta", b"thinking")
        else:
            self.prefix = delta_prefix(index, b"input_json_delta", b"partial_json")

    def delta(self, piece: str) -> None:
        """A text, thinking or tool-input delta for the open block."""
        self.out.append(self.prefix + encode(piece) + DELTA_END)

    def signature(self, index: int, signature: str) -> None:
        self.out.append(delta_prefix(index, b"signature_delta", b"signature") + encode(signature) + DELTA_END)

    def block_stop(self, index: int) -> None:
        self.out.append(b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n' % index)

    def message_delta(self, stop_reason: str | None, stop_sequence: str | None, usage: dict[str, int]) -> None:
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        self.out.append(event(b"message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))

    def message_stop(self) -> None:
        self.out.append(MESSAGE_STOP)
