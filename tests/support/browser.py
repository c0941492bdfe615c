"""A headless Chromium (Debian's, driven by Playwright) for the pages users open: the console, the desktop in the
browser. `browser` is one per test module; `chromium()` one for a single test, closed before the next one runs
(Playwright's sync API holds an event loop while it is open: `asyncio.run` then fails)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is not installed: scripts/setup installs it (apt-get install chromium)"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched
