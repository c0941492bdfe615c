"""The pod's commit rate to the Hub: how often it may commit its log there.

The Hub refuses more than 128 commits per hour and per repo on a free account, and pods may share a log
repo: one pod publishing every 25 s would alone spend 144 an hour. The default follows a boot at the full
25 s cadence for its first ~6 minutes (a burst of 10), then one commit every 72 s: never more than 60 in
any hour, so two pods sharing a repo stay under the Hub's limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.ratelimit import RateLimit

BURST = 10
PER_HOUR = 50


def commit_rate(clock: Callable[[], float] = time.monotonic) -> RateLimit:
    """The Hub's limit on the pod's commits: BURST at once, then PER_HOUR an hour."""
    return RateLimit(BURST, 3600 / PER_HOUR, clock)
