"""The pod's self-check (VL_SELFCHECK), in one small file of VL_STATE_DIR: the pod writes it as its checks run, the
bridge reads it for /health's `checked`, the console and `runtime status`; neither waits on the other's process.

`{"state": "running" | "passed" | "failed", "checks": [{"name", "status", "detail"}, …]}`; no file: off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runtime.state.statefile import read_json, write_json

FILE = "selfcheck.json"
SELFCHECK_KEY = (
    "RUNTIME_SELFCHECK_KEY"  # the bridge's environment: the pod's own key for its checks, made at each start
)
STATES = ("running", "passed", "failed")


def write_selfcheck(state_dir: Path, state: str, checks: Sequence[Mapping[str, Any]]) -> None:
    write_json(state_dir / FILE, {"state": state, "checks": list(checks)})


def forget_selfcheck(state_dir: Path) -> None:
    """A new start: no verdict from the previous one."""
    (state_dir / FILE).unlink(missing_ok=True)


def read_selfcheck(state_dir: Path) -> dict[str, Any] | None:
    """The verdict so far, or None when the pod runs no self-check (no file) or the file cannot be read."""
    verdict = read_json(state_dir / FILE)
    if (
        not isinstance(verdict, dict)
        or verdict.get("state") not in STATES
        or not isinstance(verdict.get("checks"), list)
    ):
        return None
    return verdict


def checked(verdict: Mapping[str, Any] | None) -> str:
    """The verdict in a few words, as /health says it: off, running, passed, or `failed: needle, vision`."""
    if verdict is None:
        return "off"
    failed = [str(check.get("name")) for check in verdict["checks"] if check.get("status") == "failed"]
    return f"failed: {', '.join(failed)}" if verdict["state"] == "failed" else str(verdict["state"])
