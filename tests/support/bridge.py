"""The bridge as users run it (`python -m runtime bridge …`, a subprocess on a free port), and the
stand-in upstream (`tests/support/upstream.py`) for the few faults that a shared vLLM cannot play.

`bridge`: one bridge per session in front of the session's vLLM. `start_bridge(...)`: one with
its own settings or upstream, for a test that needs them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.pod.children import bridge_argv
from tests.support.polling import wait_for_log_line, wait_until
from tests.support.vllm_server import VllmServer

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0
LISTENING = re.compile(r"(?:Uvicorn running on|listening on) http://127\.0\.0\.1:(\d+)")
ALIASES = "sonnet-for-tests haiku-for-tests[1m]"
# Tokens of MARK_LONG for a stream that should still be running when a test acts on it: about a
# minute of the tiny model, all the window allows. Not a promise: this machine sometimes stalls every
# process but vLLM's for a minute (the kernel logs "workqueue lockup"), so a test that needs a stream
# to outlast anything uses the stand-in upstream's hour-long one instead.
LONG_STREAM_TOKENS = 60000
SLOW_WAIT_S = 120.0  # for waits on a log line: generous, for the reason above and other test suites


@dataclass
class Process:
    """A server started by a test: its URL, its process and its log."""

    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout_s: float = 30.0) -> str:
        return wait_for_log_line(self.log, pattern, timeout_s)


@contextmanager
def started(argv: list[str], log_path: Path, env: dict[str, str]) -> Iterator[Process]:
    """Run `argv` until the `with` ends; ready once it logs the address it listens on."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )

    def listening() -> re.Match[str] | None:
        if process.poll() is not None:
            pytest.fail(f"{argv[1:4]} exited while starting; its log:\n{log_path.read_text(errors='replace')[-4000:]}")
        return LISTENING.search(log_path.read_text(errors="replace"))

    try:
        found = wait_until(listening, f"{argv[1:4]} to listen", START_TIMEOUT_S, every_s=0.05)
        yield Process(f"http://127.0.0.1:{found.group(1)}", process, log_path)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def pod_status(url: str, key: str) -> dict:
    """`GET /v1/pod/status` with `key` as a Bearer token: the console's data; fails unless it answers 200."""
    response = httpx.get(f"{url}/v1/pod/status", headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def clean_environment(settings: dict[str, str]) -> dict[str, str]:
    """This process's environment without any VL_* of the developer's, plus `settings`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("VL_")} | settings


@contextmanager
def start_bridge(
    upstream: str, log_path: Path, settings: dict[str, str] | None = None, *options: str
) -> Iterator[Process]:
    argv = [*bridge_argv(upstream, "127.0.0.1", 0), *options]  # the pod's own command, on a free port
    with started(argv, log_path, clean_environment(settings or {})) as bridge:
        yield bridge


@contextmanager
def start_stand_in(log_path: Path, *options: str) -> Iterator[Process]:
    """`tests/support/upstream.py`: a scripted OpenAI-style streaming server (pace, silence, length)."""
    with started(
        [sys.executable, "-m", "tests.support.upstream", "--port", "0", *options], log_path, clean_environment({})
    ) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def bridge(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The bridge in front of the session's vLLM, with a short ping interval and two aliases."""
    log_path = tmp_path_factory.mktemp("bridge") / "bridge.log"
    with start_bridge(vllm_server.url, log_path, {"VL_ALIASES": ALIASES, "VL_BRIDGE_PING_S": "1"}) as running:
        yield running
