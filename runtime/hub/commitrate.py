"""The pod's commit rate to the Hub (a token bucket): how often it may commit its log there.

The Hub refuses more than 128 commits per hour and per repo on a free account, and pods may share a log
repo: one pod publishing every 25 s would alone spend 144 an hour. The default follows a boot at the full
25 s cadence for its first ~6 minutes (a burst of 10), then one commit every 72 s: never more than 60 in
any hour, so two pods sharing a repo stay under the Hub's limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BURST = 10
PER_HOUR = 50


class CommitRate:
    """At most `burst` commits at once, refilled at `per_hour` commits an hour."""

    def __init__(self, burst: int = BURST, per_hour: float = PER_HOUR, clock: Callable[[], float] = time.monotonic):
        self.burst, self.per_hour, self.clock = burst, per_hour, clock
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_hour / 3600)
        self._at = now

    def wait_s(self) -> float:
        """Seconds until a commit is allowed (0 when one is allowed now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) * 3600 / self.per_hour

    def spend(self) -> None:
        """Counts one commit made."""
        self._refill()
        self._tokens -= 1
