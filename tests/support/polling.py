"""Waiting on a condition with a deadline (never a bare sleep as synchronisation)."""

from __future__ import annotations

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
