"""The test Hub's wire: what it received (every request, recorded in full) and the port clients connect to,
which relays to the app or simulates an outage (connections reset at once, or held unanswered).

Used by hub_server.HubServer; tests reach it through `hub_server.received` and `hub_server.outage()`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


@dataclass(frozen=True)
class Received:
    """One request as the server saw it (the body read in full)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    status: int

    def payload(self) -> bytes:
        """The body, plus the file contents that JSON/NDJSON bodies carry base64-encoded (commits, preuploads)."""
        decoded = [self.body]
        for line in self.body.splitlines():
            with contextlib.suppress(ValueError):
                decoded += [base64.b64decode(v) for v in json_strings(json.loads(line), ("content", "sample"))]
        return b"\n".join(decoded)

    def carries(self, text: str) -> bool:
        """Whether `text` is anywhere in what was sent, except the Authorization header (where a token belongs)."""
        others = " ".join(v for k, v in self.headers.items() if k != "authorization")
        return any(text in part for part in (self.path, self.query, others)) or text.encode() in self.payload()


def json_strings(value: object, keys: tuple[str, ...]) -> Iterator[str]:
    """Every string under one of `keys`, anywhere in a parsed JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in keys and isinstance(item, str):
                yield item
            else:
                yield from json_strings(item, keys)
    elif isinstance(value, list):
        for item in value:
            yield from json_strings(item, keys)


class Recorder:
    """ASGI middleware that keeps every request (with its full body) and the status answered."""

    def __init__(self, app: ASGIApp, received: list[Received], lock: Any) -> None:
        self.app, self.received, self.lock = app, received, lock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body, status = bytearray(), [0]

        async def recording_receive() -> Message:
            message = await receive()
            body.extend(message.get("body", b""))
            return message

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, recording_receive, recording_send)
        finally:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            received = Received(
                scope["method"], scope["path"], scope["query_string"].decode("latin-1"), headers, bytes(body), status[0]
            )
            with self.lock:
                self.received.append(received)


class DateHeader:
    """ASGI middleware: every answer carries the exact `Date`, as the Hub's do (serve with `date_header=False`).

    uvicorn's own is refreshed once a second, so up to a second late; huggingface_hub's no-follow log read
    stops at the first event stamped after Date + 1 s, and would miss the newest lines.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def dated_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (b"date", formatdate(usegmt=True).encode())],
                }
            await send(message)

        await self.app(scope, receive, dated_send if scope["type"] == "http" else send)


def reset(writer: asyncio.StreamWriter) -> None:
    """Drops a connection with a TCP reset, the way a dead network or a refusing host looks to a client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Front:
    """The port clients connect to: relays to the app, or simulates an outage (`refuse` or `hang`)."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self.mode: str | None = None
        self.live: set[asyncio.StreamWriter] = set()
        self.recovered = asyncio.Event()
        self.refused = self.hung = 0

    def set_mode(self, mode: str | None) -> None:
        self.mode = mode
        if mode is None:
            self.recovered.set()
            return
        self.recovered.clear()
        for writer in list(self.live):  # kept-alive connections must not slip through the outage
            reset(writer)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            self.refused += 1
            return reset(writer)
        if self.mode == "hang":
            self.hung += 1
            await self.recovered.wait()
            return reset(writer)
        self.live.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
            relays = [asyncio.ensure_future(relay(reader, up_writer)), asyncio.ensure_future(relay(up_reader, writer))]
            await asyncio.wait(relays, return_when=asyncio.FIRST_COMPLETED)
            for task in relays:
                task.cancel()
            up_writer.close()
            writer.close()
        finally:
            self.live.discard(writer)


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock
