"""Quantities as people read them: sizes, durations, and moments as UTC stamps. Standard library only: the build
side (space/deps.py) shares it with the pod (runtime/engine/weights.py) without importing anything else of it."""

from __future__ import annotations

from datetime import UTC, datetime

UTC_STAMP = "%Y-%m-%dT%H:%M:%SZ"  # a moment as logs, the console and the state files write it


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def human_seconds(seconds: float) -> str:
    """An elapsed time as it is: `36 s`, `4 min 05 s`, `2 h 03 min`; cut down, never rounded up to a minute
    not yet spent (`pod up` said "not serving after 1 min" after 36 s)."""
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def utc_now() -> str:
    """Now as a UTC stamp (UTC_STAMP): the same on every machine, sortable as text."""
    return datetime.now(UTC).strftime(UTC_STAMP)
