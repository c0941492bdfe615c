"""Whether an endpoint serves Claude Code: the bridge answers, lists its models with their context window, and
generates one token through `/v1/messages` with the given key; `EndpointError` says why not in one line.

What a user would do by hand, as `runtime connect` does before printing Claude Code's environment, and the checks
(`runtime check`, the pod's own) before their first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from runtime.headers import KEY_RULE, api_headers
from runtime.health import serves_model


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
    raise EndpointError(f"no model id usable by Claude Code among {ids}")


def check_endpoint(base_url: str, key: str, model: str | None = None, timeout_s: float = 60.0) -> Endpoint:
    """Ask the endpoint what it serves, then for one real token; raise EndpointError on any failure."""
    base_url = base_url.rstrip("/")
    headers = api_headers(key)
    with httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s) as client:
        _require_a_served_model(client)
        listing = _request(client, "GET", "/v1/models")
        entries = listing.get("data") or []
        windows = {e["id"]: int(e.get("max_input_tokens") or e.get("max_model_len") or 0) for e in entries}
        chosen = model or bare_model(list(windows))
        if chosen not in windows:
            raise EndpointError(f"{base_url} does not serve {chosen!r}; it serves {sorted(windows)}")
        reply = _request(
            client,
            "POST",
            "/v1/messages",
            {"model": chosen, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]},
        )
        if reply.get("type") != "message":
            raise EndpointError(f"{base_url}/v1/messages did not answer a message: {reply}")
    return Endpoint(base_url, chosen, windows[chosen], key)


def _require_a_served_model(client: httpx.Client) -> None:
    """The pod's own health check (runtime.health) from outside: a bridge whose engine still loads says
    so here, rather than through a failure further on."""
    url = address(client, "/health")
    try:
        response = client.get("/health")
    except httpx.HTTPError as error:
        raise EndpointError(f"{url} cannot be reached: {error}") from None
    if response.status_code == 200 and not serves_model(response.status_code, response.content):
        if client.get("/v1/models").status_code == 401:  # a stranger reads /health too: the key first
            raise EndpointError(refused_key(address(client, "/v1/models")))
        raise EndpointError(f"{url}: the bridge answers but its engine serves no model yet (still loading?)")


def address(client: httpx.Client, path: str) -> str:
    """The URL a message names: httpx keeps a base URL with a trailing slash."""
    return f"{str(client.base_url).rstrip('/')}{path}"


def refused_key(url: str) -> str:
    return f"{url} refused the key (401): give one of the pod's VL_API_KEYS ({KEY_RULE})"


def _request(client: httpx.Client, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    url = address(client, path)
    try:
        response = client.request(method, path, json=body)
    except httpx.HTTPError as error:
        raise EndpointError(f"{url} cannot be reached: {error}") from None
    if response.status_code == 401:
        raise EndpointError(refused_key(url))
    if response.status_code >= 400:
        raise EndpointError(f"{url} answered {response.status_code}: {response.text[:300]}")
    try:
        answer = response.json()
    except ValueError:
        raise EndpointError(f"{url} did not answer JSON: {response.text[:300]}") from None
    if not isinstance(answer, dict):
        raise EndpointError(f"{url} did not answer a JSON object: {response.text[:300]}")
    return answer
