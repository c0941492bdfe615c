"""Each key's usage totals across restarts: a JSON-lines file on the pod's volume (`--ledger`).

The requests counted since the last write are appended every FLUSH_EVERY_S, one line per key, in one
`write` on a file opened O_APPEND (no line is ever interleaved with another). At start the file is
summed per key and rewritten as one line each (a new file renamed over the old: a crash leaves one or
the other), so it stays as small as the number of keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path

from runtime.bridge.usage import COUNTS, KeyUsage

log = logging.getLogger("runtime.bridge")

FLUSH_EVERY_S = 5.0  # what a crash can lose of the totals; a write per request would put I/O on its path
MAX_LEDGER_BYTES = 8 * 2**20  # a line per key and restart: a larger file is not ours, and is set aside


class Ledger:
    """Appends each key's new usage to `path`; reads the totals back at start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending: dict[str, KeyUsage] = {}
        self.failing = False  # a write failed: said once, not every FLUSH_EVERY_S

    def load(self) -> dict[str, KeyUsage]:
        """The totals per key label, the file compacted to one line each; none when there is no file, or
        when it cannot be read (the bridge starts anyway: usage is counted, and saved once it can be)."""
        try:
            return self.read()
        except OSError as error:
            log.warning("could not read the usage ledger %s: %s; totals start again", self.path, error)
            return {}

    def read(self) -> dict[str, KeyUsage]:
        totals: dict[str, KeyUsage] = {}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a gateway pod has no cache of its own
        try:
            if self.path.stat().st_size > MAX_LEDGER_BYTES:
                self.path.replace(self.path.with_suffix(".too-big"))
                log.warning("the usage ledger %s was over %d bytes: set aside, totals start again", self.path,
                            MAX_LEDGER_BYTES)  # fmt: skip
                return totals
            text = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return totals
        skipped = 0
        for line in text.splitlines():
            entry = parsed(line)
            if entry is None:
                skipped += bool(line.strip())
                continue
            known = totals.setdefault(entry.name, KeyUsage(entry.name, entry.since))
            known.since = min(known.since, entry.since)
            known.add(entry)
        if skipped:
            log.warning("the usage ledger %s had %d unreadable lines: left out", self.path, skipped)
        self.rewrite(totals)
        return totals

    def rewrite(self, totals: dict[str, KeyUsage]) -> None:
        new = self.path.with_suffix(".new")
        new.write_text("".join(line_of(usage) for usage in totals.values()))
        new.chmod(0o600)
        new.replace(self.path)

    def record(self, key: str, since: str, spent: KeyUsage) -> None:
        """Add one request's usage to what the next flush appends."""
        self.pending.setdefault(key, KeyUsage(key, since)).add(spent)

    def take(self) -> bytes:
        """What was counted since the last call, as ledger lines (taken on the event loop's thread)."""
        batch, self.pending = self.pending, {}
        return "".join(line_of(usage) for usage in batch.values()).encode()

    def append(self, data: bytes) -> None:
        if not data:
            return
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(descriptor, data)
            finally:
                os.close(descriptor)
        except OSError as error:  # a full or read-only volume: the console's totals go on, unsaved
            if not self.failing:
                log.warning("could not append to the usage ledger %s: %s (said once)", self.path, error)
            self.failing = True
        else:
            self.failing = False

    async def keep_writing(self, every_s: float = FLUSH_EVERY_S) -> None:
        """Append what was counted, every `every_s` (runs until cancelled; then writes the rest)."""
        try:
            while True:
                await asyncio.sleep(every_s)
                await asyncio.to_thread(self.append, self.take())
        finally:
            self.append(self.take())


def line_of(usage: KeyUsage) -> str:
    return json.dumps(asdict(usage), separators=(",", ":")) + "\n"


def parsed(line: str) -> KeyUsage | None:
    """One ledger line, or None when it is not one (a torn last line after a crash, a stranger's text)."""
    with contextlib.suppress(ValueError, TypeError, AttributeError, KeyError):
        entry = json.loads(line)
        name, since = entry["name"], entry["since"]
        counts = {count: entry.get(count, 0) for count in COUNTS}
        if (
            isinstance(name, str)
            and isinstance(since, str)
            and all(isinstance(value, int | float) and value >= 0 for value in counts.values())
        ):
            return KeyUsage(name, since, **counts)
    return None
