"""A RunPod secret the user never created reaches the pod as RunPod's own `{{ RUNPOD_SECRET_name }}`: every
setting refuses it with one line naming the secret to create and where, not the shape it happens to have."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.settings import VARIABLES, SettingsError, Variable, load_settings

ROOT = Path(__file__).resolve().parents[2]


def reference(name: str) -> str:
    """What a template's env holds in place of a secret (space/runpod.py's secret_reference)."""
    return f"{{{{ RUNPOD_SECRET_{name} }}}}"


def never_created(variable: str, secret: str) -> str:
    return (f"{variable}='{reference(secret)}': the RunPod secret {secret} was never created: create it in RunPod's "
            "console (Secrets)")  # fmt: skip


@pytest.mark.parametrize("variable", VARIABLES, ids=[v.env for v in VARIABLES])
def test_every_setting_names_the_secret_to_create(variable: Variable) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({variable.env: reference(variable.env)})
    assert str(caught.value) == never_created(variable.env, variable.env)


def test_a_reference_inside_a_secret_value_shows_the_reference_alone() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"VL_API_KEYS": f"alice:sk-alice-0123456789abcdef,{reference('BOB_KEY')}"})
    assert str(caught.value) == never_created("VL_API_KEYS", "BOB_KEY")
    assert "sk-alice" not in str(caught.value)


@pytest.mark.slow  # starts a Python process
def test_the_settings_command_says_it_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "settings"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"VL_API_KEYS": reference("VL_API_KEYS"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == never_created("VL_API_KEYS", "VL_API_KEYS") + "\n"
