"""The bridge's Starlette application: its routes, and the per-request trace and metrics.

`/health` answers from the bridge alone (the supervisor's watchdog must not depend on the engine
or on the upstream pool: the seeds' bridge was restarted for a pool jammed by leaked streams).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.bridge.auth import AllowedHosts, ApiKeys, RequireKey
from runtime.bridge.connection import read_body
from runtime.bridge.errors import BridgeError, error_type, internal_failure
from runtime.bridge.exchange import MessagesExchange, count_prompt
from runtime.bridge.metrics import CONTENT_TYPE, Metrics
from runtime.bridge.models import Catalog
from runtime.bridge.relay import Relay, rewrite_model
from runtime.bridge.requests import CountTokensRequest, MessagesRequest, Translator, decode
from runtime.bridge.sharing import KeyShare, key_cap
from runtime.bridge.upstream import Upstream
from runtime.logsafe import PROMPT_CHARS, loggable
from runtime.settings import Settings

log = logging.getLogger("runtime.bridge")

QUIET_ROUTES = frozenset({"/health", "/metrics", "/"})  # polled often: no trace line


class Bridge:
    """Everything one bridge process shares: the upstream pool, the model catalog, keys, metrics."""

    def __init__(
        self, upstream_url: str, settings: Settings, max_connections: int = 512, pool_timeout: float = 10.0
    ) -> None:
        self.upstream = Upstream(upstream_url, max_connections, pool_timeout)
        self.catalog = Catalog(settings.aliases)
        self.metrics = Metrics(lambda: self.upstream.in_use)
        self.keys = ApiKeys.for_pod(settings.api_keys, Path(settings.state_dir))
        self.hosts = AllowedHosts.for_pod(settings.allowed_hosts, os.environ)
        self.ping_s: float = settings.bridge_ping_s
        self.log_prompts: bool = settings.log_prompts
        self.max_body: int = settings.max_body_mb * 2**20
        labels = {label for label, _ in self.keys.keys}  # none when open
        self.key_concurrency: int | None = key_cap(max_connections, len(labels), settings.key_concurrency)
        self.stall_s: float = settings.client_stall_s

    # --- Anthropic ---

    async def messages(self, request: Request) -> MessagesExchange:
        body = await read_body(request, self.max_body)
        return MessagesExchange(self, decode(body, MessagesRequest), len(body), request.state.trace)

    async def count_tokens(self, request: Request) -> Response:
        parsed = decode(await read_body(request, self.max_body), CountTokensRequest)
        await self.catalog.current(self.upstream)
        translation = Translator(self.catalog.inline_system).translate(parsed, self.catalog.upstream_name(parsed.model))
        count, _ = await count_prompt(self, translation)
        return JSONResponse({"input_tokens": count})

    async def models(self, request: Request) -> Any:
        """Anthropic's shape (with the context window) for Anthropic clients, vLLM's own otherwise."""
        if "anthropic-version" not in request.headers:
            return Relay(self, request)
        await self.catalog.current(self.upstream)
        return JSONResponse(self.catalog.anthropic_listing())

    async def model(self, request: Request) -> Response:
        await self.catalog.current(self.upstream)
        return JSONResponse(self.catalog.anthropic_info(request.path_params["model_id"]))

    # --- OpenAI and vLLM, relayed ---

    async def relay(self, request: Request) -> Relay:
        body, stream = rewrite_model(self, await read_body(request, self.max_body))
        return Relay(self, request, body, stream)

    async def prometheus(self, request: Request) -> Response:
        """The bridge's metrics, then vLLM's (ours alone while the engine does not answer)."""
        theirs = b""
        try:
            status, content, _ = await self.upstream.fetch("GET", "/metrics")
            theirs = content if status == 200 else b""
        except BridgeError:
            pass
        return Response(self.metrics.render() + theirs, media_type=CONTENT_TYPE)

    # --- the bridge itself ---

    async def health(self, request: Request) -> Response:
        model = self.catalog.model
        return JSONResponse({"status": "ok", "model": model.name if model else None,
                             "context_window": model.context_window if model else None})  # fmt: skip

    async def root(self, request: Request) -> Response:
        return Response(b"", 200)  # Claude Code's warm-up is a HEAD /

    def routes(self) -> list[Route]:
        return [
            Route("/", self.root, methods=["GET", "HEAD"]),
            Route("/health", self.health, methods=["GET", "HEAD"]),
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.relay, methods=["POST"]),
            Route("/v1/completions", self.relay, methods=["POST"]),
            Route("/tokenize", self.relay, methods=["POST"]),
            Route("/detokenize", self.relay, methods=["POST"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]


class Accounting:
    """ASGI middleware: one trace line and one metrics update per request, whatever its outcome.

    Handlers fill `scope["state"]["trace"]` (model, tokens, TTFT, stop reason, error type).
    """

    def __init__(self, app: ASGIApp, bridge: Bridge) -> None:
        self.app = app
        self.bridge = bridge
        self.routes = frozenset(route.path for route in bridge.routes())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        trace: dict[str, Any] = {}
        scope.setdefault("state", {})["trace"] = trace
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.account(scope, trace, status, time.monotonic() - started)

    def account(self, scope: Scope, trace: dict[str, Any], status: int, duration: float) -> None:
        path = scope["path"]
        route = path if path in self.routes else ("/v1/models/{id}" if path.startswith("/v1/models/") else "other")
        status = status or (499 if trace.get("stop") == "client_gone" else 500)
        problem = trace.get("error_type") or (error_type(status) if status >= 400 else "")
        key = scope["state"].get("key", "-")
        metrics = self.bridge.metrics
        metrics.count_request(route, status, problem, key)
        metrics.count_tokens(key, trace.get("input", 0), trace.get("cached", 0), trace.get("output", 0))
        if "ttft_s" in trace:
            metrics.ttft.observe(trace["ttft_s"])
        if route not in QUIET_ROUTES:
            client_id = Headers(scope=scope).get("x-request-id")
            log.info(trace_line(scope["method"], route, status, key, duration, trace, client_id))


def trace_line(
    method: str, route: str, status: int, key: str, duration: float, trace: dict[str, Any], client_id: str | None = None
) -> str:
    """`trace id=… POST /v1/messages 200 key=… model=… in=… … dur_ms=… stop=… client_id=…`: `id` is the
    bridge's own; what the client chose (model, its x-request-id, prompt) is escaped and capped (`loggable`)."""
    fields = [f"trace id={trace.get('id', '-')} {loggable(method)} {route} {status} key={key}"]
    if "model" in trace:
        fields.append(f"model={loggable(trace['model'])}")
    for name in ("stream", "input", "cached", "output"):
        if name in trace:
            fields.append(f"{name.replace('input', 'in').replace('output', 'out')}={trace[name]}")
    if "ttft_s" in trace:
        fields.append(f"ttft_ms={trace['ttft_s'] * 1000:.0f}")
    fields.append(f"dur_ms={duration * 1000:.0f}")
    for name in ("stop", "error_type"):
        if trace.get(name):
            fields.append(f"{name.replace('_type', '')}={trace[name]}")
    if client_id is not None:
        fields.append(f"client_id={loggable(client_id)}")
    if "prompt" in trace:
        fields.append(f"prompt={loggable(trace['prompt'], PROMPT_CHARS)}")
    return " ".join(fields)


async def bridge_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, BridgeError)
    request.state.trace["error_type"] = error.type
    return error.response()


async def http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    messages = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    return BridgeError(error.status_code, messages.get(error.status_code, str(error.detail))).response()


async def internal_error(request: Request, error: Exception) -> Response:
    log.exception("internal error on %s %s", loggable(request.method), loggable(request.url.path), exc_info=error)
    return internal_failure().response()


def create_app(bridge: Bridge) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        watcher = asyncio.create_task(bridge.catalog.watch(bridge.upstream))
        try:
            yield
        finally:
            watcher.cancel()
            await bridge.upstream.aclose()

    return Starlette(
        routes=bridge.routes(),
        middleware=[
            Middleware(Accounting, bridge=bridge),
            Middleware(RequireKey, keys=bridge.keys, hosts=bridge.hosts),
            Middleware(KeyShare, cap=bridge.key_concurrency),
        ],
        exception_handlers={BridgeError: bridge_error, HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
