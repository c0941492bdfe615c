"""Children that take Ctrl-C as they would at a terminal, whatever this process inherited.

A shell starts background jobs with SIGINT ignored (CI may run the tests so), an ignored signal stays
ignored in every child, and Python then never raises KeyboardInterrupt.
"""

from __future__ import annotations

import signal


def ctrl_c_as_at_a_terminal() -> None:
    """A `preexec_fn`: SIGINT back to its default before the child's program starts."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
