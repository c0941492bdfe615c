"""The pod as the checks ask it: its bridge, the model it serves and that model's window; one unstreamed answer at a
time, salted prose of a given length, and each check's verdict (`Outcome`), failure and skip."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.checks.bounded import STREAM_BYTES, Answer, Limits, limits, request
from runtime.runpod.proxy import PUBLIC_PORT

DEFAULT_URL = f"http://127.0.0.1:{PUBLIC_PORT}"  # the pod's own bridge, from inside it
REQUEST_S = 900.0  # one near-full-window prefill on a slow card; a hung engine is a failure past it
MAX_COUNT = 2**40  # tokens: a count above it is no prompt's
SENTENCE = "The river bends past the mill, where the old clock keeps its own time and nobody minds. "


@dataclass(frozen=True)
class Outcome:
    """One check's verdict: passed, failed or skipped (it does not apply), and what it saw, in one line."""

    name: str
    status: str
    detail: str

    @property
    def ok(self) -> bool | None:
        return None if self.status == "skipped" else self.status == "passed"


class Pod:
    """The pod as the checks reach it: its bridge, the model it serves and that model's window."""

    def __init__(self, client: httpx.AsyncClient, model: str, window: int, bounds: Limits | None = None) -> None:
        self.client, self.model, self.window = client, model, window
        # Each request's total deadline and the most read of its answer (runtime.checks.bounded); a stream's cap is
        # STREAM_BYTES, its deadline the same.
        self.bounds = bounds or limits(REQUEST_S)
        self.stream_bounds = Limits(self.bounds.deadline_s, STREAM_BYTES)
        self.per_sentence: float | None = None  # tokens per SENTENCE, as the pod's tokenizer counts them

    async def post(self, path: str, body: dict[str, Any]) -> Answer:
        """One unstreamed POST, its whole answer read within the limits (OverLimit past them)."""
        return await request(self.client, "POST", path, self.bounds, body)

    async def ask(self, messages: list[dict[str, Any]], max_tokens: int = 32, **extra: Any) -> dict[str, Any]:
        """One unstreamed /v1/messages; CheckFailed on any refusal (its status and the bridge's own words)."""
        body = {"model": self.model, "max_tokens": max_tokens, "messages": messages, **extra}
        response = await self.post("/v1/messages", body)
        if response.status_code != 200:
            raise CheckFailed(f"answered {response.status_code}: {response.text[:200]}")
        try:
            answer = response.json()
        except ValueError:
            raise CheckFailed(f"answered 200 with no JSON: {response.text[:200]}") from None
        if not isinstance(answer, dict):
            raise CheckFailed(f"answered 200 with no message: {response.text[:200]}")
        return answer

    async def tokens(self, text: str) -> int:
        response = await self.post(
            "/v1/messages/count_tokens", {"model": self.model, "messages": [{"role": "user", "content": text}]}
        )
        if response.status_code != 200:
            raise CheckFailed(f"count_tokens answered {response.status_code}: {response.text[:200]}")
        try:
            counted = response.json()["input_tokens"]
        except (ValueError, KeyError, TypeError):
            raise CheckFailed(f"count_tokens answered 200 with no count: {response.text[:200]}") from None
        if isinstance(counted, bool) or not isinstance(counted, int) or not 0 < counted <= MAX_COUNT:
            raise CheckFailed(f"count_tokens answered a count that is no token count: {str(counted)[:40]}")
        return counted

    async def filler(self, tokens: int) -> str:
        """Salted prose of about `tokens` tokens (never cached from another prompt: its first words are random)."""
        if self.per_sentence is None:
            self.per_sentence = await self.tokens(SENTENCE * 64) / 64
        return f"[{secrets.token_hex(8)}] " + SENTENCE * max(1, int(tokens / self.per_sentence))


class CheckFailed(Exception):
    """A check's failure, in one line."""


class Skipped(Exception):
    """A check that does not apply to this pod; the message says why."""


def text_of(answer: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in answer.get("content", []) if block.get("type") == "text")


def quoted(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")
