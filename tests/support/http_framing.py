"""HTTP/1.1 framing for the raw-asyncio stand-ins (upstream.py, expiring_upstream.py): cutting requests
out of a connection's bytes, and a whole response with its length. Just enough HTTP, no more."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus


@dataclass(frozen=True)
class RawRequest:
    method: bytes
    target: bytes  # the path as sent, query included
    headers: dict[bytes, bytes]  # names in lower case
    body: bytes

    @property
    def path(self) -> bytes:
        return self.target.split(b"?")[0]


def next_request(buffer: bytes) -> tuple[RawRequest | None, bytes]:
    """The first whole request in `buffer` and the bytes after it; (None, buffer) until it has all arrived."""
    head, found, rest = buffer.partition(b"\r\n\r\n")
    if not found:
        return None, buffer
    lines = head.split(b"\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines[1:])}
    length = int(headers.get(b"content-length", 0))
    if len(rest) < length:
        return None, buffer
    method, target = lines[0].split(b" ")[:2]
    return RawRequest(method, target, headers, rest[:length]), rest[length:]


def response(status: int, body: bytes, content_type: bytes = b"application/json") -> bytes:
    head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (status, HTTPStatus(status).phrase.encode(), content_type, len(body)) + body
