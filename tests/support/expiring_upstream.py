"""An upstream that closes idle connections after a keep-alive, as vLLM's uvicorn does (5 s), at a
moment a test can act on: the race of a request with that close, played deterministically.

When a connection's keep-alive runs out it prints `keep-alive expired: connection N` and keeps the
connection until something arrives on it; then it drops it unanswered (a reset), which is what a
real close does to a request that crossed it on the wire. It answers `GET /v1/models` and
`POST /tokenize`, enough for a bridge to learn its model and relay.

    python -m tests.support.expiring_upstream [--keep-alive-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json

from tests.support.http_framing import next_request, response

LISTING = {"object": "list", "data": [{"id": "fake", "object": "model", "created": 0, "max_model_len": 4096}]}
COUNTED = {"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3]}
NUMBERS = itertools.count(1)


class ExpiringConnection(asyncio.Protocol):
    """One client connection: requests answered in turn; idle past the keep-alive, it is expired."""

    def __init__(self, keep_alive_s: float) -> None:
        self.keep_alive_s = keep_alive_s
        self.number = next(NUMBERS)
        self.buffer = b""
        self.expired = False
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        if self.expired:
            print(f"request dropped unanswered: connection {self.number}", flush=True)
            self.transport.abort()
            return
        if self.timer is not None:
            self.timer.cancel()
        self.buffer += data
        while True:
            request, self.buffer = next_request(self.buffer)
            if request is None:
                break
            listing = request.target == b"/v1/models"
            self.transport.write(response(200, json.dumps(LISTING if listing else COUNTED).encode()))
            print(f"answered {request.target.decode()}: connection {self.number}", flush=True)
        if self.buffer:
            return  # a request is still arriving: the connection is not idle
        self.timer = asyncio.get_running_loop().call_later(self.keep_alive_s, self.expire)

    def expire(self) -> None:
        self.expired = True
        print(f"keep-alive expired: connection {self.number}", flush=True)


async def serve(keep_alive_s: float) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: ExpiringConnection(keep_alive_s), "127.0.0.1", 0)
    print(f"listening on http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-alive-s", type=float, default=5.0, help="vLLM's (uvicorn's default): 5")
    asyncio.run(serve(parser.parse_args().keep_alive_s))


if __name__ == "__main__":
    main()
