"""Which conversation a request belongs to: the key the router pins to one engine (VL_REPLICAS > 1), and the
data-parallel rank vLLM pins it to within one engine of several replicas (VL_DP > 1).

An agent's turns share a growing prefix, and only the engine that served its last turn holds it (a
Claude Code turn: 1.14 s in cache, 21 s without). Claude Code names the conversation in
`x-claude-code-session-id` on every request and adds `x-claude-code-agent-id` on a subagent's (each
subagent has its own prefix); else a gateway's key for the conversation (the router in front of this pod
passes its `x-smg-routing-key` on); else the session part of `metadata.user_id`; else the key's label.
The key is part of it: two keys that send the same session id are two conversations. The router sees only
one of ROUTING_KEYS digests: nothing a client sent, and no key, reaches it in clear, and its memory is bounded.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

ROUTING_KEY = "x-smg-routing-key"  # what the router's sticky (`manual`) policy pins by: its name in smg
# vLLM's own: which of its data-parallel engines serves the request; its balancer spreads by load, not by prefix.
DP_RANK = "x-data-parallel-rank"
SESSION_HEADER = "x-claude-code-session-id"
AGENT_HEADER = "x-claude-code-agent-id"
# Claude Code's `metadata.user_id`: `user_<hash>_account_<uuid>_session_<uuid>`, or the same as JSON.
SESSION_IN_USER_ID = re.compile(r"_session_([0-9A-Za-z-]{1,64})")
MAX_PART_CHARS = 256  # of any header or field that makes the key: more is not an id
# The router keeps ~0.37 KB per key it has seen, for hours: one per session id grew without bound. At most
# this many (~24 MiB); two conversations sharing one only share an engine.
ROUTING_KEYS = 2**16


def conversation(headers: Mapping[str, str], user_id: str | None, key_label: str) -> str:
    """What names the conversation, most specific first, each part tagged with where it came from."""
    session = headers.get(SESSION_HEADER, "")[:MAX_PART_CHARS]
    if session:
        agent = headers.get(AGENT_HEADER, "")[:MAX_PART_CHARS]
        return f"session:{session}/agent:{agent}" if agent else f"session:{session}"
    if routed := headers.get(ROUTING_KEY, "")[:MAX_PART_CHARS]:
        return f"routed:{routed}"
    if user_id and (in_user_id := session_of(user_id[:MAX_PART_CHARS])):
        return f"user-session:{in_user_id}"
    return f"key:{key_label}"


def session_of(user_id: str) -> str | None:
    """The session part of a `metadata.user_id`, in either of the forms Claude Code writes."""
    if user_id.startswith("{"):
        try:
            session = json.loads(user_id).get("session_id")
        except (ValueError, AttributeError):
            return None
        return session if isinstance(session, str) and session else None
    found = SESSION_IN_USER_ID.search(user_id)
    return found.group(1) if found else None


def routing_headers(
    headers: Mapping[str, str],
    user_id: str | None,
    key_label: str,
    data_parallel: int = 1,
    down: frozenset[int] = frozenset(),
) -> dict[str, str]:
    """What pins the request's conversation: the router's key, and with VL_DP (or a cluster's nodes) its
    data-parallel rank (the same digest, so an agent's turns keep the engine that holds its prefix)."""
    key = routing_key(headers, user_id, key_label)
    rank = {DP_RANK: str(data_parallel_rank(int(key, 16), data_parallel, down))} if data_parallel > 1 else {}
    return {ROUTING_KEY: key, **rank}


def data_parallel_rank(key: int, ranks: int, down: frozenset[int]) -> int:
    """The rank `key` is pinned to: its own, or while that one is `down` one of those up (only the agents of the
    rank that is down move; with none up, its own: vLLM then says what it says)."""
    home = key % ranks
    if home not in down:
        return home
    up = [rank for rank in range(ranks) if rank not in down]
    return up[key % len(up)] if up else home


def routing_key(headers: Mapping[str, str], user_id: str | None, key_label: str) -> str:
    """The router's key for this request: a digest of the key and its conversation (two keys sending the same
    session id are two conversations), folded into one of ROUTING_KEYS so that the router's memory is bounded."""
    digest = hashlib.sha256(f"{key_label}\n{conversation(headers, user_id, key_label)}".encode()).digest()
    return f"{int.from_bytes(digest[:8], 'big') % ROUTING_KEYS:032x}"
