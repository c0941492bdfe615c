"""Whether the Hub takes the pod's log, in one small file of VL_STATE_DIR: the log publisher (runtime.hub) writes
the Hub's refusal there and removes it once a write goes through; the bridge reads it for /v1/pod/status.

`{"refused": "<one line: which repo, why, what to change>"}`; no file: the Hub takes the log (or there is none).
"""

from __future__ import annotations

from pathlib import Path

from runtime.state.statefile import read_json, write_json

FILE = "hub-log.json"


def write_hub_log_refusal(state_dir: Path, line: str | None) -> None:
    """The Hub's refusal of the pod's log writes, or None once it takes them again."""
    if line is None:
        (state_dir / FILE).unlink(missing_ok=True)
    else:
        write_json(state_dir / FILE, {"refused": line})


def read_hub_log_refusal(state_dir: Path) -> str | None:
    """The line saying why the Hub refuses the pod's log, or None while it takes it (or the file is unreadable)."""
    state = read_json(state_dir / FILE)
    refused = state.get("refused") if isinstance(state, dict) else None
    return refused if isinstance(refused, str) else None
