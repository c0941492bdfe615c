"""Whether an endpoint serves Claude Code: the bridge answers, lists its models with their context window, and
generates one token through `/v1/messages` with the given key; `EndpointError` says why not in one line.

What a user would do by hand, as `runtime connect` does before printing Claude Code's environment, and the checks
(`runtime check`, the pod's own) before their first.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.checks.bounded import CONNECT_S, Answer, DeadlineSettingError, Limits, OverLimit, limits, request
from runtime.headers import KEY_RULE, api_headers
from runtime.health import serves_model
from runtime.logsafe import ERROR_CHARS, terminal_line
from runtime.settings import quoted

# A model id Claude Code is given and a shell prints: a plain token (the served names' own rule, runtime.settings'
# MODEL_NAME). Anything else (an escape sequence, a quote, a space) is refused: it would reach a terminal or a script.
MODEL_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/+\[\]-]{0,255}")
MAX_WINDOW = 2**40  # tokens: far above any engine's window, far below what would overflow a size computed from it


class EndpointError(Exception):
    """The endpoint cannot serve Claude Code; the message says why in one line."""


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    window: int
    key: str


def bare_model(ids: list[str]) -> str:
    """The id to give Claude Code: the first without the `claude-` prefix or the `[1m]` suffix.

    `[1m]` makes Claude Code assume a million tokens whatever the engine serves (it compacts too late).
    """
    for model_id in ids:
        if not model_id.startswith("claude-") and not model_id.endswith("[1m]"):
            return model_id
    raise EndpointError(f"no model id usable by Claude Code among {said(repr(ids))}")


def check_endpoint(base_url: str, key: str, model: str | None = None, timeout_s: float = 60.0) -> Endpoint:
    """Ask the endpoint what it serves, then for one real token; raise EndpointError on any failure. Each request
    ends within `timeout_s` in all and reads at most ANSWER_BYTES (runtime.checks.bounded; VLLM_POD_DEADLINE_S
    replaces the deadline)."""
    try:
        bounds = limits(timeout_s)
    except DeadlineSettingError as error:
        raise EndpointError(str(error)) from None
    return asyncio.run(_checked(base_url.rstrip("/"), api_headers(key), key, model, bounds))


async def _checked(base_url: str, headers: dict[str, str], key: str, model: str | None, bounds: Limits) -> Endpoint:
    timeout = httpx.Timeout(min(CONNECT_S, bounds.deadline_s), read=bounds.deadline_s)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout) as client:
        asking = Asking(client, bounds)
        await asking.require_a_served_model()
        listing = await asking.json("GET", "/v1/models")
        entries = listing.get("data")
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise EndpointError(f"{base_url}/v1/models did not list models: {said(repr(listing))}")
        windows = {str(e.get("id")): window_of(base_url, e) for e in entries}
        chosen = model or bare_model(list(windows))
        if chosen not in windows:
            raise EndpointError(f"{base_url} does not serve {quoted(chosen)}; it serves {said(repr(sorted(windows)))}")
        if not MODEL_ID.fullmatch(chosen):
            raise EndpointError(f"{base_url} serves a model id that is not a plain token: {quoted(chosen)}")
        reply = await asking.json(
            "POST",
            "/v1/messages",
            {"model": chosen, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]},
        )
        if reply.get("type") != "message":
            raise EndpointError(f"{base_url}/v1/messages did not answer a message: {said(repr(reply))}")
    return Endpoint(base_url, chosen, windows[chosen], key)


def window_of(base_url: str, entry: dict[str, Any]) -> int:
    """A listed model's window: a whole number of tokens in 0..MAX_WINDOW, else EndpointError naming it."""
    value = entry.get("max_input_tokens") or entry.get("max_model_len") or 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WINDOW:
        raise EndpointError(f"{base_url}/v1/models gives a window that is no token count: {said(repr(value))}")
    return value


def said(text: str, limit: int = ERROR_CHARS) -> str:
    """A server's words in an error's one line: no control, no line break, cut at `limit`."""
    return terminal_line(text, limit)


class Asking:
    """The endpoint's requests, each within its limits; every failure an EndpointError in one line."""

    def __init__(self, client: httpx.AsyncClient, bounds: Limits) -> None:
        self.client, self.bounds = client, bounds

    async def answer(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        try:
            return await request(self.client, method, path, self.bounds, body)
        except OverLimit as error:
            raise EndpointError(said(str(error))) from None
        except httpx.HTTPError as error:
            raise EndpointError(f"{address(self.client, path)} cannot be reached: {said(str(error))}") from None

    async def require_a_served_model(self) -> None:
        """The pod's own health check (runtime.health) from outside: a bridge whose engine still loads says
        so here, rather than through a failure further on."""
        url = address(self.client, "/health")
        response = await self.answer("GET", "/health")
        if response.status_code == 200 and not serves_model(response.status_code, response.content):
            if (await self.answer("GET", "/v1/models")).status_code == 401:  # a stranger reads /health: the key first
                raise EndpointError(refused_key(address(self.client, "/v1/models")))
            raise EndpointError(f"{url}: the bridge answers but its engine serves no model yet (still loading?)")

    async def json(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = address(self.client, path)
        response = await self.answer(method, path, body)
        if response.status_code == 401:
            raise EndpointError(refused_key(url))
        if response.status_code >= 400:
            raise EndpointError(f"{url} answered {response.status_code}: {said(response.text)}")
        try:
            answer = response.json()
        except ValueError:
            raise EndpointError(f"{url} did not answer JSON: {said(response.text)}") from None
        if not isinstance(answer, dict):
            raise EndpointError(f"{url} did not answer a JSON object: {said(response.text)}")
        return answer


def address(client: httpx.AsyncClient, path: str) -> str:
    """The URL a message names: httpx keeps a base URL with a trailing slash."""
    return f"{str(client.base_url).rstrip('/')}{path}"


def refused_key(url: str) -> str:
    return f"{url} refused the key (401): give one of the pod's VL_API_KEYS ({KEY_RULE})"
