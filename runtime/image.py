"""What the image says about itself: the build facts (JSON) at VL_PREBAKED_MARKER.

The file's presence means "prebaked: install nothing at start"; its content (target, versions, git
revision, date) feeds the GPU check (the image's CUDA) and the Space status page.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_image_facts(marker: Path) -> dict[str, Any] | None:
    """The marker's facts; None when there is no marker; {} when it holds no JSON object."""
    try:
        facts = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return facts if isinstance(facts, dict) else {}
