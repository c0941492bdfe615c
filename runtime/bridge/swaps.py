"""The bridge's side of the model swap (VL_SWAP): which recipe a request's model needs, asking the pod for it
(runtime.state.swap's files), and the wait until it serves. One request or fifty for the other model: one ask, one swap.
A swap stops the engine for everyone: only a key with the swap right (the admin, `name:key:swap`) may cause one.

A streamed request waits with pings (RunPod's proxy cuts a silent connection at ~100-125 s; a first
compile took 368 s in the seeds); an unstreamed one cannot be pinged: it waits UNSTREAMED_WAIT_S, then
gets a 529 with `retry-after`, which Claude Code and the SDKs retry, while the swap goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from runtime.bridge.errors import BridgeError
from runtime.bridge.models import Catalog
from runtime.bridge.upstream import Upstream
from runtime.state.swap import WAITING, SwapState, ask_for, asked, state_watch, swap_table

POLL_S = 0.25  # how often a waiting request reads the pod's state file (a few hundred bytes)
UNSTREAMED_WAIT_S = 60.0  # below the proxy's ~100 s cut: a short swap still answers an unstreamed request
UNSTREAMED_RETRY_S = 30  # what its 529 tells the client to wait before asking again


class Swaps:
    """VL_SWAP's names and recipes, the pod's state as last read, and the wait for a recipe."""

    def __init__(self, pairs: tuple[str, ...], state_dir: Path, catalog: Catalog, upstream: Upstream) -> None:
        self.table = swap_table(pairs)
        self.state_dir = state_dir
        self.catalog = catalog
        self.upstream = upstream
        self.asking = asyncio.Lock()
        self.watched = state_watch(state_dir)  # read on every request: parsed once per change of the pod's

    def state(self) -> SwapState | None:
        """What the pod last wrote; None without VL_SWAP (or before the pod wrote it)."""
        return self.watched.read() if self.table else None

    def recipe_of(self, model: str, state: SwapState) -> str | None:
        """The recipe that serves `model`: VL_SWAP's name, else one of a swappable recipe's own names (`claude-tiny2`);
        None for any other name (the loaded model answers it, as without VL_SWAP)."""
        if model in self.table:
            return self.table[model]
        return next((recipe for recipe, names in state.recipe_names.items() if model in names), None)

    def serves(self, state: SwapState, model: str) -> bool:
        """Whether a request for `model` can go to the engine as it is now."""
        known = self.catalog.model is not None and self.catalog.model.name in state.names
        return state.engine_up and self.recipe_of(model, state) in (None, state.loaded) and known

    async def must_wait_for(self, model: str, may_swap: bool) -> bool:
        """A request's first question, on one reading of the pod's state: whether it must wait for the engine;
        BridgeError(403) when it would make the pod swap and its key may not; a key that may swap asking for the
        loaded recipe drops a swap still waiting for its turn."""
        state = self.state()
        if state is None:
            return False
        if (refused := self.refusal(model, may_swap, state)) is not None:
            raise refused
        if not self.serves(state, model):
            return True
        await self.keep_loaded(model, may_swap, state)
        return False

    def refusal(self, model: str, may_swap: bool, state: SwapState) -> BridgeError | None:
        """The 403 for a request that would make the pod change its model from a key that may not (None: it may,
        or it asks for nothing new: the loaded recipe, a name of no recipe, or the swap already under way)."""
        if may_swap:
            return None
        recipe = self.recipe_of(model, state)
        if recipe in (None, state.loaded, state.target):
            return None
        return BridgeError(
            403,
            f"this key may not change the loaded model ({state.loaded} is loaded; {model} would "
            f"restart the engine on {recipe}): ask for {state.loaded}, or use a key allowed to "
            "swap (VL_API_KEYS: name:key:swap)",
        )

    async def keep_loaded(self, model: str, may_swap: bool, state: SwapState) -> None:
        """A request for the loaded recipe from a key that may swap drops a swap still waiting for its turn
        (VL_SWAP_MIN_S): the traffic asks for what is loaded again. A name of no recipe changes nothing."""
        if may_swap and state.phase == WAITING and self.recipe_of(model, state) == state.loaded:
            async with self.asking:
                await asyncio.to_thread(ask_for, self.state_dir, state.loaded)

    async def ready_for(self, model: str, timeout_s: float | None = None, may_swap: bool = True) -> None:
        """Return once the engine serves `model`'s recipe, asking the pod to swap to it if need be (and `may_swap`);
        BridgeError when the swap failed, when it would need a swap this key may not ask for (403), or (529) when
        `timeout_s` passed first."""
        since, deadline = time.time(), time.monotonic() + (timeout_s or 1e9)
        while (state := self.state()) is not None and not self.serves(state, model):
            recipe = self.recipe_of(model, state)
            if recipe is not None and recipe != state.loaded:
                failed = state.failed or {}
                if failed.get("recipe") == recipe and failed.get("at", 0) >= since:
                    raise BridgeError(500, f"{model} could not be loaded: {failed.get('reason')}")
                if (refused := self.refusal(model, may_swap, state)) is not None:
                    raise refused  # another swap ended meanwhile: this one would be this key's doing
                async with self.asking:  # fifty waiting requests: one ask
                    if may_swap and await asyncio.to_thread(asked, self.state_dir) != recipe:
                        await asyncio.to_thread(ask_for, self.state_dir, recipe)
            elif state.engine_up and await self.learned(state):
                continue  # the swap is done, and its model known before anything is sent to it
            if time.monotonic() >= deadline:
                raise BridgeError(
                    529, f"{model} is being loaded ({self.progress(state)}): retry in a while", UNSTREAMED_RETRY_S
                )
            await asyncio.sleep(POLL_S)

    async def learned(self, state: SwapState) -> bool:
        """Whether the catalog now knows the model the pod swapped to (with its traits); not yet while the new
        engine does not answer."""
        with contextlib.suppress(BridgeError):  # not answering yet: asked again on the next turn
            await self.catalog.refresh(self.upstream)
        self.catalog.traits = replace(self.catalog.traits, thinks_unasked=state.thinks_unasked)
        return self.catalog.model is not None and self.catalog.model.name in state.names

    @staticmethod
    def progress(state: SwapState) -> str:
        """The swap as a line says it: `tiny -> tiny2, starting for 12 s`."""
        if state.target is None:
            return f"{state.loaded} {state.phase}"
        return f"{state.loaded} -> {state.target}, {state.phase} for {time.time() - state.phase_since:.0f} s"

    def others(self) -> dict[str, int]:
        """VL_SWAP's names whose recipe is not loaded, with the window each will have (0: not said): /v1/models
        lists them beside the loaded model's."""
        state = self.state()
        if state is None:
            return {}
        names = {name: recipe for recipe, names in state.recipe_names.items() for name in names} | self.table
        return {name: state.windows.get(recipe, 0) for name, recipe in names.items() if recipe != state.loaded}

    def view(self) -> dict[str, Any] | None:
        """The swap for /health, the console and `runtime status`; None without VL_SWAP."""
        state = self.state()
        if state is None:
            return None
        now = time.time()
        return {
            "loaded": state.loaded,
            "phase": state.phase,
            "target": state.target,
            "models": self.table,
            "phase_for_s": round(now - state.phase_since, 1),
            "serving_for_s": round(now - state.since, 1),
            "last": state.last,
            "failed": state.failed,
        }
