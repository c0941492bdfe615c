"""Waiting on a condition with a deadline (never a bare sleep as synchronisation)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], what: str, timeout_s: float = 30.0, every_s: float = 0.02) -> T:
    """Returns the condition's first truthy value; fails the test, naming `what`, past the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)
    return value


async def eventually(condition: Callable[[], object], timeout_s: float = 30.0, every_s: float = 0.05) -> None:
    """`wait_until` for a test that runs in the event loop: it sleeps between looks without blocking the loop."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for a condition")
        await asyncio.sleep(every_s)


def wait_for_log_line(read_log: Callable[[], str], pattern: str, timeout_s: float = 30.0) -> str:
    """The first line of a log that matches the regex `pattern`, once written; fails with the log's end."""
    regex = re.compile(f"^.*(?:{pattern}).*$", re.MULTILINE)
    try:
        return wait_until(
            lambda: ((found := regex.search(read_log())) and found.group(0)) or "",
            f"a log line matching {pattern!r}",
            timeout_s,
            0.05,
        )
    except AssertionError as error:
        raise AssertionError(f"{error}; the log ends:\n{read_log()[-4000:]}") from None
