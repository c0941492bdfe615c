"""The test process's environment without the pod's variables, for a child that must see only its own."""

from __future__ import annotations

import os

POD_PREFIXES = ("VL_", "HF_")  # the runtime's settings and the Hub client's: a developer's own would leak in


def outer_environ(*also: str) -> dict[str, str]:
    """os.environ without VL_*, HF_* and the variables (or prefixes) in `also`."""
    return {k: v for k, v in os.environ.items() if not k.startswith((*POD_PREFIXES, *also))}
