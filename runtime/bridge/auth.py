"""API keys (VL_API_KEYS): who may call the bridge, and the name its usage is counted under.

An entry is `key` or `name:key`; metrics and logs show the name, or a short hash of the key, never
the key. Keys arrive as `Authorization: Bearer` (ANTHROPIC_AUTH_TOKEN) or `x-api-key`
(ANTHROPIC_API_KEY); both present and different is refused rather than guessed.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.bridge.errors import BridgeError

OPEN_LABEL = "open"  # the usage label when no key is configured
NAMED = re.compile(r"^([A-Za-z0-9_.-]{1,64}):(.+)$")
UNGUARDED = frozenset({"/", "/health"})  # the warm-up HEAD / and the supervisor's watchdog


def label_of(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()[:12]


class ApiKeys:
    """The accepted keys and their labels; empty means the bridge is open."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.keys: list[tuple[str, bytes]] = []
        for entry in entries:
            named = NAMED.match(entry)
            label, key = (named.group(1), named.group(2)) if named else (label_of(entry), entry)
            self.keys.append((label, key.encode()))

    @property
    def open(self) -> bool:
        return not self.keys

    def identify(self, authorization: str | None, api_key: str | None) -> str:
        """The label of the key presented; BridgeError(401) when none, a wrong one, or two that differ."""
        if self.open:
            return OPEN_LABEL
        bearer = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
        if bearer is not None and api_key is not None and not hmac.compare_digest(bearer.encode(), api_key.encode()):
            raise BridgeError(401, "Authorization and x-api-key carry different keys; send one of them")
        presented = bearer if bearer is not None else api_key
        if not presented:
            raise BridgeError(401, "an API key is required: send Authorization: Bearer <key> or x-api-key: <key>")
        found = None
        for label, key in self.keys:  # compare against every key: the time taken says nothing about which
            if hmac.compare_digest(presented.encode(), key):
                found = label
        if found is None:
            raise BridgeError(401, "invalid API key")
        return found


class RequireKey:
    """ASGI middleware: checks the key of every request except UNGUARDED paths; puts its label in
    `scope["state"]["key"]` for the usage counters."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            label = OPEN_LABEL
            if scope["path"] not in UNGUARDED and not self.keys.open:
                headers = dict(scope["headers"])
                authorization, api_key = headers.get(b"authorization"), headers.get(b"x-api-key")
                try:
                    label = self.keys.identify(
                        authorization.decode("latin-1") if authorization is not None else None,
                        api_key.decode("latin-1") if api_key is not None else None,
                    )
                except BridgeError as error:
                    await error.response({"www-authenticate": "Bearer"})(scope, receive, send)
                    return
            scope.setdefault("state", {})["key"] = label
        await self.app(scope, receive, send)
