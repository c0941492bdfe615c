"""The pod's log files: where a child's log goes when it reaches its cap, and reading a log's tail across
that rotation. The supervisor writes them; the Hub log and the console read them (neither imports the other).
"""

from __future__ import annotations

import os
from pathlib import Path

from runtime.logsafe import strip_controls

ENGINE, BRIDGE, SSHD = "engine", "bridge", "sshd"  # the pod's children, by the names their logs carry
TAIL_LINES = 150  # per source: enough to see a traceback and what led to it
TAIL_BYTES = 32 * 1024  # per source: engine lines can be long; keeps the file small and "regular" on the Hub


def log_file(state_dir: Path, name: str) -> Path:
    """Where the log of `name` (a child, or `boot`) is written: `<VL_STATE_DIR>/<name>.log`."""
    return state_dir / f"{name}.log"


def rotated(path: Path) -> Path:
    """Where a child's log goes when it reaches its cap (`bridge.log` → `bridge.log.1`): tail readers look there too."""
    return path.with_name(path.name + ".1")


def tail(path: Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last `lines` lines of a log, read on through its rotated file (the supervisor's cap) when it is
    short, without control sequences, and only the final state of `\\r` progress bars."""
    try:
        data, cut = end_of(path, max_bytes)
        if not cut and len(data) < max_bytes:
            older, cut = end_of(rotated(path), max_bytes - len(data))
            data = older + data
    except OSError as error:
        return [f"(cannot read {path}: {error})"]
    rows = data.decode("utf-8", "replace").split("\n")
    if cut:
        rows = rows[1:]  # cut in the middle
    if rows and not rows[-1]:
        rows.pop()
    return [strip_controls(row.rstrip("\r").rsplit("\r", 1)[-1]) for row in rows[-lines:]]


def end_of(path: Path, max_bytes: int) -> tuple[bytes, bool]:
    """The last `max_bytes` of a file (none when there is no file), and whether the file was longer."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(max(0, size - max_bytes))
            return file.read(), size > max_bytes
    except FileNotFoundError:
        return b"", False
