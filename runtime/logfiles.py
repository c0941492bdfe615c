"""The pod's log files: a child's output written into its log (each line capped, the file rotated at its cap),
and reading a log's tail across that rotation. The supervisor writes them; the Hub log and the console read them
(neither imports the other).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path

from runtime.logsafe import strip_controls

log = logging.getLogger(__name__)

# The pod's children, by the names their logs carry.
ENGINE, BRIDGE, SSHD, DESKTOP = "engine", "bridge", "sshd", "desktop"
TAIL_LINES = 150  # per source: enough to see a traceback and what led to it
TAIL_BYTES = 32 * 1024  # per source: engine lines can be long; keeps the file small and "regular" on the Hub


def log_file(state_dir: Path, name: str) -> Path:
    """Where the log of `name` (a child, or `boot`) is written: `<VL_STATE_DIR>/<name>.log`."""
    return state_dir / f"{name}.log"


def rotated(path: Path) -> Path:
    """Where a child's log goes when it reaches its cap (`bridge.log` → `bridge.log.1`): tail readers look there too."""
    return path.with_name(path.name + ".1")


MAX_LINE_BYTES = 8 * 2**10  # a log line longer than any the pod writes itself (vLLM's argument dump: ~3 KiB)
LINE_CUT = b" [... line cut at 8 KiB]"


class ChildLog:
    """A child's log file, rotated to `<path>.1` (replacing it) before a write would take it past `cap`
    bytes; it is cut after a line when it can be, so each file reads on its own."""

    def __init__(self, path: Path, cap: int) -> None:
        self.path, self.cap = path, cap
        self.file = path.open("ab")
        self.size = self.file.tell()
        self.failing = False  # said once: on a full disk, every line would say it again

    def write(self, data: bytes) -> None:
        """Append `data`; never raises: on a write error (a full disk) the data is lost, and the child
        lives on (a supervisor that stopped reading would kill it through its closed pipe)."""
        try:
            self._write(data)
        except OSError as error:
            if not self.failing:
                log.error("cannot write to %s (%s): output lost until it can", self.path, error)
            self.failing = True
        else:
            self.failing = False

    def _write(self, data: bytes) -> None:
        while len(data) > (room := max(0, self.cap - self.size)):
            cut = data.rfind(b"\n", 0, room) + 1 or (room if self.size == 0 else 0)  # a line longer than cap: cut
            self._append(data[:cut])
            self.rotate()
            data = data[cut:]
        self._append(data)

    def _append(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()  # readers (the Hub log's tail) see each piece at once
        self.size += len(data)

    def rotate(self) -> None:
        self.path.replace(rotated(self.path))
        old, self.file, self.size = self.file, self.path.open("ab"), 0  # opened first: a failure leaves one
        old.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a last flush to a full disk: that output is lost
            self.file.close()


class LineCap:
    """Cuts each line of a stream after `cap` bytes, with a mark: one huge line (a client's 5 MiB value
    reaching a log) would otherwise fill the Hub log's whole tail and erase the lines before it."""

    def __init__(self, cap: int = MAX_LINE_BYTES) -> None:
        self.cap = cap
        self.length = 0  # of the line under way, as the child wrote it

    def __call__(self, data: bytes) -> bytes:
        kept: list[bytes] = []
        for index, piece in enumerate(data.split(b"\n")):
            if index:
                kept.append(b"\n")
                self.length = 0
            room = self.cap - self.length
            if room > 0:
                kept.append(piece[:room])
                if len(piece) > room:
                    kept.append(LINE_CUT)
            self.length += len(piece)
        return b"".join(kept)


class OutputPump(asyncio.Protocol):
    """Copies a child's output pipe into its log, each line cut at MAX_LINE_BYTES; `finished` is done once
    every writer closed the pipe."""

    def __init__(self, output: ChildLog) -> None:
        self.output = output
        self.cap = LineCap()
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.output.write(self.cap(data))

    def connection_lost(self, exc: Exception | None) -> None:
        self.output.close()
        if not self.finished.done():
            self.finished.set_result(None)

    def close(self) -> None:
        """Stop reading (what is still written to the pipe is lost); the log is closed once the pipe is."""
        if self.transport is not None:
            self.transport.close()


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
