"""Loopback helpers: a free port for each server a test starts, waiting (with a deadline) for it, and an
ASGI app served from a thread."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.types import ASGIApp


def free_port() -> int:
    """A port nobody listens on now (other engineers run tests at the same time: never a fixed one)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, deadline_s: float = 30.0) -> None:
    """Return once something accepts connections on 127.0.0.1:port; fail after the deadline."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > give_up:
                raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {deadline_s} s") from None
            time.sleep(0.05)


class Served:
    """An ASGI app on 127.0.0.1 (a free port) in a background thread: `url` while the block runs."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app, self.name, self.url = app, name, ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Served:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)  # listening already: a client that comes before uvicorn accepts waits in the backlog
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(30)
