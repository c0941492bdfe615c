"""The bridge's accounting: one trace line and one metrics update per request, whatever its outcome,
and for a generation, who asked (key, Claude Code session, agent, request class) and what it spent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.bridge.answer import GONE
from runtime.bridge.auth import GATEWAY_LABEL, SELFCHECK_LABEL
from runtime.bridge.errors import error_type
from runtime.bridge.metrics import Metrics
from runtime.bridge.sessions import Asker, BusyTime, Sessions
from runtime.bridge.trace import Trace
from runtime.bridge.upstream import ROUTED_PATHS
from runtime.bridge.usage import Spent, Usage
from runtime.logsafe import PROMPT_CHARS, loggable
from runtime.state.activity import Activity

log = logging.getLogger("runtime.bridge")

# Polled often, or probes anyone may send (Claude Code's /, /api/hello): no trace line, not the traffic counted.
QUIET_ROUTES = frozenset({"/health", "/metrics", "/", "/api/hello", "/console", "/v1/pod/status"})
UNIDENTIFIED = "-"  # the label of a request refused before its key was known
CLIENT_GONE = 499  # nginx's status for a client that left before any answer
REFUSALS_EVERY_S = 60.0  # one line a minute at most, whatever strangers send
GENERATIONS = frozenset({"/v1/messages", *ROUTED_PATHS})  # what keeps the engine busy, and is charged for it


class Accounting:
    """ASGI middleware: one trace line and one metrics update per request, whatever its outcome.

    Handlers fill `scope["state"]["trace"]`, a `Trace` (model, tokens, TTFT, stop reason, error type).
    """

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        usage: Usage,
        sessions: Sessions,
        routes: frozenset[str],
        activity: Activity | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.usage = usage
        self.sessions = sessions
        self.busy = BusyTime()
        self.refusals = Refusals()
        self.routes = routes
        self.activity = activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        trace = Trace()
        scope.setdefault("state", {})["trace"] = trace
        status = 0
        serving: Activity | None = None  # set once a known key's answer starts: what idleness is measured by
        generation = scope["path"] in GENERATIONS
        busy_since = self.busy.begin() if generation else 0.0

        def sending(message: Message) -> Awaitable[None]:  # `send`'s own awaitable: no coroutine more per write
            nonlocal status, serving
            if message["type"] == "http.response.start":
                status = message["status"]
                if self.activity is not None and self.served_a_client(scope):
                    serving = self.activity
                    serving.began()
            return send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if serving is not None:
                serving.ended()
            busy_s = self.busy.end(busy_since) if generation else 0.0
            self.account(scope, trace, status, time.monotonic() - started, busy_s)

    @staticmethod
    def served_a_client(scope: Scope) -> bool:
        """A request that keeps a pod busy: not the pod's own polling or checks, not its gateway's discovery
        (nobody asked for it), nor a stranger refused at the door."""
        path, key = scope["path"], scope["state"].get("key", UNIDENTIFIED)
        if path in QUIET_ROUTES or key in (UNIDENTIFIED, SELFCHECK_LABEL):
            return False
        # The gateway asks for /v1/models every 30 s on its own: that kept a team's first worker from ever idling.
        return not (key == GATEWAY_LABEL and (path == "/v1/models" or path.startswith("/v1/models/")))

    def account(self, scope: Scope, trace: Trace, status: int, duration: float, busy_s: float) -> None:
        path = scope["path"]
        route = path if path in self.routes else ("/v1/models/{id}" if path.startswith("/v1/models/") else "other")
        status = status or (CLIENT_GONE if trace.stop == GONE else 500)
        problem = trace.error_type or (error_type(status) if status >= 400 else "")
        key = scope["state"].get("key", UNIDENTIFIED)
        metrics = self.metrics
        tokens = trace.input, trace.cached, trace.output
        metrics.count_request(route, status, problem, key)
        metrics.count_tokens(key, *tokens)
        ttft_s = trace.ttft_s
        if ttft_s is not None:
            metrics.ttft.observe(ttft_s)
        if route in QUIET_ROUTES:
            return
        if key == UNIDENTIFIED and not self.refusals.first(status, problem):
            return  # a stranger's refusal: counted, and said in the next summary line
        headers = header_values(scope)
        asker = None
        if key != UNIDENTIFIED:
            spent = Spent(*tokens, ttft_s, busy_s, trace.cache_miss)
            self.usage.count(key, status >= 400 and status != CLIENT_GONE, spent)  # a client that left: no failure
            if route in GENERATIONS:
                asker = Asker.of(headers, key)
                self.sessions.count(asker, spent)
                metrics.count_class(asker.request_class, key, *tokens)
                metrics.count_hints(asker.first_party_class, asker.auxiliary_type)
        log.info(trace_line(scope["method"], route, status, key, duration, trace, headers.get("x-request-id"), asker))


def header_values(scope: Scope) -> dict[str, str]:
    """The request's headers by name (lower case in ASGI), the first of each as Starlette's `Headers` reads
    them: decoded in one pass, so that the trace line and `Asker` look each up at once."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in reversed(scope["headers"])}


class Refusals:
    """Requests refused before their key was known (no key, a wrong one, a bad head): the first of each
    REFUSALS_EVERY_S is traced, the others counted and said in one line at its end. Strangers sent 150
    in 0.22 s and filled the Hub log's bridge section with their trace lines."""

    def __init__(self, every_s: float = REFUSALS_EVERY_S) -> None:
        self.every_s = every_s
        self.counts: Counter[tuple[int, str]] = Counter()
        self.summary: asyncio.TimerHandle | None = None

    def first(self, status: int, problem: str) -> bool:
        """Count a refusal; True for the first of the interval (traced as any request is)."""
        if self.summary is None:
            self.summary = asyncio.get_running_loop().call_later(self.every_s, self.say)
            return True
        self.counts[(status, problem)] += 1
        return False

    def say(self) -> None:
        self.summary = None
        if self.counts:
            parts = ", ".join(f"{count} x {status} {problem}" for (status, problem), count in self.counts.most_common())
            log.info(
                "refused %d more requests without a valid key in %g s: %s", self.counts.total(), self.every_s, parts
            )
            self.counts.clear()


def trace_line(
    method: str,
    route: str,
    status: int,
    key: str,
    duration: float,
    trace: Trace,
    client_id: str | None = None,
    asker: Asker | None = None,
) -> str:
    """`trace id=… POST /v1/messages 200 key=… session=… agent=… class=… model=… in=… … dur_ms=… stop=…
    client_id=…`: `id` is the bridge's own; what the client chose (model, its x-request-id, prompt) is
    escaped and capped (`loggable`), its session and agent ids cleaned (`sessions.client_id`)."""
    fields = [f"trace id={trace.id} {loggable(method)} {route} {status} key={key}"]
    if asker is not None and asker.session is not None:
        fields.append(f"session={asker.session} agent={asker.agent} class={asker.request_class}")
        hints = (("1p", asker.first_party_class), ("auxiliary", asker.auxiliary_type))
        fields += [f"{name}={value}" for name, value in hints if value != "none"]  # bounded words, never the client's
    if trace.model is not None:
        fields.append(f"model={loggable(trace.model)}")
    if trace.stream is not None:
        fields.append(f"stream={trace.stream}")
    if trace.tokens_counted:
        fields.append(f"in={trace.input} cached={trace.cached} out={trace.output}")
    if trace.ttft_s is not None:
        fields.append(f"ttft_ms={trace.ttft_s * 1000:.0f}")
    if trace.swap_wait_s is not None:  # VL_SWAP: how long it waited for its model to be loaded
        fields.append(f"swap_wait_ms={trace.swap_wait_s * 1000:.0f}")
    fields.append(f"dur_ms={duration * 1000:.0f}")
    for name, value in (
        ("stop", trace.stop),
        ("error", trace.error_type),
        ("guard", trace.guard),
        ("miss", trace.cache_miss),
    ):
        if value:
            fields.append(f"{name}={value}")
    if client_id is not None:
        fields.append(f"client_id={loggable(client_id)}")
    if trace.prompt is not None:
        fields.append(f"prompt={loggable(trace.prompt, PROMPT_CHARS)}")
    return " ".join(fields)
