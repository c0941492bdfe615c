"""The real Claude Code CLI (pinned in docker/versions.toml, installed under tests/.node by
scripts/setup), non-interactive, through the bridge to real vLLM: offline and deterministic."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from runtime import tinymodel as tiny
from tests.support.bridge import ROOT, Process

CLAUDE = ROOT / "tests" / ".node" / "node_modules" / ".bin" / "claude"

if not CLAUDE.exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"Claude Code is not installed at {CLAUDE}: scripts/setup installs it")
    pytest.skip("Claude Code is not installed under tests/.node (scripts/setup installs it)", allow_module_level=True)


def claude(bridge: Process, model: str, prompt: str, workdir: Path, home: Path, *options: str) -> dict:
    """`claude -p PROMPT --output-format json` in `workdir`; its JSON result (exit code checked)."""
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),  # a fresh one: no login, no settings, no history of the developer's
        "ANTHROPIC_BASE_URL": bridge.url,
        "ANTHROPIC_AUTH_TOKEN": "x",  # and no ANTHROPIC_API_KEY: it would win and go to the paid API
        "ANTHROPIC_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "1",
    }
    done = subprocess.run(
        [str(CLAUDE), "-p", prompt, "--output-format", "json", *options],
        cwd=workdir, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, f"claude exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    result = json.loads(done.stdout)
    assert result["is_error"] is False, result
    return result


def test_a_text_turn(bridge: Process, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    result = claude(bridge, "claude-tiny", f"Say hello {tiny.MARK_TEXT}", tmp_path, tmp_path / "home")
    assert result["result"] == tiny.ANSWER
    assert result["usage"]["input_tokens"] > 1000  # Claude Code's own system prompt and tools went through


def test_a_tool_round_trip_runs_the_command(bridge: Process, tmp_path: Path) -> None:
    """The model calls Bash; Claude Code runs it (its side effect is on disk) and sends the result back."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    result = claude(bridge, tiny.SERVED_NAME, f"Run the command {tiny.MARK_TOOL}", work, home, "--allowedTools", "Bash,Write")
    assert (work / "proof.txt").read_text().strip() == "tiny-model-was-here"
    assert result["result"] == tiny.AFTER_TOOL and result["num_turns"] == 2
