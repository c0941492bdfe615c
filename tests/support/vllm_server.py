"""`vllm_server`: ONE real vLLM OpenAI server per test session, serving the tiny scripted model.

vLLM costs ~3 GB and ~30 s to start on this machine, so every test that needs an engine shares
this one. It is started from `engine_command`, as a pod starts it (the tiny recipe behind the bridge:
loopback, a free port), with request logging added; it is stopped (its whole process group) when
the session ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.engine.command import engine_command
from runtime.engine.recipes import load_recipe
from runtime.engine.tinymodel import write_tiny_model
from runtime.settings import load_settings
from tests.support.environ import outer_environ
from tests.support.net import free_port
from tests.support.polling import wait_for_log_line, wait_until

MAX_MODEL_LEN = load_recipe("tiny").default_window  # the recipe's: room for Claude Code's own 15-25k-token prompts
START_TIMEOUT_S = 300.0  # ~25 s alone; more while other tests share the cores (pytest-timeout: 600 s)
STOP_TIMEOUT_S = 30.0
PORT_ATTEMPTS = 3  # the port is free when chosen, and may be taken before vLLM binds it
LOG_TAIL_CHARS = 6000


@dataclass(frozen=True)
class VllmServer:
    """A running vLLM: where it listens, what it serves, and its log."""

    port: int
    model: str
    max_model_len: int
    log_path: Path
    model_dir: Path

    @property
    def url(self) -> str:
        """The server's root, e.g. http://127.0.0.1:PORT (vLLM's own routes: /health, /tokenize...)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        """The base URL an OpenAI client takes."""
        return f"{self.url}/v1"

    def log(self) -> str:
        """Everything vLLM has logged so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        return self.log()[-chars:]

    def wait_for_log(self, pattern: str, timeout_s: float = 30.0) -> str:
        """The first log line that matches the regex `pattern`, once vLLM has written it."""
        return wait_for_log_line(self.log, pattern, timeout_s)

    def metric(self, name: str) -> float:
        """The sum of a Prometheus metric's samples, all labels together, on vLLM's `/metrics`."""
        text = httpx.get(f"{self.url}/metrics", timeout=30.0).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if re.match(rf"{name}[{{ ]", line))

    def wait_for_abort(self, generation_id: str, timeout_s: float) -> None:
        """Wait until vLLM was asked to abort `generation_id` by that very name (vLLM's own abort on a
        disconnect names the engine's internal id, `<id>-<hex>`), then until nothing runs any more."""
        self.wait_for_log(rf"Aborted request\(s\) {re.escape(generation_id)}\.(?:\s|$)", timeout_s)
        wait_until(
            lambda: self.metric("vllm:num_requests_running") == 0, "vLLM to run no request", timeout_s, every_s=0.5
        )


def engine_environ(model_dir: Path, state_dir: Path, port: int, fastok: str = "off") -> dict[str, str]:
    """The pod's settings for a test engine: the tiny recipe behind the bridge, as a pod runs it."""
    return outer_environ() | {
        "VL_MODEL": "tiny",
        "VL_REPO": str(model_dir),
        "VL_VENV": sys.prefix,
        "VL_STATE_DIR": str(state_dir),
        "VL_ENGINE_PORT": str(port),
        "VL_FASTOK": fastok,  # the session's: off (tests/engine/test_fastokens.py runs its own engine with it on)
        "VL_EXTRA_ARGS": " ".join(TEST_ONLY_ARGS),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


TEST_ONLY_ARGS = (
    "--enable-log-requests",  # the bridge tests read aborts of disconnected clients in the log
    "--trust-request-chat-template",  # tests render prompts with a recipe-like template (test_history_reasoning)
)


@contextmanager
def serving(root: Path, fastok: str = "off") -> Iterator[VllmServer]:
    """A vLLM started from `engine_command` (the tiny model written under `root`), until the `with` ends."""
    model_dir = write_tiny_model(root / "model")
    for _ in range(PORT_ATTEMPTS):
        environ = engine_environ(model_dir, root / "state", free_port(), fastok)
        command = engine_command(load_settings(environ), environ=environ)
        server = VllmServer(command.port, command.served_names[0], command.window, root / "vllm.log", model_dir)
        process = launch(command.argv, environ | dict(command.env), server.log_path)
        try:
            if wait_until_ready(server, process):
                yield server
                return
        finally:
            stop(process)
    pytest.fail(f"vLLM found its port taken {PORT_ATTEMPTS} times; its log ends:\n{server.log_tail()}")


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    with serving(tmp_path_factory.mktemp("vllm")) as server:
        yield server


def launch(argv: Sequence[str], environ: dict[str, str], log_path: Path) -> subprocess.Popen:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,  # its own process group: the engine core child goes with it
        )


def wait_until_ready(server: VllmServer, process: subprocess.Popen, timeout_s: float = START_TIMEOUT_S) -> bool:
    """True once `/health` answers 200 and `/v1/models` lists the model; False if another process
    took the port first (vLLM exits at once); otherwise fail with vLLM's log tail."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=server.url, timeout=5.0) as client:
        while not is_ready(client, server.model):
            if process.poll() is not None:
                if "Address already in use" in server.log():
                    return False
                pytest.fail(
                    f"vLLM {how_it_ended(process.returncode)} while starting; its log ends:\n{server.log_tail()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM was not ready after {timeout_s:g} s; its log ends:\n{server.log_tail()}")
            time.sleep(0.5)
    return True


def how_it_ended(returncode: int) -> str:
    """E.g. "exited with 1", or "was killed by SIGTERM" (not by us: someone else's cleanup)."""
    return f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else f"exited with {returncode}"


def is_ready(client: httpx.Client, model: str) -> bool:
    try:
        if client.get("/health").status_code != 200:
            return False
        models = client.get("/v1/models")
        return models.status_code == 200 and model in {m["id"] for m in models.json()["data"]}
    except httpx.TransportError:
        return False


def stop(process: subprocess.Popen) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left after STOP_TIMEOUT_S."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(STOP_TIMEOUT_S)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the engine core child may outlive the API server
    process.wait()
