"""Loopback helpers: a free port for each server a test starts, and waiting (with a deadline) for it."""

from __future__ import annotations

import socket
import time


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
