"""Every `VL_MODEL=` and `VL_SWAP=` example of the README is accepted by the settings: a reader copies them.

The README's first VL_SWAP example once named a recipe the project did not ship (`qwen38nvfp4`), and a pod
started with it stopped at its first line.
"""

from __future__ import annotations

import re
from pathlib import Path

from runtime.settings import SettingsError, load_settings

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLE = re.compile(r"\b(VL_MODEL|VL_SWAP)=(\"[^\"]*\"|'[^']*'|[\w.:,-]+)")
KEYS = "me:sk-0123456789abcdef0123456789abcdef"  # VL_SWAP needs keys (the README's example sets them first)


def test_every_model_example_of_the_readme_is_accepted_by_the_settings() -> None:
    examples = EXAMPLE.findall(README.read_text())
    assert {name for name, _ in examples} == {"VL_MODEL", "VL_SWAP"}, "the pattern no longer finds the examples"
    refused = []
    for name, value in examples:
        try:
            load_settings({name: value.strip("\"'"), "VL_API_KEYS": KEYS})
        except SettingsError as error:
            refused.append(str(error))
    assert refused == []
