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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.bridge.errors import BridgeError
from runtime.bridge.state import Bridge
from runtime.bridge.upstream import Upstream
from runtime.logfiles import tail
from runtime.redact import Redactor

BOOT_LOG_LINES = 20
QUEUE_TIMEOUT_S = 2.0  # an engine that cannot say its queue in that time is busy enough to show "unknown"
QUEUE_SAMPLE = re.compile(r"^vllm:num_requests_(running|waiting)(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class EngineQueue:
    """vLLM's scheduler as its `/metrics` tells it; `answering` is whether the engine answered at all."""

    answering: bool
    running: int | None = None
    waiting: int | None = None


def parse_queue(text: str) -> EngineQueue:
    """Requests running and waiting, summed over vLLM's label sets (one per engine with data parallelism)."""
    found: dict[str, float] = {}
    for which, value in QUEUE_SAMPLE.findall(text):
        try:
            found[which] = found.get(which, 0.0) + float(value)
        except ValueError:
            continue
    running, waiting = (found.get(which) for which in ("running", "waiting"))
    return EngineQueue(True, None if running is None else int(running), None if waiting is None else int(waiting))


async def engine_queue(upstream: Upstream, timeout_s: float = QUEUE_TIMEOUT_S) -> EngineQueue:
    try:
        status, body, _ = await asyncio.wait_for(upstream.fetch("GET", "/metrics"), timeout_s)
    except TimeoutError:
        return EngineQueue(True)  # slow: busy, not gone (a dead one refuses at once; a hung one is the watchdog's)
    except BridgeError:
        return EngineQueue(False)
    return parse_queue(body.decode("utf-8", "replace")) if status == 200 else EngineQueue(True)


def engine_state(model_known: bool, answering: bool) -> str:
    """The engine's state: "starting" until the bridge has learnt the model, then "healthy", or
    "restarting" while the engine that served it does not answer (the supervisor relaunches it)."""
    if not model_known:
        return "starting"
    return "healthy" if answering else "restarting"


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


async def pod_status(bridge: Bridge) -> dict[str, Any]:
    """The whole status object (its contract: the README's "Watch the pod" and runtime/status.py)."""
    queue = await engine_queue(bridge.upstream)
    model = bridge.catalog.model
    state = engine_state(model is not None, queue.answering)
    boot_log = [] if state == "healthy" else await asyncio.to_thread(engine_log_tail, bridge.engine_log)
    uptime_s = bridge.usage.uptime_s()
    traffic = bridge.usage.traffic()
    gpus, gpu_note = bridge.telemetry.status()
    return {
        "model": {"name": model.name, "context_window": model.context_window or None} if model else None,
        "engine": {"state": state, "boot_log": boot_log},
        "uptime_s": round(uptime_s, 1),
        "image": bridge.image,
        "traffic": {
            "requests_per_min": traffic.pop("requests_per_min"),
            "open_streams": bridge.metrics.streams_open(),
            "running": queue.running,
            "waiting": queue.waiting,
            **traffic,
        },
        "keys": bridge.usage.per_key(),
        "gpus": gpus,
        "gpu_note": gpu_note,
        "cost": cost(bridge.cost_per_hour, uptime_s, traffic["output_tokens_per_s"]),
    }
