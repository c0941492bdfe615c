"""Usage as the console shows it: the traffic of the last minutes, and each key's totals since the start.

Fed by `Accounting` once per finished request (never per token): one tuple appended, one entry updated.
Keys appear by their label (a name or a salted hash, see `auth`), never as the key.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

WINDOW_S = 300  # "the last minutes": long enough for a steady rate, short enough to follow a change


class Finished(NamedTuple):
    at: float
    prompt: int  # input and cached together: what the prefix cache could have served
    cached: int
    output: int
    ttft_s: float | None


@dataclass
class KeyUsage:
    name: str
    requests: int = 0
    input_tokens: int = 0  # without the cached ones, as Anthropic counts
    cached_tokens: int = 0
    output_tokens: int = 0
    errors: int = 0


class Usage:
    """Requests of the last `window_s`, and totals per key label."""

    def __init__(self, window_s: int = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self.started = clock()
        self.recent: deque[Finished] = deque()
        self.keys: dict[str, KeyUsage] = {}

    def count(self, key: str, failed: bool, input_tokens: int, cached: int, output: int, ttft_s: float | None) -> None:
        now = self.clock()
        self.recent.append(Finished(now, input_tokens + cached, cached, output, ttft_s))
        self.forget(now)
        usage = self.keys.get(key) or self.keys.setdefault(key, KeyUsage(key))
        usage.requests += 1
        usage.input_tokens += input_tokens
        usage.cached_tokens += cached
        usage.output_tokens += output
        usage.errors += failed

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

    def per_key(self) -> list[dict[str, Any]]:
        return [asdict(usage) for _, usage in sorted(self.keys.items())]


def percentile(ordered: list[float], pct: int) -> float | None:
    """The `pct`th percentile of sorted values (interpolated; the value itself when there is one)."""
    if len(ordered) < 2:
        return round(ordered[0], 4) if ordered else None
    return round(statistics.quantiles(ordered, n=100, method="inclusive")[pct - 1], 4)
