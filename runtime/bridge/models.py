"""The served model as the bridge knows it: its names, its context window, the names it answers to, and
its traits (what the translation must know of it).

Learnt from the upstream's `/v1/models` (vLLM reports `max_model_len` there), polled until the
engine answers and then now and again, because an engine restart may bring another model while the
bridge keeps running. Any model name a client sends is accepted: one engine, one model (the client
picks a label, not an engine — Claude Code refuses to send names it does not like).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import msgspec

from runtime.bridge.errors import BridgeError
from runtime.bridge.translate import Traits
from runtime.bridge.upstream import JSON_HEADERS, Upstream
from runtime.units import UTC_STAMP

log = logging.getLogger("runtime.bridge")

ONE_MILLION = "[1m]"  # Claude Code assumes a 1M window for ids ending so (the seeds' compaction fix)


@dataclass(frozen=True)
class ServedModel:
    name: str  # the first id the upstream lists: the model vLLM serves by default
    context_window: int
    upstream_ids: frozenset[str] = field(default_factory=frozenset)
    created: int = field(default=0, compare=False)  # vLLM stamps its listing with the time of asking


class Catalog:
    """The served model, once known, its traits, and the public names derived from it and from VL_ALIASES."""

    def __init__(self, aliases: Sequence[str] = (), thinks_unasked: bool = False) -> None:
        self.aliases = tuple(aliases)
        self.model: ServedModel | None = None
        self.traits = Traits(thinks_unasked=thinks_unasked)
        # Models a request may ask for that the engine does not serve now, with their windows (VL_SWAP).
        self.others: Callable[[], dict[str, int]] = dict

    def refused_thinking_budget(self) -> None:
        """vLLM refused `thinking_token_budget`: this engine runs without a reasoning parser, so no request
        sends one again until the model changes (a restart may bring a parser)."""
        self.traits = replace(self.traits, thinking_budget=False)

    def learn(self, listing: bytes) -> bool:
        """Read an OpenAI `/v1/models` body; True when the model changed. ValueError when it lists none."""
        data = msgspec.json.decode(listing).get("data") or []
        if not data:
            raise ValueError("the upstream lists no model")
        first = data[0]
        model = ServedModel(
            name=first["id"],
            context_window=int(first.get("max_model_len") or 0),
            created=int(first.get("created") or 0),
            upstream_ids=frozenset(entry["id"] for entry in data),
        )
        if model == self.model:
            return False
        log.info("serving model %r, context window %d tokens", model.name, model.context_window)
        self.model, self.traits = model, replace(self.traits, thinking_budget=True)
        return True

    async def refresh(self, upstream: Upstream) -> ServedModel:
        """Ask the upstream now; BridgeError(529) while it cannot say."""
        status, body, _ = await upstream.fetch("GET", "/v1/models")
        if status != 200:
            raise BridgeError(529, f"the model server is not ready (GET /v1/models answered {status})")
        try:
            changed = self.learn(body)
        except (ValueError, KeyError, TypeError, AttributeError, msgspec.DecodeError) as error:
            raise BridgeError(529, f"the model server's model list is unusable: {error}") from None
        if changed:
            await self.probe_inline_system(upstream)
        assert self.model is not None
        return self.model

    async def probe_inline_system(self, upstream: Upstream) -> None:
        """Render [system, user, system, user] through /tokenize: does the template take it?"""
        turns = [{"role": role, "content": "x"} for role in ("system", "user", "system", "user")]
        status, _, _ = await upstream.fetch("POST", "/tokenize", msgspec.json.encode({"messages": turns}), JSON_HEADERS)
        self.traits = replace(self.traits, inline_system=status == 200)
        if status != 200:
            log.info("the chat template refuses inline system messages: they are sent as user messages")

    async def current(self, upstream: Upstream) -> ServedModel:
        return self.model or await self.refresh(upstream)

    async def watch(self, upstream: Upstream, settled_every_s: float = 30.0) -> None:
        """Poll every second until the model is known, then every `settled_every_s` (runs until cancelled)."""
        while True:
            with contextlib.suppress(BridgeError):  # vLLM not answering yet: asked again below
                await self.refresh(upstream)
            await asyncio.sleep(1.0 if self.model is None else settled_every_s)

    @property
    def upstream_name(self) -> str | None:
        """The `model` sent upstream: the served model's own name whatever was asked (every name vLLM
        serves is that one model, and the router in front of several engines knows it by that name
        alone); None while no model is known (vLLM then takes its own)."""
        return self.model.name if self.model is not None else None

    def names(self) -> list[str]:
        """Public ids: the served name bare (Claude Code honours CLAUDE_CODE_MAX_CONTEXT_TOKENS only for
        ids not starting with `claude-`), `claude-<name>`, `<name>[1m]`, vLLM's other names, VL_ALIASES."""
        if self.model is None:
            return []
        name = self.model.name
        prefixed = name if name.startswith("claude-") else f"claude-{name}"
        others = sorted(self.model.upstream_ids - {name})
        return list(dict.fromkeys([name, prefixed, name + ONE_MILLION, *others, *self.aliases, *self.others()]))

    def anthropic_info(self, model_id: str) -> dict[str, Any]:
        """One entry of Anthropic's `/v1/models`, with the context window; Claude Code's model picker
        shows `display_name` and `description`."""
        assert self.model is not None
        created = datetime.fromtimestamp(self.model.created, UTC).strftime(UTC_STAMP)
        window, description = self.model.context_window, f"{self.model.name} on this pod's vLLM"
        if (other := self.others().get(model_id)) is not None:  # VL_SWAP: loaded on the first request for it
            window, description = other or window, f"{model_id}, loaded on this pod's vLLM when asked for"
        return {
            "type": "model",
            "id": model_id,
            "display_name": model_id,
            "description": f"{description}, {window:,}-token window",
            "created_at": created,
            "lifecycle": "active",
            "max_input_tokens": window,
            "max_tokens": window,
        }

    def anthropic_listing(self) -> dict[str, Any]:
        """Every public id, those naming `claude` first: Claude Code's discovery keeps only ids that
        contain `claude` or `anthropic`. The list is short and always whole (`limit` has nothing to cut)."""
        names = sorted(self.names(), key=lambda name: "claude" not in name.lower())  # stable: the order of names()
        data = [self.anthropic_info(name) for name in names]
        return {
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
