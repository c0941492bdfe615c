"""Each key's budgets (runtime.budget): what it spent in the current period, told to Claude Code on each answer with
the `anthropic-ratelimit-unified-*` headers of its gateway contract, and past it a `429 billing_error` before any work.

The spend per key and UTC day comes from the ledger at start (a restart forgets nothing) and from each finished
request after; a request begun within the budget is answered whole. Requests in flight hold their worst case in
tokens (the prompt's estimate and `max_tokens`) until they are settled: a key whose token budget is held whole waits
(429, retried soon), so N requests at once end within the budget and one request's worth.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.bridge.accounting import GENERATIONS
from runtime.bridge.errors import BILLING_ERROR, BridgeError
from runtime.bridge.ledger import Buckets, Day, day_of, merge
from runtime.bridge.usage import KeyUsage, cost_of
from runtime.budget import PERIODS, Budget
from runtime.settings import ApiKey
from runtime.units import UTC_STAMP

HEADER = "anthropic-ratelimit-unified-"
# Once past each, a client signed in to a gateway says "You've used NN% of your usage credits".
THRESHOLDS = (0.95, 0.75)
DISABLED_REASON = "org_spend_cap_reached"  # the contract's word for a cap its gateway sets per user
BYTES_PER_TOKEN = 4  # a prompt's tokens, estimated from its body's size (code and English: ~4 bytes a token)
UNSTATED_MAX_TOKENS = 32_768  # a relayed request without max_tokens may generate up to the window: held as this
HELD_RETRY_S = 2  # a key whose budget is held by its requests in flight asks again once one of them is settled


@dataclass(frozen=True)
class Standing:
    """A key against one of its budgets, now: what it spent in the period, and when the period ends."""

    budget: Budget
    spent: float
    resets: datetime

    @property
    def utilization(self) -> float:
        return self.spent / self.budget.limit

    @property
    def spent_out(self) -> bool:
        return self.spent >= self.budget.limit

    def view(self) -> dict[str, Any]:
        """As the console and `runtime status` show it."""
        return {
            "budget": str(self.budget),
            "unit": self.budget.unit,
            "period": self.budget.period,
            "limit": self.budget.limit,
            "spent": round(self.spent, 6 if self.budget.unit == "usd" else 0),
            "utilization": round(self.utilization, 4),
            "resets_at": self.resets.strftime(UTC_STAMP),
        }


def described(standings: Sequence[Standing]) -> Standing:
    """The standing a client is told of: once blocked, the budget that frees it last; else the fullest one (the
    contract's rule for several caps)."""
    blocked = [standing for standing in standings if standing.spent_out]
    if blocked:
        return max(blocked, key=lambda standing: standing.resets)
    return max(standings, key=lambda standing: standing.utilization)


def allowed_headers(standing: Standing) -> list[tuple[bytes, bytes]]:
    """The headers of an answer within the budget: Claude Code's notice comes with `overage-surpassed-threshold`."""
    utilization = min(math.floor(standing.utilization * 100) / 100, 0.99)  # two decimals, below 1 while allowed
    passed = next((threshold for threshold in THRESHOLDS if standing.utilization > threshold), None)
    status = "allowed" if passed is None else "allowed_warning"
    reset = str(int(standing.resets.timestamp()))
    headers = {
        "status": status,
        "representative-claim": "overage",  # window-agnostic: `5h`/`7d` are rolling windows the client times itself
        "overage-status": status,
        "overage-utilization": f"{utilization:.2f}",
        "reset": reset,
        "overage-reset": reset,
    }
    if passed is not None:
        headers["overage-surpassed-threshold"] = f"{passed:.2f}"
    return [(f"{HEADER}{name}".encode(), value.encode()) for name, value in headers.items()]


def refusal(key: str, standing: Standing, now: datetime) -> tuple[BridgeError, dict[str, str]]:
    """The 429 past a budget, and its headers: without `representative-claim` and `overage-status`, Claude Code
    prints the message as it is, so it says when the budget is whole again and what to do."""
    wait_s = max(1, math.ceil((standing.resets - now).total_seconds()))
    hours, minutes = divmod(math.ceil(wait_s / 60), 60)
    spent = f"${standing.spent:,.2f}" if standing.budget.unit == "usd" else f"{standing.spent:,.0f} tokens"
    message = (
        f"{key}'s budget of {standing.budget} is spent ({spent}) \xb7 resets "
        f"{standing.resets:%b} {standing.resets.day}, 00:00 UTC (in {hours} h {minutes} min) \xb7 "
        "ask the pod's admin to raise it (VL_API_KEYS)"
    )
    reset = str(int(standing.resets.timestamp()))
    headers = {  # `retry-after` and `x-should-retry: false` are the billing error's own (BridgeError.headers)
        f"{HEADER}status": "rejected",
        f"{HEADER}reset": reset,
        f"{HEADER}overage-reset": reset,
        f"{HEADER}overage-utilization": "1",
        f"{HEADER}overage-surpassed-threshold": "1",
        f"{HEADER}overage-period": PERIODS[standing.budget.period],
        f"{HEADER}overage-disabled-reason": DISABLED_REASON,
    }
    return BridgeError(429, message, wait_s, kind=BILLING_ERROR), headers


class Asked(msgspec.Struct):
    """The part of a generation's body that bounds its output (Anthropic's and OpenAI's names)."""

    max_tokens: int | None = None
    max_completion_tokens: int | None = None


def worst_case(body: bytes) -> int:
    """The tokens a request may cost at most: its prompt's estimate (none of it read from the cache) and all it
    may generate; a body that is no request is held for its prompt alone (it is refused before any work)."""
    try:
        asked = msgspec.json.decode(body, type=Asked)
    except msgspec.MsgspecError:
        return len(body) // BYTES_PER_TOKEN
    output = asked.max_tokens or asked.max_completion_tokens or UNSTATED_MAX_TOKENS
    return len(body) // BYTES_PER_TOKEN + max(0, output)


def held_whole(key: str, standings: Sequence[Standing], held: int) -> BridgeError | None:
    """The 429 for a key whose token budget its requests in flight hold whole (their worst case), or None."""
    for standing in standings:
        if standing.budget.unit == "tokens" and held and standing.spent + held >= standing.budget.limit:
            return BridgeError(
                429,
                f"{key}'s budget of {standing.budget} is held by its requests in flight (their worst case, "
                f"{held:,} tokens, over the {standing.budget.limit - standing.spent:,.0f} left): "
                "asked again once one is done",
                HELD_RETRY_S,
            )
    return None


class Budgets:
    """The keys' budgets, and each budgeted key's spend per UTC day of the longest period it has (the ledger's
    days at start, `record`'s after)."""

    def __init__(
        self,
        entries: Sequence[ApiKey],
        cost_per_hour: float | None,
        days: Buckets | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.budgets = {entry.name: entry.budgets for entry in entries if entry.name and entry.budgets}
        self.cost_per_hour = cost_per_hour  # the settings refuse a dollar budget without a price
        self.clock = clock
        self.days: dict[str, dict[Day, KeyUsage]] = {name: {} for name in self.budgets}
        self.held: Counter[str] = Counter()  # tokens each key's requests in flight may still cost at most
        for (name, day), usage in (days or {}).items():
            if name in self.days:
                merge(self.days[name], day, usage)
        now = clock()
        for name in self.days:
            self.forget(name, now)

    def __bool__(self) -> bool:
        return bool(self.budgets)

    def record(self, key: str, since: str, one: KeyUsage) -> None:
        """Count one finished request of `key` on today's spend (a `usage.Recorder`)."""
        spent = self.days.get(key)
        if spent is None:
            return
        now = self.clock()
        today = day_of(now)
        if today not in spent:
            self.forget(key, now)
        merge(spent, today, one)

    def forget(self, key: str, now: datetime) -> None:
        """Drop the days before the start of `key`'s longest period (the ledger keeps them)."""
        first = day_of(min(budget.began(now) for budget in self.budgets[key]))
        for day in [day for day in self.days[key] if day < first]:
            del self.days[key][day]

    def spent(self, usage: KeyUsage, unit: str) -> float:
        """Tokens the engine computed (cached reads left out), or dollars of busy time."""
        if unit == "usd":
            return cost_of(usage.busy_s, self.cost_per_hour) or 0.0
        return usage.input_tokens + usage.output_tokens

    def standings(self, key: str, now: datetime | None = None) -> list[Standing]:
        """`key` against each of its budgets (none for a key without)."""
        now = now or self.clock()
        days = self.days.get(key, {})
        standings = []
        for budget in self.budgets.get(key, ()):
            first = day_of(budget.began(now))
            spent = sum(self.spent(usage, budget.unit) for day, usage in days.items() if day >= first)
            standings.append(Standing(budget, spent, budget.resets(now)))
        return standings

    def views(self) -> Mapping[str, list[dict[str, Any]]]:
        """Each budgeted key's standings, as the console shows them."""
        now = self.clock()
        return {key: [standing.view() for standing in self.standings(key, now)] for key in self.budgets}


class BudgetGate:
    """ASGI middleware after the key is known: a key past a budget gets the 429 before any work; each successful
    Messages answer to a budgeted key carries its standing. Without budgets the app has no BudgetGate at all."""

    def __init__(self, app: ASGIApp, budgets: Budgets, max_body: int) -> None:
        self.app = app
        self.budgets = budgets
        self.max_body = max_body  # a body past it is read no further here: the route answers its 413

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATIONS or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        key = scope["state"]["key"]
        now = self.budgets.clock()
        standings = self.budgets.standings(key, now)
        if not standings:
            await self.app(scope, receive, send)
            return
        standing = described(standings)
        if standing.spent_out:
            error, headers = refusal(key, standing, now)
            scope["state"]["trace"].error_type = error.type
            await error.response(headers)(scope, receive, send)
            return
        body, receive = await buffered(receive, self.max_body)
        worst = worst_case(body) if body is not None else 0
        held = held_whole(key, standings, self.budgets.held[key])
        if held is not None:
            scope["state"]["trace"].error_type = held.type
            await held.response()(scope, receive, send)
            return
        if scope["path"] == "/v1/messages":  # the contract's headers are for Claude Code's route
            send = telling(send, allowed_headers(standing))
        self.budgets.held[key] += worst
        try:
            await self.app(scope, receive, send)
        finally:  # settled: the spend is recorded as this returns (the accounting's, with no await between)
            self.budgets.held[key] -= worst


def telling(send: Send, told: list[tuple[bytes, bytes]]) -> Send:
    """`send` with the budget's headers added to a successful answer's head."""

    def sending(message: Message) -> Any:
        if message["type"] == "http.response.start" and message["status"] == 200:
            message = {**message, "headers": [*message.get("headers", ()), *told]}
        return send(message)

    return sending


async def buffered(receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """The request's body (None past `limit` bytes, or when the client left), and a `receive` that gives the app
    every message read here again, then the rest."""
    read: list[Message] = []
    size, more = 0, True
    while more and size <= limit:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    whole = not more and size <= limit and read[-1]["type"] == "http.request"
    body = b"".join(message.get("body", b"") for message in read) if whole else None
    pending = iter(read)

    async def replaying() -> Message:
        return next(pending, None) or await receive()

    return body, replaying
