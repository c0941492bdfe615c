"""When a client of the pod was last served: the modification time of `<VL_STATE_DIR>/activity`, which
the bridge touches and the pod reads (VL_IDLE_STOP_MIN). A file, so that neither imports the other and
a restarted bridge or pod reads what the last one left."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

ACTIVITY_FILE = "activity"
TOUCH_S = 15.0  # while a request is in flight, how often it says so: a long generation is no idleness


def activity_file(state_dir: Path) -> Path:
    return state_dir / ACTIVITY_FILE


def last_activity(state_dir: Path) -> float | None:
    """The wall-clock time of the last request served (None: none yet)."""
    try:
        return activity_file(state_dir).stat().st_mtime
    except FileNotFoundError:
        return None


class Activity:
    """The bridge's side: a request of a known key began or ended; `keep_fresh` runs while it serves.
    One utime per request start and end: nothing next to a request's own cost."""

    def __init__(self, state_dir: Path) -> None:
        self.path = activity_file(state_dir)
        self.in_flight = 0

    def began(self) -> None:
        self.in_flight += 1
        self.touch()

    def ended(self) -> None:
        self.in_flight -= 1
        self.touch()

    def touch(self) -> None:
        with contextlib.suppress(OSError):  # a full or read-only disk must not fail a request
            self.path.touch()

    async def keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(TOUCH_S)  # a heartbeat, not a synchronisation: it marks long requests alive
            if self.in_flight:
                self.touch()
