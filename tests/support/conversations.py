"""Claude Code-shaped conversations for the tests of several engines or pods: a shared system prompt, then
each session's own growing history, under its `x-claude-code-session-id`; and which engine served them,
read from each engine's own metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from tests.support.sdk import anthropic

SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude. " + "Keep to the repository's conventions. " * 40


@dataclass
class Conversation:
    session: str
    messages: list[dict] = field(default_factory=list)

    def turn(self, client: anthropic.Anthropic, n: int) -> anthropic.types.Message:
        self.messages.append(
            {"role": "user", "content": f"{self.session}, turn {n}: " + "edit main.py and test it. " * 30}
        )
        answer = client.messages.create(
            model="claude-tiny", max_tokens=8, system=SYSTEM, messages=self.messages,
            extra_headers={"x-claude-code-session-id": self.session},
        )  # fmt: skip
        text = "".join(block.text for block in answer.content if block.type == "text") or "Done."
        self.messages.append({"role": "assistant", "content": text})
        return answer


def served(ports: tuple[int, ...]) -> list[float]:
    """Conversation turns each engine has finished: its requests of more than 100 prompt tokens (the
    supervisor's one-token health probes, a sentence each, also count as requests)."""
    return [long_requests(port) for port in ports]


def long_requests(port: int) -> float:
    """Requests of more than 100 prompt tokens the engine on `port` has finished, from its histogram."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    count = short = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:request_prompt_tokens_count"):
            count += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:request_prompt_tokens_bucket") and 'le="100.0"' in line:
            short += float(line.rsplit(" ", 1)[1])
    return count - short


def grown(before: list[float], after: list[float]) -> list[float]:
    return [a - b for a, b in zip(after, before, strict=True)]


@dataclass
class Endpoint:
    """A pod of several engines as its tests reach it: its bridge and key, each engine's port, the router's."""

    url: str
    key: str
    engines: tuple[int, ...]
    router_port: int

    def health(self) -> dict:
        """/health as a key's holder reads it (anyone else gets the condition alone)."""
        return httpx.get(f"{self.url}/health", headers={"x-api-key": self.key}, timeout=10).json()

    def served(self) -> list[float]:
        return served(self.engines)

    def routes_to_all(self) -> bool:
        """The router sends to every engine (it takes an engine a few seconds after it loads)."""
        try:
            workers = httpx.get(f"http://127.0.0.1:{self.router_port}/workers", timeout=5).json()["workers"]
        except (httpx.HTTPError, ValueError, KeyError):
            return False
        return sum(1 for worker in workers if worker.get("is_healthy")) == len(self.engines)

    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.key, max_retries=0, timeout=120)


def where_sessions_land(client: anthropic.Anthropic, engines: tuple[int, ...], sessions: tuple[str, ...]) -> list[int]:
    """Three turns of each session, one session after the other: the engine that served all of a session's
    turns (none other served any), each later turn read in part from the prefix cache. Which engine takes
    a new session is the router's choice: measured side by side in a quiet run, it spread them; under a
    loaded CI machine it once gave two sessions to the same engine, so the tests do not assert it."""
    landed = []
    for session in sessions:
        conversation, before = Conversation(session), served(engines)
        answers = [conversation.turn(client, n) for n in range(1, 4)]
        grew = grown(before, served(engines))
        assert sorted(grew) == [0.0] * (len(engines) - 1) + [3.0], f"{session}'s three turns were served as {grew}"
        landed.append(grew.index(3))
        assert all((answer.usage.cache_read_input_tokens or 0) > 0 for answer in answers[1:])
    return landed
