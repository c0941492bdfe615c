"""A hostile HTTP server on loopback for the client commands' tests (issue 46 §2): raw asyncio sockets in a thread,
each path answered by a behaviour of the test's choosing. The behaviours an attacker used: a byte dripped every
DRIP_S (never silent long enough for a read timeout), pings streamed without end, an answer that declares 2 GiB or
declares nothing and floods; and plain answers (JSON, an event stream) to lead a command up to them. It counts the
bytes it sent, so that a test can say where a client stopped reading."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

DRIP_S = 0.5  # far under any client's read timeout: only a total deadline ends a drip
PING_S = 0.05
FLOOD_CHUNK = 64 * 1024
DECLARED = 2 * 2**30  # the attacker's Content-Length: 2 GiB

Request = dict[str, Any]  # {"method", "path", "body"}
Behaviour = Callable[["Hostile", Request, asyncio.StreamWriter], Awaitable[None]]


def head(status: int = 200, **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join([*lines, "connection: close", "", ""])).encode()


def answer(body: Any, status: int = 200) -> Behaviour:
    """A whole JSON answer (bytes: sent as they are)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def behave(server: Hostile, request: Request, writer: asyncio.StreamWriter) -> None:
        await server.send(writer, head(status, content_type="application/json", content_length=str(len(data))) + data)

    return behave


async def drip(server: Hostile, request: Request, writer: asyncio.StreamWriter) -> None:
    """The answer's head, a byte every DRIP_S, without end."""
    for byte in b"HTTP/1.1 200 OK\r\n" * 1000:
        await server.send(writer, bytes([byte]))
        await asyncio.sleep(DRIP_S)


async def pings(server: Hostile, request: Request, writer: asyncio.StreamWriter) -> None:
    """A Messages API stream that starts, then pings without end."""
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 10, "output_tokens": 0}}}
    await server.send(writer, head(200, content_type="text/event-stream"))
    await server.send(writer, f"event: message_start\ndata: {json.dumps(start)}\n\n".encode())
    while True:
        await server.send(writer, b'event: ping\ndata: {"type": "ping"}\n\n')
        await asyncio.sleep(PING_S)


def flood(declared: int | None = DECLARED) -> Behaviour:
    """An answer that declares `declared` bytes (None: nothing, the connection's close ends it) and streams zeros as
    fast as the client reads."""

    async def behave(server: Hostile, request: Request, writer: asyncio.StreamWriter) -> None:
        length = {"content_length": str(declared)} if declared is not None else {}
        await server.send(writer, head(200, content_type="application/json", **length))
        chunk = b"0" * FLOOD_CHUNK
        while True:
            await server.send(writer, chunk)

    return behave


@dataclass
class Hostile:
    """The server: `routes` maps "METHOD /path" (or "METHOD /path stream" for a body that asks a stream) to a
    behaviour; `sent` counts every byte written, `url` is where it listens while the block runs."""

    routes: dict[str, Behaviour]
    sent: int = 0
    asked: list[str] = field(default_factory=list)
    url: str = ""

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile", daemon=True)
        self._server: asyncio.Server | None = None

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()
        self.sent += len(data)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            length = int({k.lower(): v for k, v in headers.items()}.get("content-length", "0"))
            body = json.loads(await reader.readexactly(length)) if length else None
            streamed = " stream" if isinstance(body, dict) and body.get("stream") else ""
            key = f"{method} {path}{streamed}"
            self.asked.append(key)
            behave = self.routes.get(key) or self.routes.get(f"{method} {path}")
            await (behave or answer({"error": {"message": "not here"}}, 404))(self, {"body": body}, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client gave up (what these tests wait for), or the test is over
        finally:
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def __enter__(self) -> Hostile:
        self._thread.start()
        self._ready.wait(30)
        return self

    async def _shutdown(self) -> None:
        """Every connection's task ended (its writer closed), the listener closed: then the loop may stop."""
        if self._server is not None:
            self._server.close()
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()
