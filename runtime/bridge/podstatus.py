"""`GET /v1/pod/status`: what the console and `python -m runtime status` show, as one JSON object.

Is it working (the engine's state, its log while it starts), is it busy (traffic, vLLM's queue, the
GPUs), what does it cost. Asked every 2 s by a page, not per token: one fetch of vLLM's `/metrics` per
call is fine. Nothing in it is a secret: keys appear by their label, the image facts without a name
that is secret, and the engine's log lines masked by the Hub log's own redactor.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runtime.bridge.auth import Caller
from runtime.bridge.enginemetrics import EngineView, engine_view
from runtime.bridge.state import Bridge
from runtime.bridge.usage import KeyUsage, key_row
from runtime.logfiles import tail
from runtime.redact import Redactor
from runtime.state.enginehealth import read_engine_health, read_engine_stopped
from runtime.state.hublog import read_hub_log_refusal
from runtime.state.preload import read_preload_state
from runtime.state.selfcheck import read_selfcheck

BOOT_LOG_LINES = 20
SESSIONS_SHOWN = 8  # the console's and `runtime status`'s: the sessions seen last
QUEUE_TIMEOUT_S = 2.0  # an engine that cannot say its queue in that time is busy enough to show "unknown"


def engine_state(model_known: bool, engines: list[EngineView]) -> str:
    """The engines' state: "starting" until the bridge has learnt the model, then "healthy", "degraded"
    while some of several engines do not answer (the others serve), or "restarting" while none does
    (the supervisor relaunches them)."""
    if not model_known:
        return "starting"
    answering = sum(engine.answering for engine in engines)
    return "healthy" if answering == len(engines) else "degraded" if answering else "restarting"


def total(counts: Iterable[int | None]) -> int | None:
    """The sum of what the engines said; None when none said."""
    said = [count for count in counts if count is not None]
    return sum(said) if said else None


@functools.cache
def redactor() -> Redactor:
    """The Hub log's redactor, for this process's secrets (its environment carries the pod's)."""
    return Redactor.from_environ(os.environ)


def engine_log_tail(path: Path, lines: int = BOOT_LOG_LINES) -> list[str]:
    """The engine log's last lines: controls stripped (`tail`), secrets masked as in the Hub log."""
    redact = redactor()
    return [redact(line) for line in tail(path, lines)]


def cost(per_hour: float | None, uptime_s: float, output_tokens_per_s: float) -> dict[str, float | None]:
    """What the pod has cost since the bridge started, and a million output tokens at the current rate."""
    if per_hour is None:
        return {"per_hour": None, "so_far": None, "per_million_output_tokens": None}
    per_million = per_hour / (output_tokens_per_s * 3600) * 1e6 if output_tokens_per_s > 0 else None
    return {
        "per_hour": per_hour,
        "so_far": round(per_hour * uptime_s / 3600, 4),
        "per_million_output_tokens": None if per_million is None else round(per_million, 4),
    }


def keys(bridge: Bridge, caller: Caller) -> list[dict[str, Any]]:
    """Each key's usage (an admin's view; the caller's own otherwise), with its budgets' standing where it has
    some: a budgeted key shows before its first request too."""
    rows = {row["name"]: row for row in bridge.usage.per_key(bridge.cost_per_hour)}
    for name, standings in bridge.budgets.views().items():
        unused = key_row(KeyUsage(name, ""), bridge.cost_per_hour) | {"since": None}
        rows.setdefault(name, unused)["budgets"] = standings
    return [row for name, row in sorted(rows.items()) if caller.admin or name == caller.label]


def cluster_nodes(states: dict[str, str] | None) -> dict[str, str] | None:
    """A cluster's workers and their states ("healthy", "lost since 18:13:45 UTC"…); None outside a cluster."""
    nodes = {name: state for name, state in (states or {}).items() if name.startswith("node ")}
    return nodes or None


async def pod_status(bridge: Bridge, caller: Caller) -> dict[str, Any]:
    """The status object (its contract: docs/guide/watch.md and runtime/client/status.py): the pod's
    health for every key, and the keys' usage and sessions, all of them for an admin, else the caller's."""
    # One read of the engines' /metrics: their queues for the console, a sample for the capacity panel.
    engines = [engine_view(answer) for answer in await bridge.capacity.sample(bridge.upstream, QUEUE_TIMEOUT_S)]
    model = bridge.catalog.model
    state = engine_state(model is not None, engines)
    nodes = cluster_nodes(read_engine_health(bridge.state_dir))  # a cluster's workers, as rank 0's node link saw them
    if state == "healthy" and nodes and any(node != "healthy" for node in nodes.values()):
        state = "degraded"  # a lost node's agents are served by the others meanwhile
    boot_log = [] if state == "healthy" else await asyncio.to_thread(engine_log_tail, bridge.engine_log)
    uptime_s = bridge.usage.uptime_s()
    traffic = bridge.usage.traffic()
    gpus, gpu_note = bridge.telemetry.status()
    return {
        "model": {"name": model.name, "context_window": model.context_window or None} if model else None,
        "engine": {"state": state, "boot_log": boot_log},
        "engines": [engine.as_json(index) for index, engine in enumerate(engines)],
        "nodes": nodes,
        "selfcheck": read_selfcheck(bridge.state_dir),  # VL_SELFCHECK's verdict (runtime.client.check); None when off
        "bench": bridge.bench.read(),  # runtime bench's last report; None before the first
        "preload": read_preload_state(bridge.state_dir),  # VL_PRELOAD's repos (runtime.pod.preload); None without
        "hub_log_refused": read_hub_log_refusal(bridge.state_dir),  # why the Hub refuses the pod's log, or None
        "stopped": read_engine_stopped(bridge.state_dir),  # engines left stopped by their start limit, and why
        "uptime_s": round(uptime_s, 1),
        "image": bridge.image,
        "traffic": {
            "requests_per_min": traffic.pop("requests_per_min"),
            "open_streams": bridge.metrics.streams_open(),
            "running": total(engine.running for engine in engines),
            "waiting": total(engine.waiting for engine in engines),
            **traffic,
        },
        "capacity": bridge.capacity.view(),
        "you": {"key": caller.label, "admin": caller.admin},
        "keys": keys(bridge, caller),
        "sessions": bridge.sessions.recent(
            SESSIONS_SHOWN,
            bridge.cost_per_hour,
            key=None if caller.admin else caller.label,
            viewer=caller.label,  # the admin's own first: another key's flood never hides them
        ),
        "gpus": gpus,
        "gpu_note": gpu_note,
        "cost": cost(bridge.cost_per_hour, uptime_s, traffic["output_tokens_per_s"]),
        "swap": bridge.swaps.view() if bridge.swaps is not None else None,
        "guard": {"writes_blocked": bridge.metrics.writes_blocked()} if bridge.serving.guard else None,
    }
