"""Usage as the console shows it: the traffic of the last minutes, and each key's totals since a date
(the ledger's, across restarts; else this start's).

Fed by `Accounting` once per finished request (never per token): one tuple appended, one entry updated.
Keys appear by their label (a name or a salted hash, see `auth`), never as the key.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, NamedTuple

from runtime.units import utc_now

WINDOW_S = 300  # "the last minutes": long enough for a steady rate, short enough to follow a change


class Finished(NamedTuple):
    at: float
    prompt: int  # input and cached together: what the prefix cache could have served
    cached: int
    output: int
    ttft_s: float | None


@dataclass
class Spent:
    """What one request consumed: tokens as Anthropic counts them (input excludes cached), its time to
    first token, and its share of the engine's busy time (`sessions.BusyTime`)."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    busy_s: float = 0.0
    cache_miss: str | None = None  # why its prompt missed the cache (runtime.bridge.cachemiss), when it did


@dataclass
class KeyUsage:
    name: str
    since: str  # when this key was first counted (ISO 8601, UTC): the ledger's date, or this start's
    requests: int = 0
    input_tokens: int = 0  # without the cached ones, as Anthropic counts
    cached_tokens: int = 0
    output_tokens: int = 0
    errors: int = 0
    busy_s: float = 0.0  # its share of the engine's busy time: what VL_COST_PER_HOUR charges it

    def add(self, other: KeyUsage) -> None:
        for count in COUNTS:
            setattr(self, count, getattr(self, count) + getattr(other, count))


COUNTS = tuple(f.name for f in fields(KeyUsage) if f.name not in ("name", "since"))
Recorder = Callable[[str, str, KeyUsage], None]  # (key, since, one request's usage): the ledger's `record`…


def cost_of(busy_s: float, per_hour: float | None) -> float | None:
    """What a share of the engine's busy time cost at VL_COST_PER_HOUR; None when no price is set."""
    return None if per_hour is None else round(busy_s * per_hour / 3600, 6)


class Usage:
    """Requests of the last `window_s`, and totals per key label (from `totals`, the ledger's, on)."""

    def __init__(
        self,
        window_s: int = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        totals: dict[str, KeyUsage] | None = None,
        recorders: Sequence[Recorder] = (),
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self.started = clock()
        self.recent: deque[Finished] = deque()
        self.keys: dict[str, KeyUsage] = dict(totals or {})
        self.recorders = recorders  # the ledger's, the budgets': each told of every finished request

    def count(self, key: str, failed: bool, spent: Spent) -> None:
        now = self.clock()
        self.recent.append(
            Finished(
                now, spent.input_tokens + spent.cached_tokens, spent.cached_tokens, spent.output_tokens, spent.ttft_s
            )
        )
        self.forget(now)
        usage = self.keys.get(key) or self.keys.setdefault(key, KeyUsage(key, utc_now()))
        one = KeyUsage(
            key, usage.since, 1, spent.input_tokens, spent.cached_tokens, spent.output_tokens, int(failed), spent.busy_s
        )
        usage.add(one)
        for record in self.recorders:
            record(key, usage.since, one)

    def forget(self, now: float) -> None:
        while self.recent and self.recent[0].at < now - self.window_s:
            self.recent.popleft()

    def uptime_s(self) -> float:
        return self.clock() - self.started

    def traffic(self) -> dict[str, Any]:
        """Rates over the window (over the time since the start while that is shorter), TTFT percentiles
        and the prefix cache's share of prompt tokens; None where nothing was measured."""
        now = self.clock()
        self.forget(now)
        span = max(1.0, min(float(self.window_s), now - self.started))
        prompt = sum(done.prompt for done in self.recent)
        cached = sum(done.cached for done in self.recent)
        ttfts = sorted(done.ttft_s for done in self.recent if done.ttft_s is not None)
        return {
            "requests_per_min": round(len(self.recent) * 60 / span, 3),
            "output_tokens_per_s": round(sum(done.output for done in self.recent) / span, 3),
            "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p95_s": percentile(ttfts, 95),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "prefix_cache_hit_rate": round(cached / prompt, 4) if prompt else None,
            "window_s": self.window_s,
        }

    def per_key(self, cost_per_hour: float | None = None) -> list[dict[str, Any]]:
        """Each key's totals, and what its share of the engine's busy time cost at `cost_per_hour`."""
        return [key_row(usage, cost_per_hour) for _, usage in sorted(self.keys.items())]


def key_row(usage: KeyUsage, cost_per_hour: float | None) -> dict[str, Any]:
    """A key's totals as the console and `runtime status` show them."""
    return asdict(usage) | {"busy_s": round(usage.busy_s, 3), "cost": cost_of(usage.busy_s, cost_per_hour)}


def percentile(ordered: list[float], pct: int) -> float | None:
    """The `pct`th percentile of sorted values (interpolated; the value itself when there is one)."""
    if len(ordered) < 2:
        return round(ordered[0], 4) if ordered else None
    return round(statistics.quantiles(ordered, n=100, method="inclusive")[pct - 1], 4)
