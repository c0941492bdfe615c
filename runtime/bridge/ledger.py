"""Each key's usage totals across restarts: a JSON-lines file on the pod's volume (`--ledger`).

The requests counted since the last write are appended every FLUSH_EVERY_S, one line per key and day, in
one `write` on a file opened O_APPEND (no line is ever interleaved with another). At start, and whenever
the file passes COMPACT_AT_BYTES, it is summed per key and day and rewritten (a new file renamed over the
old: a crash leaves one or the other); past MAX_LEDGER_BYTES the oldest days are folded into one line per
key. Totals are never set aside: a file of any size is read line by line, a bad line skipped and said.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TextIO, TypeVar

from runtime.bridge.usage import COUNTS, KeyUsage

log = logging.getLogger("runtime.bridge")

FLUSH_EVERY_S = 5.0  # what a crash can lose of the totals; a write per request would put I/O on its path
# One key's steady use appends a line per flush: 8 MiB in 1-3 days. Compacted, a key costs a line per day.
COMPACT_AT_BYTES = 2**20
MAX_LEDGER_BYTES = 8 * 2**20  # compacted past this, the oldest days are folded into one line per key
MAX_LINE_CHARS = 4096  # a line of ours is ~200: a longer one is not ours (and could nest without end)
MAX_COUNT = 10**15  # a count past this is not one the bridge wrote (and a sum of them stays finite)
EARLIER = ""  # the day of a line that folds older days together (and of lines written before days were)

Day = str  # the UTC date a line's requests were counted on, YYYY-MM-DD; EARLIER for folded ones
Buckets = dict[tuple[str, Day], KeyUsage]
K = TypeVar("K")


class Ledger:
    """Appends each key's new usage to `path`; reads the totals back at start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pending: Buckets = {}
        self.torn = b""  # the end of a line a short write left unfinished: written first next time
        self.failing = False  # a write failed: said once, not every FLUSH_EVERY_S

    def load(self) -> Buckets:
        """The usage per key label and day, the file compacted; none when there is no file, or when it cannot be
        read (the bridge starts anyway: usage is counted, and saved once it can be)."""
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a gateway pod has no cache of its own
            return self.compact()
        except OSError as error:
            log.warning("could not read the usage ledger %s: %s; totals start again", self.path, error)
            return {}

    def compact(self) -> Buckets:
        """The file summed per key and day, rewritten so (the oldest days folded past MAX_LEDGER_BYTES)."""
        buckets: Buckets = {}
        skipped = 0
        try:
            with self.path.open(encoding="utf-8", errors="replace") as file:
                for usage, day in entries(bounded_lines(file)):
                    if usage is None:
                        skipped += 1
                    else:
                        add_to(buckets, usage, day)
        except FileNotFoundError:
            return buckets
        if skipped:
            log.warning("the usage ledger %s had %d unreadable lines: left out", self.path, skipped)
        buckets = within(buckets, MAX_LEDGER_BYTES)
        new = self.path.with_suffix(".new")
        new.write_text("".join(line_of(usage, day) for (_, day), usage in sorted(buckets.items())))
        new.chmod(0o600)
        new.replace(self.path)
        return buckets

    def record(self, key: str, since: str, spent: KeyUsage) -> None:
        """Add one request's usage to what the next flush appends, on today's line of its key."""
        merge(self.pending, (key, today()), spent)

    def take(self) -> bytes:
        """What was counted since the last call, as ledger lines (taken on the event loop's thread)."""
        batch, self.pending = self.pending, {}
        return "".join(line_of(usage, day) for (_, day), usage in batch.items()).encode()

    def append(self, data: bytes) -> None:
        """Appends `data` after what a short write left unfinished; what does not reach the disk is kept (the
        torn line's end as bytes, whole lines back in `pending`) and written next time."""
        data = self.torn + data
        if not data:
            return
        written, error = 0, None
        try:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                written = os.write(descriptor, data)
            finally:
                os.close(descriptor)
        except OSError as failed:  # a full or read-only volume: the console's totals go on, kept in memory
            error = str(failed)
        if written < len(data):
            self.keep(data, written)
            if not self.failing:
                why = error or f"{written} of {len(data)} bytes written (a full volume?)"
                log.warning(
                    "could not append to the usage ledger %s: %s; the totals are kept in memory and "
                    "written once it can (said once)",
                    self.path,
                    why,
                )
            self.failing = True
        else:
            self.failing = False

    def keep(self, data: bytes, written: int) -> None:
        """What a write left out of `data`: the rest of a line it began, then whole lines, counted again."""
        if written < len(self.torn):
            self.torn, rest = self.torn[written:], data[len(self.torn) :]
        else:
            begun = written > 0 and data[written - 1 : written] != b"\n"
            cut = data.find(b"\n", written) + 1 if begun else written
            self.torn, rest = data[written:cut], data[cut:]
        for usage, day in entries(rest.decode(errors="replace").splitlines()):
            if usage is not None:
                add_to(self.pending, usage, day)

    async def keep_writing(self, every_s: float = FLUSH_EVERY_S) -> None:
        """Append what was counted, every `every_s`, compacting the file as it grows (runs until cancelled;
        then writes the rest)."""
        try:
            while True:
                await asyncio.sleep(every_s)
                await asyncio.to_thread(self.flush)
        finally:
            self.append(self.take())

    def flush(self) -> None:
        self.append(self.take())
        try:
            if not self.torn and self.path.stat().st_size > COMPACT_AT_BYTES:
                self.compact()
        except OSError as error:  # the appended lines are there: compacted at the next flush or start
            log.warning("could not compact the usage ledger %s: %s", self.path, error)


def today() -> Day:
    return day_of(datetime.now(UTC))


def day_of(moment: datetime) -> Day:
    """The ledger's day of a UTC time (what a key's budget sums its spend by)."""
    return moment.strftime("%Y-%m-%d")


def add_to(buckets: Buckets, usage: KeyUsage, day: Day) -> None:
    merge(buckets, (usage.name, day), usage)


def merge(into: dict[K, KeyUsage], where: K, usage: KeyUsage) -> None:
    """`usage` added to the entry `where`, whose date becomes the earlier of the two."""
    known = into.setdefault(where, KeyUsage(usage.name, usage.since))
    known.since = min(known.since, usage.since)
    known.add(usage)


def totals_of(buckets: Buckets) -> dict[str, KeyUsage]:
    """Each key's totals over its days, since its earliest date."""
    totals: dict[str, KeyUsage] = {}
    for (name, _), usage in sorted(buckets.items()):
        merge(totals, name, usage)
    return totals


def within(buckets: Buckets, budget: int) -> Buckets:
    """The buckets, the oldest days folded into one EARLIER line per key until the file fits `budget`."""
    days = sorted({day for _, day in buckets if day != EARLIER})
    while days and sum(len(line_of(usage, day)) for (_, day), usage in buckets.items()) > budget:
        oldest = days.pop(0)
        for name, day in [where for where in buckets if where[1] == oldest]:
            add_to(buckets, buckets.pop((name, day)), EARLIER)
    return buckets


def line_of(usage: KeyUsage, day: Day) -> str:
    return json.dumps(asdict(usage) | {"day": day}, separators=(",", ":")) + "\n"


def bounded_lines(file: TextIO) -> Iterator[str]:
    """A file's lines, one longer than MAX_LINE_CHARS cut there (never read whole into memory): not ours."""
    while line := file.readline(MAX_LINE_CHARS + 1):
        yield line
        while len(line) > MAX_LINE_CHARS and not line.endswith("\n"):  # the rest of an overlong line
            line = file.readline(MAX_LINE_CHARS + 1)
            if not line:
                return


def entries(lines: Iterable[str]) -> Iterator[tuple[KeyUsage | None, Day]]:
    """Each non-blank line as (usage, day); (None, EARLIER) for one that is not a ledger line."""
    for line in lines:
        if line.strip():
            yield parsed(line)


def parsed(line: str) -> tuple[KeyUsage | None, Day]:
    """One ledger line, or None when it is not one: a torn last line after a crash, a stranger's text, a
    count no bridge writes (negative, not finite, beyond MAX_COUNT), a day that is no date or after today, a line
    too long or too deep."""
    if len(line) > MAX_LINE_CHARS:
        return None, EARLIER
    try:
        entry = json.loads(line)
        name, since, day = entry["name"], entry["since"], entry.get("day", EARLIER)
        counts = {count: entry.get(count, 0) for count in COUNTS}
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return None, EARLIER
    if not (isinstance(name, str) and isinstance(since, str) and is_day(day)):
        return None, EARLIER
    if not all(is_count(value) for value in counts.values()):
        return None, EARLIER
    return KeyUsage(name, since, **counts), day


def is_day(value: object) -> bool:
    """A day the bridge could have written: EARLIER, or a real UTC date not after today (a line dated 9999-12-31
    would have held its key's daily budget spent for good)."""
    if value == EARLIER:
        return True
    if not (isinstance(value, str) and len(value) == 10):
        return False
    try:
        return date.fromisoformat(value).isoformat() == value and value <= today()
    except ValueError:
        return False


def is_count(value: object) -> bool:
    """A count the bridge could have written: not negative, finite (JSON's Infinity, which Python reads, made
    the status page answer 500) and below MAX_COUNT."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
