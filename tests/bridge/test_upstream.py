"""The upstream pool in-process (`runtime/bridge/upstream.py`), against the stand-in upstream: what it keeps
once an answer is closed. Each answer read to its end used to stay in `finished` for good: a response
object a request, and work for the cycle collector. The body's end in the same read as `[DONE]` is the
case that kept them (released, never discarded); apart, the answer must still be drained, not aborted."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest

from runtime.bridge.upstream import JSON_HEADERS, Upstream
from tests.support.bridge import start_bridge, start_stand_in

pytestmark = pytest.mark.slow  # the stand-in upstream, a process

CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}).encode()


async def read_to_the_last_event(url: str, answers: int) -> Upstream:
    """`answers` streamed answers read to `[DONE]` as the bridge reads them (`finish`, then close)."""
    pool = Upstream(url)
    for _ in range(answers):
        async with pool.open("POST", "/v1/chat/completions", CHAT, JSON_HEADERS) as response:
            async for line in response.content:
                if line.strip() == b"data: [DONE]":
                    pool.finish(response)
                    break
    await pool.aclose()
    return pool


@pytest.mark.parametrize("end_apart_ms", ["0", "100"])  # the body's end with `[DONE]`, or after it (drained)
def test_answers_read_to_their_end_are_not_kept(end_apart_ms: str, tmp_path: Path) -> None:
    with start_stand_in(tmp_path / "upstream.log", "--tokens", "3", "--end-apart-ms", end_apart_ms) as upstream:
        pool = asyncio.run(read_to_the_last_event(upstream.url, 5))
        log = upstream.log()
    assert not pool.finished and pool.in_use == 0
    assert "abort requested" not in log and "dropped by its client" not in log


def test_with_vllms_own_data_parallelism_the_bridge_pins_each_conversation_to_one_rank(tmp_path: Path) -> None:
    """VL_DP=2 (the pod's bridge is told `--data-parallel 2`): every request of a conversation (Claude Code's session, Anthropic's route and the relayed one) asks
    vLLM for one data-parallel rank, the same each turn; conversations spread over both (vLLM's balancer spreads by
    load: an agent's next turn landed on the engine without its prefix)."""
    with start_stand_in(tmp_path / "upstream.log", "--tokens", "3") as upstream:
        with start_bridge(upstream.url, tmp_path / "bridge.log", {}, "--data-parallel", "2") as bridge:
            for turn in range(2):
                for session in range(8):
                    headers = {"x-claude-code-session-id": f"session-{session}", "anthropic-version": "2023-06-01"}
                    path, body = (("/v1/messages", {"model": "m", "max_tokens": 3, "messages": [
                        {"role": "user", "content": "hi"}]}) if turn == 0 else ("/v1/chat/completions", {
                        "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}))  # fmt: skip
                    answer = httpx.post(f"{bridge.url}{path}", json=body, headers=headers, timeout=30)
                    assert answer.status_code == 200, answer.text
        pins = re.findall(r"data-parallel rank (\d) for (\w+)", upstream.log())
    assert len(pins) == 16
    by_conversation: dict[str, set[str]] = {}
    for rank, key in pins:
        by_conversation.setdefault(key, set()).add(rank)
    assert len(by_conversation) == 8 and all(len(ranks) == 1 for ranks in by_conversation.values())
    assert set().union(*by_conversation.values()) == {"0", "1"}
