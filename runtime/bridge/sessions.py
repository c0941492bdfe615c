"""Who asked, and what each agent of a Claude Code session consumed.

Claude Code (2.1.139 and later) names the session and the agent of every request in headers, and with
CLAUDE_CODE_GATEWAY_HINT_HEADERS=1 its request class. They are the client's own text: cleaned and cut
to MAX_ID_CHARS, and only the MAX_SESSIONS sessions seen last are kept, at most MAX_KEY_SESSIONS of one key,
MAX_AGENTS agents each (the rest counted as one), so no client can grow the bridge's memory or a metric's
labels, nor one key push the others' sessions out of the console. The admins' own sessions (MAX_KEY_SESSIONS
each, on top) are never given up for another key's, and the console lists the viewer's own first: whatever the
other keys send, the owner sees their own sessions.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.bridge.affinity import AGENT_HEADER, SESSION_HEADER
from runtime.bridge.usage import Spent, cost_of

PARENT_HEADER = "x-claude-code-parent-agent-id"
CLASS_HEADER = "x-claude-code-request-class"
COMPACTED_HEADER = "x-claude-code-context-compacted"
# Claude Code 2.1.332's classes; another is counted as "other", a request that says none as "none".
REQUEST_CLASSES = frozenset({"main", "subagent", "workflow", "compaction", "auxiliary", "side_reply"})
# Its other hints, each counted as the classes are: what Anthropic's own API is told of the request's class (whether
# a user waits on it), and which memory pass an auxiliary request is.
FIRST_PARTY_CLASS_HEADER = "x-claude-1p-request-class"
FIRST_PARTY_CLASSES = frozenset(
    {"main", "blocking-subagent", "background-task", "followup-generation", "summary-extraction"}
)
AUXILIARY_HEADER = "x-claude-code-auxiliary-type"
AUXILIARY_TYPES = frozenset({"memory_save", "cowork_memory_save"})
MAIN = "main"  # the agent of a request that names none: the session's own
OTHERS = "others"  # the agents of a session past MAX_AGENTS, together
MAX_ID_CHARS = 64
MAX_SESSIONS = 32
MAX_KEY_SESSIONS = 8  # one key's share: ~33 refused requests with new session ids erased every other key's
MAX_AGENTS = 64
TTFT_SAMPLES = 32  # each agent's last times to first token, for its median
NOT_AN_ID_CHAR = re.compile(r"[^A-Za-z0-9._:-]")


def one_of(headers: Mapping[str, str], name: str, known: frozenset[str]) -> str:
    """A hint header's value as counted: one of `known`, "other" for another, "none" when the request says none."""
    said = headers.get(name, "").strip().lower()
    return (said if said in known else "other") if said else "none"


def client_id(value: str | None) -> str | None:
    """A client-chosen id as the bridge keeps it: letters, digits and `._:-` only, MAX_ID_CHARS at most."""
    cleaned = NOT_AN_ID_CHAR.sub("", (value or "")[: MAX_ID_CHARS * 4])[:MAX_ID_CHARS]
    return cleaned or None


@dataclass(frozen=True)
class Asker:
    """One request's origin: the key's label, and what Claude Code said of its session and agent."""

    key: str
    session: str | None = None
    agent: str = MAIN
    parent: str | None = None
    request_class: str = "none"
    compacted: bool = False
    first_party_class: str = "none"
    auxiliary_type: str = "none"

    @classmethod
    def of(cls, headers: Mapping[str, str], key: str) -> Asker:
        agent = client_id(headers.get(AGENT_HEADER))
        return cls(
            key=key,
            session=client_id(headers.get(SESSION_HEADER)),
            agent=agent or MAIN,
            parent=client_id(headers.get(PARENT_HEADER)) or (MAIN if agent else None),
            request_class=one_of(headers, CLASS_HEADER, REQUEST_CLASSES),
            compacted=headers.get(COMPACTED_HEADER, "").strip().lower() in ("1", "true"),
            first_party_class=one_of(headers, FIRST_PARTY_CLASS_HEADER, FIRST_PARTY_CLASSES),
            auxiliary_type=one_of(headers, AUXILIARY_HEADER, AUXILIARY_TYPES),
        )


@dataclass
class AgentUsage:
    agent: str
    parent: str | None
    key: str
    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    busy_s: float = 0.0
    compactions: int = 0
    classes: Counter[str] = field(default_factory=Counter)
    cache_misses: Counter[str] = field(default_factory=Counter)  # by reason (runtime.bridge.cachemiss)
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=TTFT_SAMPLES))

    def add(self, asker: Asker, spent: Spent) -> None:
        self.requests += 1
        self.input_tokens += spent.input_tokens
        self.cached_tokens += spent.cached_tokens
        self.output_tokens += spent.output_tokens
        self.busy_s += spent.busy_s
        self.compactions += asker.request_class == "compaction"
        self.classes[asker.request_class] += 1
        if asker.first_party_class != "none":
            self.classes[f"1p:{asker.first_party_class}"] += 1
        if asker.auxiliary_type != "none":
            self.classes[f"auxiliary:{asker.auxiliary_type}"] += 1
        if spent.ttft_s is not None:
            self.ttfts.append(spent.ttft_s)
        if spent.cache_miss is not None:
            self.cache_misses[spent.cache_miss] += 1

    def as_json(self, cost_per_hour: float | None) -> dict[str, Any]:
        prompt = self.input_tokens + self.cached_tokens
        return {
            "agent": self.agent,
            "parent": self.parent,
            "key": self.key,
            "requests": self.requests,
            "classes": dict(sorted(self.classes.items())),
            "compactions": self.compactions,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "prefix_cache_hit_rate": round(self.cached_tokens / prompt, 4) if prompt else None,
            "cache_misses": dict(sorted(self.cache_misses.items())),
            "ttft_p50_s": round(statistics.median(self.ttfts), 4) if self.ttfts else None,
            "busy_s": round(self.busy_s, 3),
            "cost": cost_of(self.busy_s, cost_per_hour),
        }


@dataclass
class Session:
    id: str
    key: str  # whose: a session id is the client's to choose, so two keys' same id are two sessions
    last_seen: float
    agents: dict[str, AgentUsage] = field(default_factory=dict)

    def agent(self, asker: Asker) -> AgentUsage:
        name = asker.agent if asker.agent in self.agents or len(self.agents) < MAX_AGENTS else OTHERS
        found = self.agents.get(name)
        if found is None:
            parent = asker.parent if name != OTHERS else None
            found = self.agents[name] = AgentUsage(name, parent, asker.key)
        return found


def generated(spent: Spent) -> bool:
    """Whether a request reached generation: it has a first token or tokens; a refusal (400, 401, 429) has neither."""
    return spent.ttft_s is not None or spent.input_tokens + spent.cached_tokens + spent.output_tokens > 0


class Sessions:
    """The last MAX_SESSIONS sessions, each agent's usage in them; a key past its share forgets its own least
    recently seen, and when all are taken the key holding the most does. The `kept` keys' (the admins') sessions
    are counted apart: only their own share bounds them (MAX_SESSIONS + MAX_KEY_SESSIONS per admin in all)."""

    def __init__(
        self,
        max_sessions: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
        per_key: int = MAX_KEY_SESSIONS,
        kept: frozenset[str] = frozenset(),
    ) -> None:
        self.max_sessions, self.per_key, self.kept = max_sessions, per_key, kept
        self.clock = clock
        self.sessions: OrderedDict[tuple[str, str], Session] = OrderedDict()

    def count(self, asker: Asker, spent: Spent) -> None:
        """One request of a session; one refused before generation (no token, no first token) touches none, so
        a key's refused requests never push anyone's sessions, its own included, off the console."""
        if asker.session is None or not generated(spent):
            return
        now, known = self.clock(), (asker.key, asker.session)
        session = self.sessions.pop(known, None) or Session(asker.session, asker.key, now)
        session.last_seen = now
        self.sessions[known] = session  # the most recent last
        if len(self.of_key(asker.key)) > self.per_key:
            del self.sessions[self.of_key(asker.key)[0]]
        held = Counter(key for key, _ in self.sessions if key not in self.kept)
        while held.total() > self.max_sessions:
            most = max(held, key=held.__getitem__)
            del self.sessions[self.of_key(most)[0]]
            held[most] -= 1
        session.agent(asker).add(asker, spent)

    def of_key(self, key: str) -> list[tuple[str, str]]:
        """A key's sessions, least recently seen first."""
        return [known for known in self.sessions if known[0] == key]

    def recent(
        self, limit: int, cost_per_hour: float | None, key: str | None = None, viewer: str | None = None
    ) -> list[dict[str, Any]]:
        """The `limit` sessions seen last (of `key` alone, when given), most recent first, each with its
        agents in the order they came. With `viewer` (an admin looking at every key's), the viewer's own come
        first, leaving half the rows to the others' when they have some: a flood never hides the owner's."""
        now = self.clock()
        newest = [session for session in reversed(self.sessions.values()) if key is None or session.key == key]
        own = [session for session in newest if viewer is not None and session.key == viewer]
        others = [session for session in newest if viewer is None or session.key != viewer]
        own = own[: limit - min(len(others), limit // 2)]
        shown = own + others[: limit - len(own)]
        return [
            {
                "id": session.id,
                "seen_s_ago": round(now - session.last_seen, 1),
                "agents": [agent.as_json(cost_per_hour) for agent in session.agents.values()],
            }
            for session in shown
        ]


class BusyTime:
    """The engine's busy time, shared among the requests in flight: while n run, each is charged 1/n of
    the time; idle time is nobody's. O(1) per request: a running integral of 1/n, read at each end."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.in_flight = 0
        self.charged = 0.0  # what one request in flight since the start would have been charged
        self.at = clock()

    def advance(self) -> None:
        now = self.clock()
        if self.in_flight:
            self.charged += (now - self.at) / self.in_flight
        self.at = now

    def begin(self) -> float:
        """A request starts; what `end` needs to tell its share."""
        self.advance()
        self.in_flight += 1
        return self.charged

    def end(self, mark: float) -> float:
        """The request begun at `mark` ends: its share of the busy time, in seconds."""
        self.advance()
        self.in_flight -= 1
        return self.charged - mark
