"""Children that take Ctrl-C as they would at a terminal, whatever this process inherited; and stopped as a pod is.

A shell starts background jobs with SIGINT ignored (CI may run the tests so), an ignored signal stays
ignored in every child, and Python then never raises KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path


def ctrl_c_as_at_a_terminal() -> None:
    """A `preexec_fn`: SIGINT back to its default before the child's program starts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(process: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM, as RunPod's stop sends it, then SIGKILL after `grace_s`; waits for the end (a test's clean-up)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")
