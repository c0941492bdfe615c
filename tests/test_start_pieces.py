"""`runtime start`'s contracts that need no engine: a light path to vLLM's launch, and what it hands
the bridge (its own settings, as text the bridge reads back unchanged)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtime.settings import VARIABLES, Scope, load_settings


def test_the_bridge_reads_back_exactly_the_effective_bridge_settings() -> None:
    remote = {"VL_ALIASES": "claude-x, my-alias", "VL_BRIDGE_PING_S": "7.5", "VL_LOG_PROMPTS": "on"}
    effective = load_settings(
        {"VL_API_KEYS": "key-one-0123456789,ci:key-two-0123456789", "VL_MAX_BODY_MB": "8"}, remote
    )
    read_back = load_settings(effective.environ(Scope.BRIDGE))
    for variable in VARIABLES:
        if variable.scope is Scope.BRIDGE:
            assert getattr(read_back, variable.attr) == getattr(effective, variable.attr), variable.env


def test_engine_settings_stay_out_of_the_bridge_command() -> None:
    assert set(load_settings({"VL_CTX": "4096"}).environ(Scope.BRIDGE)) == {
        v.env for v in VARIABLES if v.scope is Scope.BRIDGE
    }


def test_the_path_to_the_engine_launch_imports_nothing_heavy() -> None:
    heavy = ("httpx", "huggingface_hub", "torch", "vllm", "starlette", "uvicorn", "tokenizers", "runtime.bridge")
    code = f"import sys, runtime.start; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.stdout.strip() == "[]"
