"""Anthropic's error envelope, its status → type map, and how upstream failures map onto it.

Every error the bridge answers, before or during a stream, goes through `BridgeError`, so a client
always gets `{"type": "error", "error": {"type", "message"}}` and never a traceback.
"""

from __future__ import annotations

import msgspec
from starlette.responses import Response
from starlette.types import Send

JSON_CONTENT_TYPE = "application/json"  # the media type of every JSON body, answered or sent upstream
JSON_RESPONSE_HEADERS = [(b"content-type", JSON_CONTENT_TYPE.encode())]  # an ASGI response head's, for a JSON body

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    501: "not_supported",  # Claude Code's own gateway's word: what this pod does not do, never worth a retry
    529: "overloaded_error",
}


# Whole seconds before a retry, sent with `x-should-retry: true` (the SDKs and Claude Code read both).
# A key over its share (429) waits for a held slot to free, seconds to minutes later; a full or
# starting engine (529) is worth asking again sooner.
RETRY_AFTER_S: dict[int, int] = {429: 5, 529: 2}
# Never worth asking again: Claude Code retries a 401 with backoff for ~3 minutes unless told not to.
NEVER_RETRY = frozenset({401, 501})
BILLING_ERROR = "billing_error"  # a 429 for a spent budget: retried, it would only meet the block again


def error_type(status: int) -> str:
    """The Anthropic error type for a status; statuses outside the map fall into their class."""
    return ERROR_TYPES.get(status) or ("invalid_request_error" if status < 500 else "api_error")


def envelope(status: int, message: str, kind: str | None = None) -> bytes:
    return msgspec.json.encode({"type": "error", "error": {"type": kind or error_type(status), "message": message}})


class BridgeError(Exception):
    """An error answered to the client: an HTTP status and a message for the envelope."""

    def __init__(self, status: int, message: str, retry_after_s: int | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s  # instead of RETRY_AFTER_S's, when the bridge knows better
        self.kind = kind  # instead of the status's type: `billing_error` is a 429 too

    @property
    def type(self) -> str:
        return self.kind or error_type(self.status)

    def headers(self) -> dict[str, str]:
        """When to retry, for an overload; never, for a wrong key, what the pod does not do or a spent budget; other
        errors say nothing (the client's own rules apply)."""
        if self.status in NEVER_RETRY:
            return {"x-should-retry": "false"}
        wait = self.retry_after_s or RETRY_AFTER_S.get(self.status)
        if self.kind == BILLING_ERROR:  # when the budget is whole again, and never a retry before
            return {"retry-after": str(wait), "x-should-retry": "false"}
        return {} if wait is None else {"retry-after": str(wait), "x-should-retry": "true"}

    def response(self, headers: dict[str, str] | None = None) -> Response:
        headers = self.headers() | (headers or {})
        return Response(envelope(self.status, self.message, self.kind), self.status, headers, JSON_CONTENT_TYPE)

    async def send(self, send: Send) -> None:
        """Answer with this error through a raw ASGI `send` (from inside a streaming response)."""
        headers = JSON_RESPONSE_HEADERS + [(name.encode(), value.encode()) for name, value in self.headers().items()]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": envelope(self.status, self.message, self.kind)})

    def event(self) -> bytes:
        """The error as an SSE `event: error`, for failures after the stream began."""
        return b"event: error\ndata: " + envelope(self.status, self.message, self.kind) + b"\n\n"


def status_from_upstream(status: int) -> int:
    """Our status for an upstream one: mapped ones pass, 502-504 mean overloaded, others by class."""
    if status in ERROR_TYPES:
        return status
    if status in (502, 503, 504):
        return 529
    return 400 if status < 500 else 500


def upstream_message(body: bytes) -> str:
    """The message of an upstream error body (vLLM's `{"error": {"message"}}` or older flat shape)."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return body.decode("utf-8", "replace").strip()[:2000] or "upstream error"
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and isinstance(message := inner.get("message"), str):
            return message
        if isinstance(inner, str):
            return inner
        if isinstance(message := data.get("message"), str):
            return message
    return str(data)[:2000]


def internal_failure() -> BridgeError:
    """A bug of the bridge's own: the client gets this; the traceback goes to the bridge's log only."""
    return BridgeError(500, "internal error in the bridge (see its log)")


def capability_rejected(what: str) -> BridgeError:
    """Claude Code's gateway contract: a 400 whose message is exactly `capability_rejected: <class>` makes the
    client drop that thing (an image, a document…) and retry once, instead of failing the turn."""
    return BridgeError(400, f"capability_rejected: {what}")


def from_upstream(status: int, body: bytes) -> BridgeError:
    return BridgeError(status_from_upstream(status), upstream_message(body))
