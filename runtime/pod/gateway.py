"""The gateway role (VL_ROLE=gateway): no engine and no GPU, only the bridge and the router, in front of
other pods of ours (VL_WORKERS), each conversation kept on one of them as on the engines of one pod.

The router learns its workers through its control plane on loopback, each registered with VL_WORKER_KEY
in the request's body (never on its command line, which `ps` shows; a worker's bridge accepts that key
as the one labelled `gateway`); a router that restarts starts with
none, so the gateway registers what it lacks every few seconds, and notes each worker's health in the
file the bridge's /health reads (runtime.state.enginehealth): a worker down makes the gateway degraded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from runtime.pod.router import RouterControl
from runtime.settings import Settings, SettingsError, as_text
from runtime.state.enginehealth import write_engine_health

KEEP_EVERY_S = 5.0


def check_roles(settings: Settings) -> None:
    """The combinations of VL_ROLE that cannot work, refused in one line."""
    if settings.role != "gateway":
        if settings.workers:
            raise SettingsError("VL_WORKERS", as_text(settings.workers), "empty unless VL_ROLE=gateway")
        if settings.worker_key and not settings.bridge:
            raise SettingsError(
                "VL_BRIDGE", "off", "on with VL_WORKER_KEY (a worker's bridge checks the gateway's key)"
            )
        return
    if not settings.workers:
        raise SettingsError("VL_WORKERS", "", "at least one pod's URL with VL_ROLE=gateway")
    if settings.replicas not in (None, 1):
        raise SettingsError(
            "VL_REPLICAS", str(settings.replicas), "1 with VL_ROLE=gateway (its workers run the engines)"
        )
    if not settings.bridge:
        raise SettingsError("VL_BRIDGE", "off", "on with VL_ROLE=gateway (the bridge is all it serves)")


def worker_name(index: int) -> str:
    return f"worker-{index}"


async def keep_workers(settings: Settings, state_dir: Path, url: str, every_s: float = KEEP_EVERY_S) -> None:
    """Until cancelled: the router knows every worker, and the health file says which ones serve."""
    control, last = RouterControl(url), None
    while True:
        healthy = await control.keep(settings.workers, settings.worker_key)
        now = {worker_name(i): healthy[worker] for i, worker in enumerate(settings.workers)}
        if now != last:
            await asyncio.to_thread(write_engine_health, state_dir, now)
            last = now
        await asyncio.sleep(every_s)
