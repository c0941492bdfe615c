"""The model swap (VL_SWAP), the pod's side: the recipe the bridge asks for (runtime.state.swap's request file) is
loaded once the loaded one has had its VL_SWAP_MIN_S, one swap at a time, through the engines' one change.

The damping and the outcome are here; the phases, and the change itself, are `Engines`' (runtime.pod.engines).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from runtime.pod.engines import ChangeRefused, Engines
from runtime.state.swap import asked, swap_table

log = logging.getLogger(__name__)

POLL_S = 0.25  # how often the pod looks for the bridge's swap request (a small file)
WAIT_LOOK_S = 1.0  # how often a swap held back by VL_SWAP_MIN_S looks whether it is still asked for


class Swapper:
    """Swaps the engine to the recipe the bridge asks for; `say` publishes a line (the Hub log), `progress` shows
    the Hub log's progress from now on (a download takes minutes)."""

    def __init__(self, engines: Engines, say: Callable[[str], None], progress: Callable[[], None]) -> None:
        self.engines, self.say, self.progress = engines, say, progress
        self.state_dir = engines.state_dir

    async def run(self) -> None:
        """Swap to the recipe asked for while VL_SWAP lists it; a request for the loaded recipe, or for one VL_SWAP
        no longer lists, changes nothing."""
        self.engines.serving()
        await self.engines.until_serving()
        self.engines.served_since_now()  # VL_SWAP_MIN_S counts from the first answer
        while True:
            wanted = await asyncio.to_thread(asked, self.state_dir) or ""
            settings = self.engines.settings
            if wanted in swap_table(settings.swap).values() and wanted != settings.model:
                await self.swap_to(wanted)
            await asyncio.sleep(POLL_S)

    async def swap_to(self, recipe: str) -> None:
        """Restart the engine on `recipe` after the loaded one's VL_SWAP_MIN_S (a waiting swap is dropped when asked
        back for the loaded one); its weights ready first (the old engine answers meanwhile), then the change."""
        old, asked_at = self.engines.settings.model, time.monotonic()
        if not await self.held_back(old, recipe):
            return
        async with self.engines.changing:
            restarts = await self.begin(old, recipe)
        if restarts is None:
            return
        try:
            await restarts
        except ChangeRefused as error:  # its engine could not start: left stopped, and the requests told why
            self.failed(recipe, error, "the engine is left stopped")
            return
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if restarts.cancelled() and current is not None and not current.cancelling():
                log.info("swap to %s taken over by a newer change", recipe)
                self.engines.serving()
                return
            raise
        seconds = time.monotonic() - asked_at
        self.engines.swapped(old, recipe, seconds)
        line = f"swapped the model: {recipe} serves ({old} -> {recipe} in {seconds:.0f} s)"
        log.info("%s", line)
        self.say(line)

    async def held_back(self, old: str, recipe: str) -> bool:
        """Wait out the loaded recipe's VL_SWAP_MIN_S (read anew: a Hub file may change it meanwhile); False when
        asked back meanwhile (the loop then swaps to whatever is asked now)."""
        if (due := self.engines.swap_due_in()) <= 0:
            return True
        log.info("swap to %s asked: %s stays at least %.0f s more (VL_SWAP_MIN_S)", recipe, old, due)
        self.engines.waiting_for(recipe)
        while (due := self.engines.swap_due_in()) > 0:
            await asyncio.sleep(min(due, WAIT_LOOK_S))
            if await asyncio.to_thread(asked, self.state_dir) != recipe:
                self.engines.serving()
                return False
        return True

    async def begin(self, old: str, recipe: str) -> asyncio.Task[None] | None:
        """The engine change to `recipe` begun (its restarts, returned), or refused in one line (None)."""
        engines = self.engines
        engines.preparing(recipe)
        self.say(f"swapping the model: {old} -> {recipe} (asked by a request)")

        def downloading() -> None:  # prepare_engine's word before a download, on its thread
            engines.downloading(recipe)
            self.progress()

        try:
            return await engines.change_to(
                engines.on_recipe(engines.settings, recipe), f"swapping the model to {recipe}", recipe, downloading
            )
        except ChangeRefused as error:
            self.failed(recipe, error, f"{old} keeps serving")
            return None

    def failed(self, recipe: str, error: ChangeRefused, after: str) -> None:
        """A swap that could not be prepared, or whose engine could not start: said in one line, and recorded for the
        requests that wait for it (they get a 500 naming the reason)."""
        line = f"swap to {recipe} refused: {error}; {after}"
        log.error("%s", line)
        self.say(line)
        self.engines.swap_failed(recipe, str(error))
