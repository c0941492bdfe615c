"""What a client sends cannot forge, fill or poison the bridge's log, nor reach another client's request
through vLLM: real bridge processes in front of the stand-in upstream (`tests/support/upstream.py`), which ends
every stream of a name on an abort, as vLLM 0.32 does."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from pathlib import Path

import httpx
import pytest

from runtime.bridge.accounting import Refusals
from runtime.logsafe import CLIENT_VALUE_CHARS, PROMPT_CHARS
from runtime.pod.supervisor import until
from tests.support.bridge import SLOW_WAIT_S, start_bridge, start_stand_in

pytestmark = pytest.mark.slow  # bridge processes and the stand-in upstream

VALID = {"model": "claude-tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
# A newline and a CR that would forge a line, OSC 52 (clipboard) and OSC 0 (title), an 8-bit CSI.
FORGED = "a\nfake-log-line key=admin\r\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b]0;owned\x1b\\\x9b2J"
HUGE = 2**20  # chars of a model name: its field stays short all the same
LONG_PROMPT = 100_000  # chars: within the stand-in's window (a token per 4 bytes), far over the prompt's cap
# What reaches a terminal raw: C0 but tab and newline, DEL, C1.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
STREAM_TOKENS = 600  # the stream that stays: 3 s at 5 ms a token, still running when the other's abort comes


def test_client_values_cannot_forge_a_log_line_nor_fill_the_log(tmp_path: Path) -> None:
    """Model, x-request-id (obs-text bytes arrive as C1 characters) and, with VL_LOG_PROMPTS, the prompt:
    each escaped and capped in the trace line; the whole log holds no control character."""
    asks = [(FORGED, FORGED, b"id\x9b2J"), ("m" * HUGE, "p" * LONG_PROMPT, b"r" * 8000)]
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", "2") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log", {"VL_LOG_PROMPTS": "on"}) as bridge,
    ):
        traces = []
        for model, prompt, request_id in asks:
            body = VALID | {"model": model, "messages": [{"role": "user", "content": prompt}]}
            response = httpx.post(
                f"{bridge.url}/v1/messages", json=body, headers={"x-request-id": request_id}, timeout=60
            )
            assert response.status_code == 200, response.text
            traces.append(bridge.wait_for_log(f"trace id={response.json()['id']} "))
    log = bridge.log()
    assert not CONTROL.search(log), repr(CONTROL.search(log))
    assert not re.search(r"^fake-log-line", log, re.MULTILINE)
    forged, huge = traces
    assert f" model={FORGED!r} " in forged and f" prompt={FORGED!r}" in forged
    assert " client_id='id\\x9b2J' " in forged
    assert f" model={'m' * CLIENT_VALUE_CHARS}...(+{HUGE - CLIENT_VALUE_CHARS} chars) " in huge
    assert f" client_id={'r' * CLIENT_VALUE_CHARS}...(+{8000 - CLIENT_VALUE_CHARS} chars) " in huge
    assert huge.endswith(f" prompt={'p' * PROMPT_CHARS}...(+{LONG_PROMPT - PROMPT_CHARS} chars)")
    assert len(log) < 64 * 1024  # a 1 MiB model name: not a megabyte of log


def data_of(lines: list[str]) -> list[dict]:
    """The JSON payloads of a raw SSE stream, Anthropic's or OpenAI's (without OpenAI's `[DONE]`)."""
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def completed(route: str, lines: list[str]) -> tuple[str, str]:
    """(the answer's text, how it ended) from a raw Anthropic or OpenAI stream."""
    data = data_of(lines)
    if route == "/v1/messages":
        text = "".join(d["delta"].get("text", "") for d in data if d["type"] == "content_block_delta")
        return text, next(
            d["delta"]["stop_reason"] for d in data if d["type"] == "message_delta" and d["delta"]["stop_reason"]
        )
    choices = [choice for d in data for choice in d["choices"]]
    return "".join(c["delta"].get("content") or "" for c in choices), next(
        c["finish_reason"] for c in choices if c["finish_reason"]
    )


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/chat/completions"])
def test_a_reused_request_id_aborts_only_the_stream_that_left(route: str, tmp_path: Path) -> None:
    """vLLM aborts every generation under an id: two clients send the same x-request-id, one leaves (its
    generation is aborted by the bridge's id for it), the other's stream runs to its end."""
    shared = f"shared-{uuid.uuid4().hex}"
    body = VALID | {"max_tokens": STREAM_TOKENS, "stream": True}
    with (
        start_stand_in(tmp_path / "upstream.log", "--tokens", str(STREAM_TOKENS), "--pace-ms", "5") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log") as bridge,
    ):
        url, headers = f"{bridge.url}{route}", {"x-request-id": shared}
        with httpx.stream("POST", url, json=body, headers=headers, timeout=SLOW_WAIT_S) as staying:
            kept = staying.iter_lines()
            lines = [next(line for line in kept if line.startswith("data: "))]  # streaming upstream now
            with httpx.stream("POST", url, json=body, headers=headers, timeout=SLOW_WAIT_S) as leaving:
                next(line for line in leaving.iter_lines() if line.startswith("data: "))
            left = bridge.wait_for_log(f"trace id=\\S+ POST {route} .*stop=client_gone", SLOW_WAIT_S)
            left_id = trace_id(left)
            upstream.wait_for_log(f"abort requested: chatcmpl-{left_id}$", SLOW_WAIT_S)
            lines += list(kept)
        assert completed(route, lines) == (
            "tok " * STREAM_TOKENS,
            "end_turn" if route == "/v1/messages" else "stop",
        )
        stayed = bridge.wait_for_log(f"trace id=(?!{left_id} )\\S+ POST {route} ", SLOW_WAIT_S)
    assert "stream aborted" not in upstream.log()
    assert left.endswith(f" client_id={shared}") and stayed.endswith(f" client_id={shared}")
    assert shared not in (left_id, trace_id(stayed))


def trace_id(line: str) -> str:
    """The bridge's own id for a request, as its trace line gives it (and vLLM names the generation)."""
    found = re.search(r"trace id=(\S+)", line)
    assert found, line
    return found[1]


def test_refusals_of_an_interval_are_said_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "runtime.bridge")

    async def burst() -> None:
        refusals = Refusals(every_s=0.05)
        assert refusals.first(401, "authentication_error")  # the first is traced as any request is
        for _ in range(149):
            assert not refusals.first(401, "authentication_error")
        assert not refusals.first(431, "request_too_large")
        await until(lambda: "refused 150 more" in caplog.text)
        assert refusals.first(401, "authentication_error")  # a new interval: traced again

    asyncio.run(burst())
    [line] = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert line == (
        "refused 150 more requests without a valid key in 0.05 s: 149 x 401 authentication_error, "
        "1 x 431 request_too_large"
    )
