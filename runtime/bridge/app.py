"""The bridge's Starlette application: its routes and middleware.

`/health` answers from the bridge alone (the supervisor's watchdog must not depend on the engine
or on the upstream pool: the seeds' bridge was restarted for a pool jammed by leaked streams).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.bridge.accounting import Accounting
from runtime.bridge.affinity import routing_headers
from runtime.bridge.auth import UNGUARDED_CALLER, RequireKey
from runtime.bridge.budgets import BudgetGate
from runtime.bridge.connection import read_body
from runtime.bridge.console import console
from runtime.bridge.enginemetrics import merged_metrics
from runtime.bridge.errors import BridgeError, internal_failure
from runtime.bridge.exchange import MessagesExchange, count_prompt
from runtime.bridge.metrics import CONTENT_TYPE
from runtime.bridge.nesting import refuse_deep_nesting
from runtime.bridge.podstatus import pod_status
from runtime.bridge.relay import Relay, rewrite_model
from runtime.bridge.schema import CountTokensRequest, MessagesRequest, decode
from runtime.bridge.sessions import Asker
from runtime.bridge.sharing import KeyShare
from runtime.bridge.state import Bridge
from runtime.bridge.translate import Translator
from runtime.bridge.upstream import ROUTED_PATHS
from runtime.logsafe import loggable
from runtime.state.benchreport import MAX_BYTES as BENCH_MAX_BYTES
from runtime.state.benchreport import BenchRefused, checked_report, keep_bench
from runtime.state.enginehealth import pod_condition, read_engine_health, read_engine_stopped
from runtime.state.selfcheck import checked, read_selfcheck

log = logging.getLogger("runtime.bridge")
SALTED_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})  # relayed, they read the prefix cache: salted
ENGINE_METRICS_S = 10.0  # a scrape waits this long for a busy engine's metrics, then goes without them


class Api:
    """The bridge's routes: each handler reads the shared `Bridge` state and answers one request."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    # --- Anthropic ---

    async def messages(self, request: Request) -> MessagesExchange:
        body = await read_body(request, self.bridge.max_body)
        parsed = decode(body, MessagesRequest)
        user_id = parsed.metadata.user_id if parsed.metadata else None
        serving = self.bridge.serving
        routing = routing_headers(
            request.headers, user_id, request.state.key, serving.data_parallel, serving.down_ranks()
        )
        caller = request.state.caller
        asker = Asker.of(request.headers, request.state.key)
        return MessagesExchange(
            self.bridge.serving, parsed, len(body), request.state.trace, routing, caller.cache_salt, caller.swaps, asker
        )

    async def count_tokens(self, request: Request) -> Response:
        parsed = decode(await read_body(request, self.bridge.max_body), CountTokensRequest)
        catalog = self.bridge.catalog
        await catalog.current(self.bridge.upstream)
        translation = Translator(catalog.traits).translate(parsed, catalog.upstream_name)
        count, _ = await count_prompt(self.bridge.upstream, translation)
        return JSONResponse({"input_tokens": count})

    async def models(self, request: Request) -> Any:
        """Anthropic's shape (with the context window) for Anthropic clients, vLLM's own otherwise."""
        if "anthropic-version" not in request.headers:
            return Relay(self.bridge.serving, request)
        await self.bridge.catalog.current(self.bridge.upstream)
        return JSONResponse(self.bridge.catalog.anthropic_listing())

    async def model(self, request: Request) -> Response:
        await self.bridge.catalog.current(self.bridge.upstream)
        return JSONResponse(self.bridge.catalog.anthropic_info(request.path_params["model_id"]))

    # --- OpenAI and vLLM, relayed ---

    async def relay(self, request: Request) -> Relay:
        salt = request.state.caller.cache_salt if request.url.path in SALTED_ROUTES else None
        body = await read_body(request, self.bridge.max_body)
        generation = request.url.path in ROUTED_PATHS
        return Relay(
            self.bridge.serving, request, rewrite_model(body, self.bridge.catalog.upstream_name, salt, generation)
        )

    async def prometheus(self, request: Request) -> Response:
        """The bridge's metrics, then each engine's (ours alone while none answers): an admin's to read, and on
        a worker its gateway's (whose own /metrics and capacity panel show them to the team's admin)."""
        if not (request.state.caller.admin or request.state.caller.reads_metrics):
            raise BridgeError(403, "/metrics shows every key's traffic: it takes an admin key (name:key:admin)")
        answers = await self.bridge.capacity.sample(self.bridge.upstream, ENGINE_METRICS_S)  # a sample too
        theirs = merged_metrics([body for _, body in answers])
        return Response(self.bridge.metrics.render() + theirs, media_type=CONTENT_TYPE)

    # --- the bridge itself ---

    async def health(self, request: Request) -> Response:
        """The pod's condition in one word for anyone (the watchdog, RunPod, `pod up`); its model, engines and swap
        only to a key's holder, or on an open pod: a stranger learns nothing it could time an attack by."""
        model = self.bridge.catalog.model
        engines = read_engine_health(self.bridge.state_dir)  # several engines: as the supervisor last saw them
        stopped = read_engine_stopped(self.bridge.state_dir)  # left stopped by their start limit, and why
        swap = self.bridge.swaps.view() if self.bridge.swaps is not None else None
        answer: dict[str, Any] = {"status": pod_condition(engines, model is not None, swap, stopped)}
        if request.state.caller is UNGUARDED_CALLER and not self.bridge.keys.open:
            return JSONResponse(answer)
        answer |= {
            "model": model.name if model else None,
            "context_window": model.context_window if model else None,
            "checked": checked(read_selfcheck(self.bridge.state_dir)),
        }
        extras = {"engines": engines, "stopped": stopped, "swap": swap}
        return JSONResponse(answer | {name: value for name, value in extras.items() if value})

    async def status(self, request: Request) -> Response:
        return JSONResponse(await pod_status(self.bridge, request.state.caller))

    async def keep_bench(self, request: Request) -> Response:
        """`runtime bench`'s report, kept (on the volume) for the console and `runtime status`: an admin's to send."""
        if not request.state.caller.admin:
            raise BridgeError(403, "the pod keeps a bench report sent with an admin key (name:key:admin)")
        body = await read_body(request, BENCH_MAX_BYTES, f"a bench report's limit of {BENCH_MAX_BYTES // 2**10} KiB")
        refuse_deep_nesting(body)
        try:
            report = checked_report(json.loads(body))
        except BenchRefused as refused:
            raise BridgeError(400, str(refused)) from None
        except ValueError:
            raise BridgeError(400, "the body is not JSON: send the report `runtime bench --json` prints") from None
        await asyncio.to_thread(keep_bench, self.bridge.bench_folder, report)
        return Response(status_code=204)

    async def hello(self, request: Request) -> Response:
        return Response(b"", 200)  # Claude Code's connection probes, before any key is read: HEAD / and /api/hello

    def routes(self) -> list[Route]:
        """Matched in order, one pattern at a time: the generations first, they are the traffic."""
        return [
            Route("/v1/messages", self.messages, methods=["POST"]),
            Route("/v1/chat/completions", self.relay, methods=["POST"]),
            Route("/v1/completions", self.relay, methods=["POST"]),
            Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
            Route("/", self.hello, methods=["GET", "HEAD"]),
            Route("/api/hello", self.hello, methods=["GET", "HEAD"]),
            Route("/health", self.health, methods=["GET", "HEAD"]),
            Route("/console", console, methods=["GET", "HEAD"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/tokenize", self.relay, methods=["POST"]),
            Route("/detokenize", self.relay, methods=["POST"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
            Route("/v1/pod/status", self.status, methods=["GET"]),
            Route("/v1/pod/bench", self.keep_bench, methods=["PUT"]),
        ]


async def bridge_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, BridgeError)
    request.state.trace.error_type = error.type
    return error.response()


async def http_error(request: Request, error: Exception) -> Response:
    """A path we do not route: under /v1/, an API of Anthropic's this pod does not serve (batches, files...): 501
    `not_supported`, which the client does not retry; elsewhere 404."""
    assert isinstance(error, HTTPException)
    path = request.url.path
    if error.status_code == 404 and path.startswith("/v1/"):
        served = "it serves /v1/messages, /v1/messages/count_tokens and /v1/models"
        return BridgeError(501, f"{request.method} {path} is not served by this pod: {served}").response()
    messages = {404: f"no route {path}", 405: f"{request.method} is not allowed on {path}"}
    return BridgeError(error.status_code, messages.get(error.status_code, str(error.detail))).response()


async def internal_error(request: Request, error: Exception) -> Response:
    log.exception("internal error on %s %s", loggable(request.method), loggable(request.url.path), exc_info=error)
    return internal_failure().response()


def create_app(bridge: Bridge) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        watcher = asyncio.create_task(bridge.catalog.watch(bridge.upstream))
        sampler = asyncio.create_task(bridge.telemetry.run())  # the one task that asks nvidia-smi
        heartbeat = asyncio.create_task(bridge.activity.keep_fresh()) if bridge.activity else None
        writer = asyncio.create_task(bridge.ledger.keep_writing()) if bridge.ledger else None
        capacity = asyncio.create_task(bridge.capacity.keep_sampling(bridge.upstream, ENGINE_METRICS_S))
        try:
            yield
        finally:
            for task in (watcher, sampler, heartbeat, writer, capacity):
                if task is not None:
                    task.cancel()
            if writer is not None:
                await asyncio.gather(writer, return_exceptions=True)  # it writes what is left as it ends
            await bridge.upstream.aclose()

    routes = Api(bridge).routes()
    accounting = Middleware(
        Accounting,
        metrics=bridge.metrics,
        usage=bridge.usage,
        sessions=bridge.sessions,
        routes=frozenset(route.path for route in routes),
        activity=bridge.activity,
    )
    # Without a cap (one key or none), no KeyShare: it would only pass every request on.
    sharing = [Middleware(KeyShare, cap=bridge.key_concurrency)] if bridge.key_concurrency is not None else []
    budgets = (
        [Middleware(BudgetGate, budgets=bridge.budgets, max_body=bridge.max_body)] if bridge.budgets else []
    )  # refused before sharing
    return Starlette(
        routes=routes,
        middleware=[accounting, Middleware(RequireKey, keys=bridge.keys, hosts=bridge.hosts), *budgets, *sharing],
        exception_handlers={BridgeError: bridge_error, HTTPException: http_error, Exception: internal_error},
        lifespan=lifespan,
    )
