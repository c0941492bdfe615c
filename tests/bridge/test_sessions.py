"""Who asked and what they spent: Claude Code's session and agent headers, bounded whatever a client
sends; each request's share of the engine's busy time; each key's totals kept across a restart in the
ledger (a real bridge, stopped and started again on the same file, in front of the session's vLLM)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from runtime.bridge.ledger import Ledger
from runtime.bridge.sessions import MAX_AGENTS, MAX_ID_CHARS, OTHERS, Asker, BusyTime, Sessions, client_id
from runtime.bridge.usage import KeyUsage, Spent, Usage
from runtime.engine import tinymodel as tiny
from tests.support.bridge import Process, pod_status, start_bridge
from tests.support.vllm_server import VllmServer

KEY = "sk-sessions-0123456789"
ASK = {
    "model": "claude-tiny",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": f"Say hello {tiny.MARK_TEXT}"}],
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- attribution ---


def test_the_headers_name_the_session_the_agent_its_parent_and_the_class() -> None:
    main = Asker.of({"x-claude-code-session-id": "s-1", "x-claude-code-request-class": "main"}, "alice")
    assert (main.session, main.agent, main.parent, main.request_class) == ("s-1", "main", None, "main")
    sub = Asker.of({"x-claude-code-session-id": "s-1", "x-claude-code-agent-id": "a7", "x-claude-code-request-class":
                    "Subagent", "x-claude-code-context-compacted": "true"}, "alice")  # fmt: skip
    assert (sub.agent, sub.parent, sub.request_class, sub.compacted) == ("a7", "main", "subagent", True)
    nested = Asker.of({"x-claude-code-agent-id": "a8", "x-claude-code-parent-agent-id": "a7"}, "bob")
    assert (nested.session, nested.parent, nested.request_class) == (None, "a7", "none")


@pytest.mark.parametrize(
    ("sent", "kept"),
    [("abc-123_x.y:z", "abc-123_x.y:z"), ("a\nb\x1b[2Jc", "ab2Jc"), ("x" * 10_000, "x" * MAX_ID_CHARS),
     ("\u202eevil", "evil"), ("  ", None), ("", None), (None, None)],
    ids=["plain", "controls", "huge", "bidi", "spaces", "empty", "absent"],
)  # fmt: skip
def test_a_client_chosen_id_is_cleaned_and_capped(sent: str | None, kept: str | None) -> None:
    assert client_id(sent) == kept


def test_an_unknown_request_class_is_other_so_the_labels_stay_bounded() -> None:
    assert Asker.of({"x-claude-code-request-class": "x" * 500}, "k").request_class == "other"
    assert Asker.of({"x-claude-code-request-class": "compaction"}, "k").request_class == "compaction"


def test_sessions_are_forgotten_least_recently_seen_first_and_agents_are_capped() -> None:
    clock = Clock()
    sessions = Sessions(max_sessions=3, clock=clock)
    for n in range(5):
        clock.now += 1
        sessions.count(Asker("k", session=f"s{n}"), Spent(output_tokens=1))
    clock.now += 1
    sessions.count(Asker("k", session="s2"), Spent(output_tokens=1))  # seen again: the most recent now
    assert [s["id"] for s in sessions.recent(10, None)] == ["s2", "s4", "s3"]
    for n in range(MAX_AGENTS + 10):
        sessions.count(Asker("k", session="big", agent=f"a{n}", parent="main"), Spent(output_tokens=1))
    agents = sessions.recent(1, None)[0]["agents"]
    assert len(agents) == MAX_AGENTS + 1 and agents[-1]["agent"] == OTHERS and agents[-1]["requests"] == 10


def test_an_agent_adds_up_its_requests_and_costs_its_share() -> None:
    sessions = Sessions()
    asker = Asker("alice", session="s", agent="a1", parent="main", request_class="subagent")
    sessions.count(asker, Spent(100, 900, 10, ttft_s=0.5, busy_s=36.0))
    sessions.count(Asker("alice", "s", "a1", "main", "compaction"), Spent(50, 0, 20, ttft_s=1.5, busy_s=36.0))
    [agent] = sessions.recent(1, cost_per_hour=2.0)[0]["agents"]
    assert agent == {
        "agent": "a1", "parent": "main", "key": "alice", "requests": 2, "classes": {"compaction": 1, "subagent": 1},
        "compactions": 1, "input_tokens": 150, "cached_tokens": 900, "output_tokens": 30,
        "prefix_cache_hit_rate": round(900 / 1050, 4), "ttft_p50_s": 1.0, "busy_s": 72.0, "cost": 0.04,
    }  # fmt: skip


def test_busy_time_is_shared_among_the_requests_in_flight() -> None:
    """A alone for 2 s, then A and B together for 2 s, then B alone for 1 s: A 3 s, B 2 s, idle nobody's."""
    clock = Clock()
    busy = BusyTime(clock)
    clock.now += 10  # idle
    a = busy.begin()
    clock.now += 2
    b = busy.begin()
    clock.now += 2
    assert busy.end(a) == pytest.approx(3.0)
    clock.now += 1
    assert busy.end(b) == pytest.approx(2.0)


# --- the ledger ---


def test_the_ledger_sums_per_key_skips_torn_lines_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "volume" / "usage-ledger.jsonl"
    ledger = Ledger(path)
    assert ledger.load() == {}  # no file yet: its folder is made
    usage = Usage(totals={}, record=ledger.record)
    usage.count("alice", False, Spent(10, 5, 3, busy_s=1.5))
    usage.count("alice", True, Spent(1, 0, 0))
    usage.count("bob", False, Spent(7, 0, 2))
    ledger.append(ledger.take())
    ledger.append(b'{"name": "alice", "since": "2000-01-01T00:00:00Z", "requests": 1}\n{"name": "tor')  # a crash
    again = Ledger(path).load()
    alice = again["alice"]
    assert (alice.since, alice.requests, alice.input_tokens, alice.errors, alice.busy_s) == (
        "2000-01-01T00:00:00Z", 3, 11, 1, 1.5)  # fmt: skip
    assert again["bob"].output_tokens == 2
    assert len(path.read_text().splitlines()) == 2  # one line per key once read
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_ledger_too_big_to_be_ours_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "usage-ledger.jsonl"
    path.write_bytes(b"x" * (8 * 2**20 + 1))
    assert Ledger(path).load() == {}
    assert path.with_suffix(".too-big").exists() and not path.exists()


def test_usage_starts_from_the_ledger_totals() -> None:
    usage = Usage(totals={"alice": KeyUsage("alice", "2026-11-01T00:00:00Z", requests=5)})
    usage.count("alice", False, Spent(1, 0, 1))
    [alice] = usage.per_key()
    assert alice["requests"] == 6 and alice["since"] == "2026-11-01T00:00:00Z"


# --- a real bridge ---


def ask(bridge: Process, headers: dict[str, str]) -> int:
    """One request with the key and `headers`; the output tokens its answer says it used."""
    response = httpx.post(f"{bridge.url}/v1/messages", json=ASK, headers={"x-api-key": KEY} | headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["output_tokens"]


def test_a_bridge_keeps_each_keys_totals_across_a_restart(vllm_server: VllmServer, tmp_path: Path) -> None:
    ledger = tmp_path / "volume" / "usage-ledger.jsonl"
    settings = {"VL_API_KEYS": f"alice:{KEY}", "VL_STATE_DIR": str(tmp_path / "state")}
    with start_bridge(vllm_server.url, tmp_path / "first.log", settings, "--ledger", str(ledger)) as first:
        for _ in range(3):
            ask(first, {})
        before = pod_status(first.url, KEY)["keys"][0]
    with start_bridge(vllm_server.url, tmp_path / "second.log", settings, "--ledger", str(ledger)) as second:
        after = pod_status(second.url, KEY)["keys"][0]
        ask(second, {})
        grown = pod_status(second.url, KEY)["keys"][0]
    assert before["requests"] == 3 and after == before  # stopped, started: the same totals, since the same date
    assert grown["requests"] == 4 and grown["since"] == before["since"]
    assert json.loads(ledger.read_text().splitlines()[0])["name"] == "alice"


def test_sessions_reach_the_status_the_metrics_and_the_trace_bounded(vllm_server: VllmServer, tmp_path: Path) -> None:
    settings = {"VL_API_KEYS": f"alice:{KEY}", "VL_STATE_DIR": str(tmp_path / "state")}
    hostile = "s" * 5000 + " trace id=forged"
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", settings) as bridge:
        main = ask(bridge, {"x-claude-code-session-id": "sess-1", "x-claude-code-request-class": "main"})
        sub = ask(bridge, {"x-claude-code-session-id": "sess-1", "x-claude-code-agent-id": "agent-2",
                           "x-claude-code-request-class": "subagent"})  # fmt: skip
        ask(bridge, {"x-claude-code-session-id": hostile, "x-claude-code-request-class": "<script>"})
        status = pod_status(bridge.url, KEY)
        metrics = httpx.get(f"{bridge.url}/metrics", headers={"x-api-key": KEY}).text
        log = bridge.log()
    sessions = {session["id"]: session for session in status["sessions"]}
    assert [(a["agent"], a["parent"], a["requests"], a["output_tokens"]) for a in sessions["sess-1"]["agents"]] == [
        ("main", None, 1, main), ("agent-2", "main", 1, sub)]  # fmt: skip
    assert main > 0 and sub > 0
    assert "s" * MAX_ID_CHARS in sessions and max(map(len, sessions)) == MAX_ID_CHARS
    for request_class in ("main", "subagent", "other"):
        assert re.search(
            rf'bridge_requests_by_class_total\{{key="alice",request_class="{request_class}"\}} 1\.0', metrics
        )
    assert re.search(rf'bridge_tokens_by_class_total\{{kind="output",request_class="subagent"\}} {sub}\.0', metrics)
    assert "sess-1" not in metrics  # sessions are never a label
    assert "session=sess-1 agent=agent-2 class=subagent" in log
    assert f"session={'s' * MAX_ID_CHARS} agent=main class=other " in log
    assert "forged" not in log and "<script>" not in log


def test_a_ledger_that_cannot_be_written_is_said_once_and_starts_nothing_wrong(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    ledger = Ledger(blocked / "usage-ledger.jsonl")  # its folder is a file: nothing can be made there
    assert ledger.load() == {}
    for _ in range(3):
        ledger.record("alice", "2026-12-01T00:00:00Z", KeyUsage("alice", "2026-12-01T00:00:00Z", requests=1))
        ledger.append(ledger.take())
    said = [r.getMessage() for r in caplog.records]
    assert sum("could not read the usage ledger" in line for line in said) == 1
    assert sum("could not append to the usage ledger" in line for line in said) == 1
