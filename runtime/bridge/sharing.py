"""Fair sharing of the engine among keys: a cap on each key's requests in flight (leaving a client that
stops reading is `answer`'s).

Without it one key could hold every upstream slot with streams it never read, and every other key
got 529 for as long as it liked. Beyond its cap a key gets 429 at once, never a queue (Claude Code and
the SDKs retry it after `retry-after`); 529 keeps its meaning: the engine is full for everyone.
"""

from __future__ import annotations

from collections import Counter

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.bridge.auth import UNGUARDED
from runtime.bridge.errors import BridgeError


def key_cap(pool: int, keys: int, setting: int | None) -> int | None:
    """Each key's cap: VL_KEY_CONCURRENCY, else the pool split evenly among the keys (the caps add up to
    the pool: no key can take another's share). None when it cannot bind before the pool does, as with
    one key or none: a full pool is then everyone's, and its 529 says so."""
    cap = setting or max(1, pool // max(1, keys))
    return cap if cap < pool else None


class KeyShare:
    """ASGI middleware: at most `cap` requests in flight per key label (`scope["state"]["key"]`), each
    counted from its start to its response's last byte; one more gets a 429 `rate_limit_error`. Without a cap
    (`key_cap` None) the app has no KeyShare at all."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app = app
        self.cap = cap
        self.in_flight: Counter[str] = Counter()  # by label: as many entries as configured keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNGUARDED:
            await self.app(scope, receive, send)
            return
        state = scope["state"]
        key = state["key"]
        if self.in_flight[key] >= self.cap:
            refusal = BridgeError(
                429,
                f"this API key already has {self.cap} requests in flight, the most allowed "
                "(VL_KEY_CONCURRENCY); retry once one has ended",
            )
            state["trace"].error_type = refusal.type
            await refusal.response()(scope, receive, send)
            return
        self.in_flight[key] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[key] -= 1
