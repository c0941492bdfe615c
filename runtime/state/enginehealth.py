"""The engines' health as the supervisor last saw it (VL_REPLICAS > 1), and the engines it left stopped (their
start limit: a sick host, a setting vLLM cannot take), in two small files of VL_STATE_DIR: the bridge's `/health`
says "degraded" or "stopped" from them without asking an engine anything (the watchdog's check must never wait on
an engine), and the image's HEALTHCHECK prints what `/health` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.state.statefile import read_json, write_json
from runtime.state.swap import ENGINE_UP

FILE = "engines.health.json"
STOPPED_FILE = "engines.stopped.json"  # {engine: why it is left stopped}
SERVING_CONDITIONS = ("ok", "degraded", "swapping")  # what /health says of a pod that answers (a swap: in a while)


def write_engine_health(state_dir: Path, healthy: Mapping[str, bool]) -> None:
    """Replace the file at once (readers never see half of it): each engine's name and whether it serves."""
    write_json(state_dir / FILE, {name: "healthy" if ok else "down" for name, ok in healthy.items()})


def forget_engine_health(state_dir: Path) -> None:
    """No files: one engine (or none known yet), none stopped; never a previous start's verdict."""
    (state_dir / FILE).unlink(missing_ok=True)
    (state_dir / STOPPED_FILE).unlink(missing_ok=True)


def write_engine_stopped(state_dir: Path, name: str, why: str | None) -> None:
    """The supervisor left `name` stopped, for `why` (its one line); None: it is launched again."""
    stopped = read_engine_stopped(state_dir) or {}
    if why is None and name not in stopped:
        return
    stopped = {other: line for other, line in stopped.items() if other != name} | ({name: why} if why else {})
    if stopped:
        write_json(state_dir / STOPPED_FILE, stopped)
    else:
        (state_dir / STOPPED_FILE).unlink(missing_ok=True)


def read_engine_stopped(state_dir: Path) -> dict[str, str] | None:
    """Each engine left stopped and why, or None when none is (or the file cannot be read)."""
    stopped = read_json(state_dir / STOPPED_FILE)
    if not isinstance(stopped, dict) or not stopped:
        return None
    return {str(name): str(why) for name, why in stopped.items()}


def read_engine_health(state_dir: Path) -> dict[str, str] | None:
    """Each engine's state, or None when the pod has one engine (no file) or the file cannot be read."""
    states = read_json(state_dir / FILE)
    return {str(name): str(state) for name, state in states.items()} if isinstance(states, dict) else None


def pod_condition(
    states: Mapping[str, str] | None,
    serves: bool = True,
    swap: Mapping[str, Any] | None = None,
    stopped: Mapping[str, str] | None = None,
) -> str:
    """The pod in one word (CONDITIONS): "stopped" when every engine is left stopped (a sick host, a setting that
    cannot start: keys see why), "swapping" while its engine is down for a swap, "starting" while no model is served
    yet, "degraded" while some of its engines are down, else "ok"."""
    if stopped and (not states or set(states) <= set(stopped)):
        return "stopped"
    if swap is not None and swap.get("phase") not in ENGINE_UP:
        return "swapping"
    if not serves:
        return "starting"
    return "degraded" if states and any(state != "healthy" for state in states.values()) else "ok"
