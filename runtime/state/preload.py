"""VL_PRELOAD's progress, in one small file of VL_STATE_DIR: written by the pod (every repo waiting, until the first
model serves) and then by the preload's process as it goes (runtime.pod.preload), read by the bridge's status route for
the console without asking that process anything (as runtime.state.enginehealth is for the engines' health).

One entry per repo, in the order they are downloaded: `repo`, `state` (waiting, downloading, done, failed), with
`done` and `total` bytes while downloading (total once known), and a one-line `reason` when failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runtime.state.statefile import read_json, write_json

FILE = "preload.json"
STATES = ("waiting", "downloading", "done", "failed")


@dataclass
class RepoPreload:
    """One repo's state in the preload."""

    repo: str
    state: str = "waiting"
    done: int | None = None  # bytes in the cache, while downloading
    total: int | None = None  # bytes the Hub lists for the files vLLM reads
    reason: str | None = None  # why it failed, in one line

    def as_json(self) -> dict[str, Any]:
        return {name: value for name, value in asdict(self).items() if value is not None}


def write_preload_state(state_dir: Path, repos: Iterable[RepoPreload]) -> None:
    """Replace the file at once (through a rename: the console never reads half of it)."""
    write_json(state_dir / FILE, [repo.as_json() for repo in repos])


def forget_preload_state(state_dir: Path) -> None:
    """No file: nothing to preload, never a previous start's progress."""
    (state_dir / FILE).unlink(missing_ok=True)


def read_preload_state(state_dir: Path) -> list[dict[str, Any]] | None:
    """Each repo's state, or None when the pod preloads nothing (no file) or the file cannot be read."""
    entries = read_json(state_dir / FILE)
    if not isinstance(entries, list):
        return None
    return [entry for entry in entries if isinstance(entry, dict) and entry.get("state") in STATES]
