"""The model swap's two small files in VL_STATE_DIR: the bridge asks for a recipe (`swap.request.json`), the
pod says what is loaded and how far a swap has come (`swap.state.json`). Files, as for the engines' health:
the bridge never waits on the pod's process, and each side can restart without the other.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from runtime.state.statefile import Watched, read_json, write_json

REQUEST_FILE = "swap.request.json"
STATE_FILE = "swap.state.json"


class Phase(StrEnum):
    """Where the swap stands, as the state file says it (the values are the file's words)."""

    SERVING = "serving"  # the loaded recipe answers; nothing asked
    WAITING = "waiting"  # asked, but the loaded recipe has not had VL_SWAP_MIN_S yet (it still answers)
    PREPARING = "preparing"  # the other recipe's engine prepared, its weights downloaded if absent (the old answers)
    DOWNLOADING = "downloading"  # the same, with a download under way
    STOPPING = "stopping"  # the old engine finishes what it runs, then stops
    STARTING = "starting"  # the new engine starts: nothing answers until it is healthy


SERVING, WAITING, PREPARING, DOWNLOADING, STOPPING, STARTING = Phase
ENGINE_UP = frozenset({SERVING, WAITING, PREPARING, DOWNLOADING})  # phases in which the loaded recipe answers
# The legal moves, from each phase (the same phase again: a state rewritten, another VL_SWAP or Hub file). A swap
# that cannot be prepared goes back to serving; one taken over by a newer change (a Hub file) too, from any phase.
NEXT: dict[Phase, frozenset[Phase]] = {
    SERVING: frozenset({SERVING, WAITING, PREPARING}),
    WAITING: frozenset({WAITING, SERVING, PREPARING}),
    PREPARING: frozenset({PREPARING, DOWNLOADING, STOPPING, SERVING}),
    DOWNLOADING: frozenset({DOWNLOADING, STOPPING, SERVING}),
    STOPPING: frozenset({STARTING, SERVING}),
    STARTING: frozenset({STARTING, SERVING}),
}


def swap_table(pairs: tuple[str, ...]) -> dict[str, str]:
    """VL_SWAP's `name:recipe` pairs as a mapping from the name a request sends to the recipe that serves it."""
    return {name: recipe for name, _, recipe in (pair.rpartition(":") for pair in pairs)}


@dataclass(frozen=True)
class SwapState:
    """What the pod last wrote: the loaded recipe, the phase, the recipe a swap goes to, and what the bridge needs to
    know of each swappable recipe (the loaded one among them)."""

    loaded: str
    phase: Phase = Phase.SERVING
    target: str | None = None
    since: float = 0.0  # when the loaded recipe began serving (VL_SWAP_MIN_S counts from it)
    phase_since: float = 0.0  # when the phase began
    thinks_unasked: bool = False  # the loaded recipe's trait, which the bridge's translation needs
    windows: dict[str, int] = field(default_factory=dict)  # each recipe's context window
    recipe_names: dict[str, list[str]] = field(default_factory=dict)  # each recipe's own served names
    failed: dict[str, Any] | None = None  # the last swap that failed: recipe, reason, at
    last: dict[str, Any] | None = None  # the last swap done: from, to, seconds

    @property
    def engine_up(self) -> bool:
        return self.phase in ENGINE_UP

    @property
    def names(self) -> list[str]:
        """The names the engine serves now (the loaded recipe's)."""
        return self.recipe_names.get(self.loaded, [])


def write_state(state_dir: Path, state: SwapState) -> None:
    write_json(state_dir / STATE_FILE, asdict(state))


def read_state(state_dir: Path) -> SwapState | None:
    """The pod's last word, or None without one (no VL_SWAP, or the pod has not written it yet)."""
    return as_state(read_json(state_dir / STATE_FILE))


def as_state(data: Any) -> SwapState | None:
    """The state a file's JSON holds, or None (not the pod's, or another version's fields)."""
    if not isinstance(data, dict):
        return None
    try:
        return SwapState(**{**data, "phase": Phase(data.get("phase", Phase.SERVING))})
    except (TypeError, ValueError):  # another version's fields, or a phase this one does not know
        return None


def state_watch(state_dir: Path) -> Watched[SwapState]:
    """The state file as a bridge reads it on every request: parsed again only once the pod replaced it."""
    return Watched(state_dir / STATE_FILE, as_state)


def ask_for(state_dir: Path, recipe: str) -> None:
    """The bridge's request: the pod swaps to `recipe` (a newer request replaces an older one)."""
    write_json(state_dir / REQUEST_FILE, {"recipe": recipe, "at": time.time()})


def asked(state_dir: Path) -> str | None:
    """The recipe last asked for, or None."""
    request = read_json(state_dir / REQUEST_FILE)
    recipe = request.get("recipe") if isinstance(request, dict) else None
    return recipe if isinstance(recipe, str) else None


def forget_swap(state_dir: Path) -> None:
    """A new start: no request and no state from the previous one."""
    for name in (REQUEST_FILE, STATE_FILE):
        (state_dir / name).unlink(missing_ok=True)
