"""Why a turn missed the prompt cache: Anthropic's `diagnostics.cache_miss_reason`, from a fingerprint of each prompt.

A request's prompt is fingerprinted by part (model, system, tools, each message, and what else shapes the template:
thinking, tool choice); the previous request of the conversation is found by the id the client names
(`diagnostics.previous_message_id`) or, for the operator, as the agent's last one. The first part that differs is
the reason; when none differs but the engine read less of the prompt from its cache than the previous one held, the
prefix was evicted: said on the console, never sent as one of Anthropic's types.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime.bridge.schema import Diagnostics, MessagesRequest
from runtime.bridge.sessions import Asker

MAX_PROMPTS = 4096  # fingerprints kept, the least recently used forgotten first (a few KB each)
EVICTED = "evicted"  # the console's own reason: nothing changed, the engine's cache had dropped the prefix
# Below this many tokens a shortfall is the cache's block granularity and the answer's re-tokenized tail, not a loss.
EVICTION_SLACK_TOKENS = 256


def digest(encoded: bytes) -> bytes:
    return hashlib.blake2b(encoded, digest_size=8).digest()


@dataclass(slots=True)
class Fingerprint:
    """One prompt by part; `sizes` are the encoded messages' bytes (to share the tokens out when one changes), and
    `prompt_tokens` what the engine counted (set once answered)."""

    model: str
    system: bytes
    tools: bytes
    other: bytes  # thinking and tool choice: they change the rendered prompt too
    messages: tuple[bytes, ...]
    sizes: tuple[int, ...]
    head_size: int  # system and tools, encoded
    prompt_tokens: int = 0

    @classmethod
    def of(cls, request: MessagesRequest) -> Fingerprint:
        system, tools = msgspec.json.encode(request.system), msgspec.json.encode(request.tools)
        encoded = [msgspec.json.encode(message) for message in request.messages]
        return cls(
            model=request.model,
            system=digest(system),
            tools=digest(tools),
            other=digest(msgspec.json.encode([request.thinking, request.tool_choice])),
            messages=tuple(map(digest, encoded)),
            sizes=tuple(map(len, encoded)),
            head_size=len(system) + len(tools),
        )

    def missed_after(self, index: int | None) -> int:
        """The previous prompt's tokens from its message `index` on (all of them for None): what a change there
        cost, shared out by encoded size (Anthropic's own figure is approximate too)."""
        total = self.head_size + sum(self.sizes)
        kept = 0 if index is None else self.head_size + sum(self.sizes[:index])
        return round(self.prompt_tokens * (total - kept) / total) if total else self.prompt_tokens


def reason(previous: Fingerprint | None, current: Fingerprint) -> dict[str, Any] | None:
    """Anthropic's `cache_miss_reason` for `current` after `previous`; None when only messages were appended."""
    if previous is None:
        return {"type": "previous_message_not_found"}
    for kind, changed in (
        ("model_changed", previous.model != current.model),
        ("system_changed", previous.system != current.system),
        ("tools_changed", previous.tools != current.tools),
    ):
        if changed:
            return {"type": kind, "cache_missed_input_tokens": previous.missed_after(None)}
    pairs = zip(previous.messages, current.messages, strict=False)
    edited = [index for index, (was, now) in enumerate(pairs) if was != now]
    if edited or len(current.messages) < len(previous.messages):
        first = edited[0] if edited else len(current.messages)
        return {"type": "messages_changed", "cache_missed_input_tokens": previous.missed_after(first)}
    if previous.other != current.other:
        return {"type": "unavailable"}
    return None


@dataclass
class Prompts:
    """The fingerprints of the prompts answered lately, by key and message id (a key finds only its own), and each
    agent's last message id: bounded, the least recently used forgotten first, a key past its share its own first."""

    capacity: int = MAX_PROMPTS
    per_key: int = MAX_PROMPTS // 4
    by_id: OrderedDict[tuple[str, str], Fingerprint] = field(default_factory=OrderedDict)
    last: OrderedDict[tuple[str, str, str], str] = field(default_factory=OrderedDict)
    held: Counter[str] = field(default_factory=Counter)

    def find(self, key: str, message_id: str | None) -> Fingerprint | None:
        if message_id is None:
            return None
        found = self.by_id.get((key, message_id))
        if found is not None:
            self.by_id.move_to_end((key, message_id))
        return found

    def last_of(self, key: str, session: str | None, agent: str) -> Fingerprint | None:
        return self.find(key, self.last.get((key, session, agent))) if session is not None else None

    def keep(self, key: str, session: str | None, agent: str, message_id: str, fingerprint: Fingerprint) -> None:
        self.by_id[(key, message_id)] = fingerprint
        self.held[key] += 1
        if session is not None:
            self.last[(key, session, agent)] = message_id
            self.last.move_to_end((key, session, agent))
        if self.held[key] > self.per_key:
            self.forget(next(known for known in self.by_id if known[0] == key))
        while len(self.by_id) > self.capacity:
            self.forget(next(iter(self.by_id)))
        while len(self.last) > self.capacity:
            self.last.popitem(last=False)

    def forget(self, known: tuple[str, str]) -> None:
        del self.by_id[known]
        self.held[known[0]] -= 1


class CacheCheck:
    """One request's diagnosis: what the client is told (`answer`, when it asked) and, once the engine has counted
    the prompt, what the console says (`settle`)."""

    def __init__(self, prompts: Prompts, asker: Asker, request: MessagesRequest, message_id: str) -> None:
        self.prompts, self.asker, self.message_id = prompts, asker, message_id
        self.fingerprint = Fingerprint.of(request)
        asked = request.diagnostics
        if isinstance(asked, Diagnostics) and asked.previous_message_id is not None:
            self.previous = prompts.find(asker.key, asked.previous_message_id)
            self.miss = reason(self.previous, self.fingerprint)
        else:  # the first turn (`null` opts in), or the operator's own view: the agent's last prompt
            self.previous = prompts.last_of(asker.key, asker.session, asker.agent)
            self.miss = reason(self.previous, self.fingerprint) if self.previous is not None else None
        # Anthropic's `diagnostics`: absent unless asked; null when no divergence was found.
        self.answer: Any = msgspec.UNSET
        if isinstance(asked, Diagnostics):
            self.answer = {"cache_miss_reason": self.miss} if self.miss and asked.previous_message_id else None

    def settle(self, prompt_tokens: int, cached_tokens: int) -> str | None:
        """Keep this prompt's fingerprint; the console's reason: Anthropic's type, or `evicted` when nothing changed
        and yet the engine read less of the prefix than the previous prompt left in its cache."""
        self.fingerprint.prompt_tokens = prompt_tokens
        asker = self.asker
        self.prompts.keep(asker.key, asker.session, asker.agent, self.message_id, self.fingerprint)
        if self.miss is not None:
            return str(self.miss["type"])
        if self.previous is not None and cached_tokens + EVICTION_SLACK_TOKENS < self.previous.prompt_tokens:
            return EVICTED
        return None
