"""The engines' health, as the supervisor sees it (a gateway's: its workers', as the router sees them), written to
the file the bridge's /health and console read (runtime.state.enginehealth): with several engines only.
"""

from __future__ import annotations

import asyncio

from runtime.pod.engines import Engines
from runtime.pod.gateway import keep_workers
from runtime.pod.router import router_url
from runtime.pod.supervisor import Supervisor
from runtime.state.enginehealth import write_engine_health

EVERY_S = 1.0  # how often the engines' health is compared with what /health last read


class HealthNotes:
    """Keeps the health file current while the pod runs, for a routed pod (several engines, or a gateway)."""

    def __init__(self, engines: Engines, supervisor: Supervisor) -> None:
        self.engines, self.supervisor = engines, supervisor

    async def run(self) -> None:
        engines = self.engines
        if engines.gateway:
            await keep_workers(engines.settings, engines.state_dir, router_url(engines.settings))
        if not engines.routed:
            return
        last: dict[str, bool] | None = None
        while True:
            now = {r.name: self.supervisor.is_healthy(r.name) for r in engines.replicas}
            if now != last:
                await asyncio.to_thread(write_engine_health, engines.state_dir, now)
                last = now
            await asyncio.sleep(EVERY_S)
