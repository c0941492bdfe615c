"""What the image says about itself: the build facts (JSON) at VL_PREBAKED_MARKER.

The file's presence means "prebaked: install nothing at start"; its content (target, versions, git
revision, date) feeds the GPU check (the image's CUDA), the Space status page and the pod's console.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime.settings import is_secret


def read_image_facts(marker: Path) -> dict[str, Any] | None:
    """The marker's facts; None when there is no marker; {} when it holds no JSON object."""
    try:
        facts = json.loads(marker.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return facts if isinstance(facts, dict) else {}


def public_facts(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The build facts minus anything whose name says it is secret (`is_secret`), at any depth: what a
    page may show."""
    return {
        key: public_facts(value) if isinstance(value, Mapping) else value
        for key, value in facts.items()
        if not is_secret(key)
    }
