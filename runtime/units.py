"""Quantities as people read them. Standard library only: the build side (space/deps.py) shares it with
the pod (runtime/engine/weights.py) without importing anything else of the runtime."""

from __future__ import annotations


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"
