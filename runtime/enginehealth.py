"""The engines' health as the supervisor last saw it (VL_REPLICAS > 1), in one small file of VL_STATE_DIR:
the bridge's `/health` says "degraded" from it without asking an engine anything (the watchdog's check
must never wait on an engine), and the image's HEALTHCHECK prints what `/health` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.statefile import read_json, write_json
from runtime.swap import ENGINE_UP

FILE = "engines.health.json"
SERVING_CONDITIONS = ("ok", "degraded", "swapping")  # what /health says of a pod that answers (a swap: in a while)


def write_engine_health(state_dir: Path, healthy: Mapping[str, bool]) -> None:
    """Replace the file at once (readers never see half of it): each engine's name and whether it serves."""
    write_json(state_dir / FILE, {name: "healthy" if ok else "down" for name, ok in healthy.items()})


def forget_engine_health(state_dir: Path) -> None:
    """No file: one engine (or none known yet), never a previous start's verdict."""
    (state_dir / FILE).unlink(missing_ok=True)


def read_engine_health(state_dir: Path) -> dict[str, str] | None:
    """Each engine's state, or None when the pod has one engine (no file) or the file cannot be read."""
    states = read_json(state_dir / FILE)
    return {str(name): str(state) for name, state in states.items()} if isinstance(states, dict) else None


def pod_condition(states: Mapping[str, str] | None, serves: bool = True, swap: Mapping[str, Any] | None = None) -> str:
    """The pod in one word (CONDITIONS): "swapping" while its engine is down for a swap, "starting" while no model
    is served yet, "degraded" while some of its engines are down, else "ok"."""
    if swap is not None and swap.get("phase") not in ENGINE_UP:
        return "swapping"
    if not serves:
        return "starting"
    return "degraded" if states and any(state != "healthy" for state in states.values()) else "ok"
