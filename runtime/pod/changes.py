"""Live reconfiguration: each new settings file the Hub watcher brings is judged over the settings configured,
compared with what runs, and acted on (the engines through `Engines.settle_on`, the bridge here); a refused file
changes nothing and is said in one line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from runtime.pod.children import Children
from runtime.pod.engines import ChangeRefused, Engines
from runtime.pod.hubside import PodHub, judged, refuse
from runtime.settings import Scope
from runtime.settingsfile import SettingsFile

log = logging.getLogger(__name__)


class SettingsChanges:
    """The Hub file's changes, one at a time, as they arrive (VL_CONFIG_REPO)."""

    def __init__(self, engines: Engines, children: Children, hub: PodHub, environ: Mapping[str, str]) -> None:
        self.engines, self.children, self.hub, self.environ = engines, children, hub, environ
        self.arrived: asyncio.Queue[SettingsFile] = asyncio.Queue()

    async def run(self) -> None:
        """Watch the Hub file (its watcher runs on a thread of its own) and apply each new one in turn."""
        if self.hub.remote is None:
            return
        loop = asyncio.get_running_loop()

        def arrived(file: SettingsFile) -> None:  # on the watcher's thread: handed over to the event loop
            loop.call_soon_threadsafe(self.arrived.put_nowait, file)

        self.hub.remote.start(arrived)
        try:
            while True:
                await self.apply(await self.arrived.get())
        finally:
            self.hub.remote.stop(timeout_s=1.0)

    async def apply(self, file: SettingsFile) -> None:
        """The one place a new Hub file is acted on: restart what the change needs, and only that. One engine change
        at a time."""
        async with self.engines.changing:
            new = judged(self.engines.configured, self.environ, file, self.hub)
            if new is None:
                return
            command = self.engines.command
            if (
                command is not None
                and command.node is not None
                and Scope.ENGINE in new.changed_scopes(self.engines.configured)
            ):
                # Each node reads its own environment: an engine setting changed on the head alone would split them.
                refuse(f"refused {file.where}: a cluster's engine settings are its template's (every node's): "
                       "change them there and restart the cluster", self.hub)  # fmt: skip
                return
            bridge_runs, ranks = self.children.bridge_runs, self.data_parallel
            stop_bridge = self.children.bridge_gives_way if bridge_runs and not new.bridge else None
            start_bridge = self.children.bridge_takes_over if new.bridge and not bridge_runs else None
            try:
                scopes = await self.engines.settle_on(new, file.where, before=stop_bridge, after=start_bridge)
            except ChangeRefused as error:
                refuse(f"refused {file.where}: {error}", self.hub)
                return
            if bridge_runs and new.bridge and (Scope.BRIDGE in scopes or self.data_parallel != ranks):
                self.children.restart_bridge("its settings changed")  # VL_DP: the ranks it pins conversations to
            # A running bridge stays otherwise: it learns the new model from vLLM's /v1/models.

    @property
    def data_parallel(self) -> int:
        command = self.engines.command
        return command.data_parallel if command is not None else 1
