"""How often something may happen: at most `burst` at once, then one every `every_s` (a leaky bucket). Standard
library only. The pod's commits to the Hub (runtime.hub.commitrate) and the desktop's wrong passwords
(runtime.pod.desktop_gate) are each held to one."""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimit:
    """Each one spent fills the bucket by one; it drains by one every `every_s`. One may be spent while fewer
    than `burst` are in it."""

    def __init__(self, burst: int, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.every_s, self.clock = burst, every_s, clock
        self._level, self._at = 0.0, clock()

    def level(self) -> float:
        """How many spent are not yet forgiven, now."""
        now = self.clock()
        self._level, self._at = max(0.0, self._level - (now - self._at) / self.every_s), now
        return self._level

    def wait_s(self) -> float:
        """0 when one may be spent now; else the seconds until one may."""
        return max(0.0, (self.level() - (self.burst - 1)) * self.every_s)

    def spend(self) -> None:
        """Counts one spent (past the limit too: a refused password still counts)."""
        self._level = self.level() + 1
