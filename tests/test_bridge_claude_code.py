"""The real Claude Code CLI (pinned in docker/versions.toml, installed under tests/.node by
scripts/setup), non-interactive, through the bridge to real vLLM: offline and deterministic."""

from __future__ import annotations

import subprocess
from pathlib import Path

from runtime.connect import Endpoint, claude_environment
from runtime.engine import tinymodel as tiny
from tests.support.bridge import Process
from tests.support.claude_code import CLAUDE, TIMEOUT_S, parse_result, quiet_environment, require_claude_code
from tests.support.vllm_server import MAX_MODEL_LEN

require_claude_code()


def claude(bridge: Process, model: str, prompt: str, workdir: Path, home: Path, *options: str) -> dict:
    """`claude -p PROMPT --output-format json` in `workdir`; its JSON result (exit code checked)."""
    # What `runtime connect` prints for users, and no ANTHROPIC_API_KEY (it would win: the paid API).
    environment = quiet_environment(home) | claude_environment(Endpoint(bridge.url, model, MAX_MODEL_LEN, "x"))
    done = subprocess.run(
        [str(CLAUDE), "-p", prompt, "--output-format", "json", *options],
        cwd=workdir, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    return parse_result(done)


def test_a_text_turn(bridge: Process, tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    result = claude(bridge, "claude-tiny", f"Say hello {tiny.MARK_TEXT}", tmp_path, tmp_path / "home")
    assert result["result"] == tiny.ANSWER
    assert result["usage"]["input_tokens"] > 1000  # Claude Code's own system prompt and tools went through


def test_a_tool_round_trip_runs_the_command(bridge: Process, tmp_path: Path) -> None:
    """The model calls Bash; Claude Code runs it (its side effect is on disk) and sends the result back."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    result = claude(
        bridge, tiny.SERVED_NAME, f"Run the command {tiny.MARK_TOOL}", work, home, "--allowedTools", "Bash,Write"
    )
    assert (work / "proof.txt").read_text().strip() == "tiny-model-was-here"
    assert result["result"] == tiny.AFTER_TOOL and result["num_turns"] == 2
