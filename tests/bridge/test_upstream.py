"""The upstream pool in-process (`runtime/bridge/upstream.py`), against the stand-in upstream: what it keeps
once an answer is closed. Each answer read to its end used to stay in `finished` for good: a response
object a request, and work for the cycle collector. The body's end in the same read as `[DONE]` is the
case that kept them (released, never discarded); apart, the answer must still be drained, not aborted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from runtime.bridge.upstream import JSON_HEADERS, Upstream
from tests.support.bridge import start_stand_in

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
