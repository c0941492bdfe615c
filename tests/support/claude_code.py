"""The real Claude Code CLI (pinned in docker/versions.toml, installed under tests/.node by
scripts/setup), run the way a user runs it non-interactively: offline, deterministic, no account."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.checks.endpoint import Endpoint
from runtime.client.environment import claude_environment
from tests.support.bridge import ROOT, Process
from tests.support.vllm_server import MAX_MODEL_LEN

CLAUDE = ROOT / "tests" / ".node" / "node_modules" / ".bin" / "claude"
# No telemetry, update check or error report: nothing but the model's traffic leaves the CLI.
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_MAX_RETRIES": "1",
}
TIMEOUT_S = 90


def require_claude_code() -> None:
    """Skip the calling module where Claude Code is not installed; in CI its absence is an error."""
    if CLAUDE.exists():
        return
    if os.environ.get("CI"):
        raise RuntimeError(f"Claude Code is not installed at {CLAUDE}: scripts/setup installs it")
    pytest.skip("Claude Code is not installed under tests/.node (scripts/setup installs it)", allow_module_level=True)


def stand_in_claude(folder: Path) -> Path:
    """A `claude` in `folder` (put it first on PATH) that writes the environment it was started with to the file
    $CLAUDE_SEEN names, then exits: what a command hands Claude Code, seen without running it. Returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "claude"
    script.write_text(
        f"#!{sys.executable}\nimport json, os\njson.dump(dict(os.environ), open(os.environ['CLAUDE_SEEN'], 'w'))\n"
    )
    script.chmod(0o755)
    return folder


def quiet_environment(home: Path) -> dict[str, str]:
    """A fresh HOME (no login, settings or history of the developer's), PATH, and QUIET."""
    return {"PATH": os.environ["PATH"], "HOME": str(home)} | QUIET


def run_claude(
    bridge: Process,
    model: str,
    arguments: list[str],
    workdir: Path,
    home: Path,
    environment: dict | None = None,
    key: str = "x",
    said: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`claude -p ARGUMENTS…` in `workdir` with what `runtime connect` prints for users (and no ANTHROPIC_API_KEY: it
    would win, and go to the paid API), `key` the pod's, plus `environment`; `said` on its standard input."""
    environment = (
        quiet_environment(home)
        | claude_environment(Endpoint(bridge.url, model, MAX_MODEL_LEN, key))
        | (environment or {})
    )
    return subprocess.run(
        [str(CLAUDE), "-p", *arguments], cwd=workdir, env=environment, input=said,
        stdin=subprocess.DEVNULL if said is None else None, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip


def parse_result(done: subprocess.CompletedProcess[str]) -> dict:
    """The JSON result of `claude -p … --output-format json`, once its exit code and error flag are checked."""
    assert done.returncode == 0, f"claude exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    result = json.loads(done.stdout)
    assert result["is_error"] is False, result
    return result
