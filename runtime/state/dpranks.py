"""The data-parallel ranks that are down, as rank 0's node link last saw its cluster (runtime.pod.nodelink): the
bridge pins no agent to one (vLLM's API server holds a request sent to a lost node's rank for ever)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runtime.state.statefile import Watched, write_json

FILE = "dp.down-ranks.json"


def write_down_ranks(state_dir: Path, ranks: Iterable[int]) -> None:
    write_json(state_dir / FILE, sorted(ranks))


def ranks_of(raw: Any) -> frozenset[int] | None:
    if not isinstance(raw, list):
        return None
    return frozenset(rank for rank in raw if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0)


class DownRanks:
    """The ranks down now, for one `stat` a request while the file is unchanged (none when it is absent)."""

    def __init__(self, state_dir: Path) -> None:
        self.file = Watched(state_dir / FILE, ranks_of)

    def __call__(self) -> frozenset[int]:
        return self.file.read() or frozenset()
