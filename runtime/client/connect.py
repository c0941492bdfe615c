"""`python -m runtime connect URL`: check a pod's endpoint, then print Claude Code's environment for it.

The check is what a user would do by hand: the bridge answers, lists its models with their context
window, and generates one token through `/v1/messages` with the given key. The environment follows
the rules the seeds paid for: a bare model id (Claude Code honours `CLAUDE_CODE_MAX_CONTEXT_TOKENS`
only for ids that do not start with `claude-`), and `ANTHROPIC_API_KEY` removed (it wins over the
token and silently sends traffic to the paid API).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.client.identity import pod_key
from runtime.headers import KEY_DEFAULT, KEY_RULE, api_headers
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


def claude_environment(endpoint: Endpoint) -> dict[str, str]:
    """The variables that point Claude Code at the endpoint, every model tier on the served model."""
    environment = {
        "ANTHROPIC_BASE_URL": endpoint.base_url,
        "ANTHROPIC_AUTH_TOKEN": endpoint.key,
        "ANTHROPIC_MODEL": endpoint.model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.model,
        "ANTHROPIC_SMALL_FAST_MODEL": endpoint.model,
        # Without these two, Claude Code assumes 200k for an unknown id and compacts there.
        "CLAUDE_CODE_DISABLE_UNKNOWN_MODEL_WINDOW_ENFORCEMENT": "1",
        # Each request says its class (main, subagent, compaction…): the console's per-agent view shows it.
        "CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1",
    }
    if endpoint.window:
        environment["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(endpoint.window)
    return environment


def bash_script(environment: dict[str, str]) -> str:
    lines = ["unset ANTHROPIC_API_KEY  # it wins over ANTHROPIC_AUTH_TOKEN and goes to the paid API"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in environment.items()]
    return "\n".join([*lines, "claude"])


def powershell_literal(value: str) -> str:
    """A single-quoted PowerShell string: nothing in it is expanded; a quote is doubled."""
    return "'" + value.replace("'", "''") + "'"


def powershell_script(environment: dict[str, str]) -> str:
    lines = ["Remove-Item Env:ANTHROPIC_API_KEY -ErrorAction SilentlyContinue"]
    lines += [f"$env:{name} = {powershell_literal(value)}" for name, value in environment.items()]
    return "\n".join([*lines, "claude"])


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="the pod's public endpoint, e.g. https://<pod>-8080.proxy.runpod.net")
    parser.add_argument("--key", help=f"one of the pod's VL_API_KEYS (default: {KEY_DEFAULT}; any text if open)")
    parser.add_argument("--model", help="the model id to use (default: the served model's bare name)")
    parser.add_argument("--shell", choices=("bash", "powershell", "both"), default="both")


def run(args: argparse.Namespace) -> int:
    try:
        endpoint = check_endpoint(args.url, pod_key(args.key, args.url) or "x", args.model)  # open: any text
    except EndpointError as error:
        print(f"connect: {error}", file=sys.stderr)
        return 1
    print_environment(endpoint, args.shell)
    return 0


def print_environment(endpoint: Endpoint, shell: str = "both") -> None:
    """What `connect` prints once the endpoint answered: what it serves, then Claude Code's environment."""
    window = f"{endpoint.window} tokens" if endpoint.window else "an unknown window"
    print(f"# {endpoint.base_url} serves {endpoint.model!r} with {window}; one token generated.")
    environment = claude_environment(endpoint)
    if shell in ("bash", "both"):
        print(f"\n# bash / zsh\n{bash_script(environment)}")
    if shell in ("powershell", "both"):
        print(f"\n# PowerShell\n{powershell_script(environment)}")
