"""One progress line for the commands run at a terminal (`build.py --push`, `runtime pod up`): redrawn in
place on a terminal, with lines said above it; elsewhere (CI, a file) a line when the state changes, and
now and then. Standard library only: build.py's side uses it too."""

from __future__ import annotations

import sys
import time
from typing import TextIO

QUIET_PROGRESS_S = 30.0  # without a terminal, a progress line at most this often unless the state changes
LIVE_CHARS, LOGGED_CHARS = 200, 300  # a terminal line is cut shorter than a logged one (it must not wrap)


class LiveLine:
    def __init__(self, prefix: str = "", stream: TextIO = sys.stdout) -> None:
        self.prefix, self.stream, self.live = prefix, stream, stream.isatty()
        self.shown, self.state, self.printed_at = "", "", 0.0

    def show(self, elapsed: float, state: str, detail: str = "") -> None:
        """`MM:SS STATE | detail`, after the prefix."""
        text = f"{self.prefix}{int(elapsed) // 60:02d}:{int(elapsed) % 60:02d} {state}" + (
            f" | {detail}" if detail else ""
        )
        if self.live:
            self.stream.write("\r\033[K" + text[:LIVE_CHARS])
        elif state != self.state or time.monotonic() - self.printed_at >= QUIET_PROGRESS_S:
            self.stream.write(text[:LOGGED_CHARS] + "\n")
            self.printed_at = time.monotonic()
        self.shown, self.state = text, state
        self.stream.flush()

    def say(self, line: str) -> None:
        """A line above the progress line (on a terminal, the progress line is drawn again under it)."""
        self.stream.write(("\r\033[K" if self.live else "") + line + "\n")
        if self.live and self.shown:
            self.stream.write(self.shown[:LIVE_CHARS])
        self.stream.flush()

    def end(self) -> None:
        if self.live and self.shown:
            self.stream.write("\n")
            self.stream.flush()
