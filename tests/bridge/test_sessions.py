"""Who asked and what they spent: Claude Code's session and agent headers, bounded whatever a client
sends; each request's share of the engine's busy time; each key's totals kept across a restart in the
ledger (a real bridge, stopped and started again on the same file, in front of the session's vLLM)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from runtime.bridge.ledger import EARLIER, MAX_LEDGER_BYTES, Buckets, Ledger, add_to, line_of, today, totals_of, within
from runtime.bridge.podstatus import SESSIONS_SHOWN
from runtime.bridge.sessions import (
    MAX_AGENTS,
    MAX_ID_CHARS,
    MAX_KEY_SESSIONS,
    MAX_SESSIONS,
    OTHERS,
    Asker,
    BusyTime,
    Sessions,
    client_id,
)
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


def test_the_other_hints_are_counted_as_the_classes_are_and_stay_bounded() -> None:
    """Claude Code 2.1.332 also says what Anthropic's API is told of a request (x-claude-1p-request-class) and which
    memory pass an auxiliary request is (x-claude-code-auxiliary-type): each agent counts them with its classes."""
    headers = {"x-claude-code-session-id": "s-9", "x-claude-code-request-class": "auxiliary",
               "x-claude-1p-request-class": "Background-Task", "x-claude-code-auxiliary-type": "memory_save"}  # fmt: skip
    asker = Asker.of(headers, "alice")
    assert (asker.request_class, asker.first_party_class, asker.auxiliary_type) == (
        "auxiliary",
        "background-task",
        "memory_save",
    )
    odd = Asker.of({"x-claude-1p-request-class": "x" * 500, "x-claude-code-auxiliary-type": "\x1b[2J"}, "k")
    assert (odd.first_party_class, odd.auxiliary_type) == ("other", "other")
    assert (Asker.of({}, "k").first_party_class, Asker.of({}, "k").auxiliary_type) == ("none", "none")
    sessions = Sessions()
    sessions.count(asker, Spent(output_tokens=3))
    sessions.count(Asker.of({"x-claude-code-session-id": "s-9", "x-claude-code-request-class": "main"}, "alice"),
                   Spent(output_tokens=1))  # fmt: skip
    (agent,) = sessions.recent(1, None)[0]["agents"]
    assert agent["classes"] == {"1p:background-task": 1, "auxiliary": 1, "auxiliary:memory_save": 1, "main": 1}


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


def test_one_key_fills_only_its_own_share_of_the_console_s_sessions() -> None:
    """~33 requests with new session ids (refused ones count too) once erased every other key's sessions."""
    sessions = Sessions()
    for name in ("alice", "bob"):
        for n in range(3):
            sessions.count(Asker(name, session=f"{name}-{n}"), Spent(output_tokens=1))
    for n in range(200):
        sessions.count(Asker("mallory", session=f"flood-{n}"), Spent(output_tokens=1))
    assert [s["id"] for s in sessions.recent(10, None, key="alice")] == ["alice-2", "alice-1", "alice-0"]
    assert len(sessions.recent(100, None, key="bob")) == 3
    flood = [s["id"] for s in sessions.recent(100, None, key="mallory")]
    assert flood == [f"flood-{n}" for n in range(199, 199 - MAX_KEY_SESSIONS, -1)]  # its own, the latest


def test_a_request_refused_before_generation_creates_no_session() -> None:
    """200 refusals (400) from one key once pushed every session off the console, the admin's own included."""
    sessions = Sessions()
    sessions.count(Asker("admin", session="mine"), Spent(input_tokens=10, output_tokens=2, ttft_s=0.1))
    for n in range(200):
        sessions.count(Asker("mallory", session=f"refused-{n}"), Spent())
    sessions.count(Asker("admin", session="mine"), Spent())  # refused too: the session's usage is unchanged
    assert [s["id"] for s in sessions.recent(8, None)] == ["mine"]
    assert sessions.recent(8, None)[0]["agents"][0]["requests"] == 1


@pytest.mark.parametrize("refused", [False, True], ids=["answered", "refused"])
def test_another_key_s_flood_never_hides_the_admin_s_own_sessions(refused: bool) -> None:
    """200 requests with new session ids from one key once hid every session of the admin's on the console (8 rows,
    all the flood's); five keys flooding at once could evict the admin's altogether. Now the admin's own are kept
    apart and listed first, half the rows left to the others'."""
    shown = SESSIONS_SHOWN
    sessions = Sessions(kept=frozenset({"admin"}))
    for n in range(3):
        sessions.count(Asker("admin", session=f"mine-{n}"), Spent(output_tokens=1))
    flood = Spent() if refused else Spent(input_tokens=5, output_tokens=1, ttft_s=0.1)
    for key in ("mallory", "eve", "trudy", "oscar", "chuck"):
        for n in range(200):
            sessions.count(Asker(key, session=f"{key}-{n}"), flood)
    console = [s["id"] for s in sessions.recent(shown, None, viewer="admin")]
    assert console[:3] == ["mine-2", "mine-1", "mine-0"] and len(console) == (3 if refused else shown)
    assert len(sessions.sessions) <= MAX_SESSIONS + MAX_KEY_SESSIONS  # bounded: the admin's share on top
    for n in range(3, 20):  # the admin's own many: still half the rows to the others'
        sessions.count(Asker("admin", session=f"mine-{n}"), Spent(output_tokens=1))
    console = [s["id"] for s in sessions.recent(shown, None, viewer="admin")]
    assert console[: shown // 2] == [f"mine-{n}" for n in range(19, 19 - shown // 2, -1)]
    assert len(console) == shown and (refused or all(not id.startswith("mine") for id in console[shown // 2 :]))


def test_when_every_session_is_taken_the_key_holding_the_most_gives_one_up() -> None:
    sessions = Sessions(max_sessions=4, per_key=3)
    for key, session in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1")]:
        sessions.count(Asker(key, session=session), Spent(output_tokens=1))
    assert {s["id"] for s in sessions.recent(10, None)} == {"a2", "a3", "b1", "c1"}


def test_an_agent_adds_up_its_requests_and_costs_its_share() -> None:
    sessions = Sessions()
    asker = Asker("alice", session="s", agent="a1", parent="main", request_class="subagent")
    sessions.count(asker, Spent(100, 900, 10, ttft_s=0.5, busy_s=36.0))
    compaction = Spent(50, 0, 20, ttft_s=1.5, busy_s=36.0, cache_miss="system_changed")
    sessions.count(Asker("alice", "s", "a1", "main", "compaction"), compaction)
    [agent] = sessions.recent(1, cost_per_hour=2.0)[0]["agents"]
    assert agent == {
        "agent": "a1", "parent": "main", "key": "alice", "requests": 2, "classes": {"compaction": 1, "subagent": 1},
        "compactions": 1, "input_tokens": 150, "cached_tokens": 900, "output_tokens": 30,
        "prefix_cache_hit_rate": round(900 / 1050, 4), "cache_misses": {"system_changed": 1}, "ttft_p50_s": 1.0,
        "busy_s": 72.0, "cost": 0.04,
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
    usage = Usage(totals={}, recorders=[ledger.record])
    usage.count("alice", False, Spent(10, 5, 3, busy_s=1.5))
    usage.count("alice", True, Spent(1, 0, 0))
    usage.count("bob", False, Spent(7, 0, 2))
    ledger.append(ledger.take())
    ledger.append(b'{"name": "alice", "since": "2000-01-01T00:00:00Z", "requests": 1}\n{"name": "tor')  # a crash
    again = totals_of(Ledger(path).load())
    alice = again["alice"]
    assert (alice.since, alice.requests, alice.input_tokens, alice.errors, alice.busy_s) == (
        "2000-01-01T00:00:00Z", 3, 11, 1, 1.5)  # fmt: skip
    assert again["bob"].output_tokens == 2
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # one line per key and day once read
    assert [(line["name"], line["day"]) for line in lines] == [("alice", ""), ("alice", today()), ("bob", today())]
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_ledger_past_its_cap_is_compacted_per_key_and_day_and_keeps_every_total(tmp_path: Path) -> None:
    """Days of steady use (a line per flush) once passed 8 MiB, and the next start set every total aside."""
    path = tmp_path / "usage-ledger.jsonl"
    one = {"since": "2026-01-01T00:00:00Z", "requests": 1, "output_tokens": 2, "busy_s": 0.5}
    with path.open("w") as file:
        for n in range(75_000):
            name, day = ("alice", "bob")[n % 2], f"2026-{1 + n // 7500:02d}-{1 + n % 28:02d}"
            file.write(json.dumps({"name": name, "day": day} | one) + "\n")
    assert path.stat().st_size > MAX_LEDGER_BYTES
    totals = totals_of(Ledger(path).load())
    assert {name: (u.requests, u.output_tokens, u.busy_s) for name, u in totals.items()} == {
        "alice": (37_500, 75_000, 18_750.0), "bob": (37_500, 75_000, 18_750.0)}  # fmt: skip
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len({(line["name"], line["day"]) for line in lines}) <= 2 * 10 * 28
    assert totals_of(Ledger(path).load()) == totals and not list(tmp_path.glob("*.too-big"))


def test_past_its_budget_the_oldest_days_are_folded_into_one_line_per_key() -> None:
    buckets: Buckets = {}
    for day in ("2026-12-01", "2026-12-02", "2026-12-03"):
        for name in ("alice", "bob"):
            add_to(buckets, KeyUsage(name, f"{day}T00:00:00Z", requests=1), day)
    kept = [line_of(KeyUsage(name, "2026-12-01T00:00:00Z", requests=r), day)
            for name in ("alice", "bob") for r, day in ((2, EARLIER), (1, "2026-12-03"))]  # fmt: skip
    folded = within({where: KeyUsage(u.name, u.since, u.requests) for where, u in buckets.items()}, len("".join(kept)))
    assert sorted(folded) == [("alice", ""), ("alice", "2026-12-03"), ("bob", ""), ("bob", "2026-12-03")]
    assert totals_of(folded) == totals_of(buckets)
    assert folded["alice", EARLIER].since == "2026-12-01T00:00:00Z"


@pytest.mark.parametrize(
    "hostile",
    [
        '{"name": "eve", "since": "x", "requests": Infinity}',  # Python reads it; the status page answered 500
        '{"name": "eve", "since": "x", "requests": 1e999}',
        '{"name": "eve", "since": "x", "requests": NaN}',
        '{"name": "eve", "since": "x", "requests": -5}',
        '{"name": "eve", "since": "x", "requests": true}',
        '{"name": "eve", "since": "x", "day": 7, "requests": 1}',
        '{"name": "eve", "since": "x", "day": "9999-12-31", "requests": 1}',  # a daily budget blocked for good
        '{"name": "eve", "since": "x", "day": "2026-02-30", "requests": 1}',
        '{"name": "eve", "since": "x", "day": "2026-1-5", "requests": 1}',
        '{"name": "eve", "since": "x", "day": "yesterday", "requests": 1}',
        "[" * 100_000 + "]" * 100_000,  # the bridge crashed at start (RecursionError), on every relaunch
        '{"name": "eve", "since": "x", "requests": 1, "pad": "' + "p" * 10**6 + '"}',
    ],
    ids=[
        "infinity",
        "overflow",
        "nan",
        "negative",
        "bool",
        "day",
        "future-day",
        "no-such-day",
        "unpadded-day",
        "word-day",
        "deep",
        "long",
    ],
)
def test_a_hostile_ledger_line_is_skipped_and_said(
    hostile: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "usage-ledger.jsonl"
    path.write_text(f'{{"name": "alice", "since": "2026-12-01T00:00:00Z", "requests": 2}}\n{hostile}\n')
    totals = totals_of(Ledger(path).load())
    assert list(totals) == ["alice"] and totals["alice"].requests == 2
    assert json.dumps([vars(usage) for usage in totals.values()], allow_nan=False)  # what /v1/pod/status sends
    assert any("had 1 unreadable lines: left out" in r.getMessage() for r in caplog.records)


SHORT_WRITES = textwrap.dedent("""
    import json, logging, resource, signal, sys
    from pathlib import Path
    from runtime.bridge.ledger import Ledger, totals_of
    from runtime.bridge.usage import KeyUsage

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, write() is short, then fails with EFBIG
    path, ledger = Path(sys.argv[1]), Ledger(Path(sys.argv[1]))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), hard))  # the volume fills up
    for n in range(30):
        name = f"key-{n % 3}"
        ledger.record(name, "2026-12-01T00:00:00Z", KeyUsage(name, "2026-12-01T00:00:00Z", requests=1, output_tokens=n))
        ledger.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
    ledger.flush()
    print(json.dumps({name: [u.requests, u.output_tokens] for name, u in totals_of(Ledger(path).load()).items()}))
""")


@pytest.mark.slow  # starts a Python process
def test_a_full_volume_loses_no_usage_says_it_once_and_writes_it_later(tmp_path: Path) -> None:
    """A short write once went unnoticed and the next batch was glued to the torn line: 20 of 20 requests lost."""
    path = tmp_path / "usage-ledger.jsonl"
    result = subprocess.run([sys.executable, "-c", SHORT_WRITES, str(path), "500"], capture_output=True, text=True,
                            timeout=60, cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {f"key-{k}": [10, sum(range(k, 30, 3))] for k in range(3)}
    assert result.stderr.count("could not append to the usage ledger") == 1, result.stderr
    assert "unreadable" not in result.stderr  # no torn line, no glued one


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
    with ledger.open("a") as file:  # what a stranger wrote there: the status page answered 500, the bridge crashed
        file.write('{"name": "eve", "since": "x", "requests": Infinity}\n' + "[" * 100_000 + "\n")
    with start_bridge(vllm_server.url, tmp_path / "second.log", settings, "--ledger", str(ledger)) as second:
        after = pod_status(second.url, KEY)["keys"][0]
        ask(second, {})
        grown = pod_status(second.url, KEY)["keys"][0]
    assert before["requests"] == 3 and after == before  # stopped, started: the same totals, since the same date
    assert grown["requests"] == 4 and grown["since"] == before["since"]
    assert {json.loads(line)["name"] for line in ledger.read_text().splitlines()} == {"alice"}
    assert "the usage ledger" in (log := (tmp_path / "second.log").read_text()) and "2 unreadable lines" in log


def test_sessions_reach_the_status_the_metrics_and_the_trace_bounded(vllm_server: VllmServer, tmp_path: Path) -> None:
    settings = {"VL_API_KEYS": f"alice:{KEY}", "VL_STATE_DIR": str(tmp_path / "state")}
    hostile = "s" * 5000 + " trace id=forged"
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", settings) as bridge:
        main = ask(bridge, {"x-claude-code-session-id": "sess-1", "x-claude-code-request-class": "main"})
        sub = ask(bridge, {"x-claude-code-session-id": "sess-1", "x-claude-code-agent-id": "agent-2",
                           "x-claude-code-request-class": "subagent"})  # fmt: skip
        ask(bridge, {"x-claude-code-session-id": hostile, "x-claude-code-request-class": "<script>",
                     "x-claude-1p-request-class": "background-task", "x-claude-code-auxiliary-type": "<b>"})  # fmt: skip
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
    assert f"session={'s' * MAX_ID_CHARS} agent=main class=other 1p=background-task auxiliary=other " in log
    assert re.search(r'bridge_requests_by_hint_total\{hint="1p",value="background-task"\} 1\.0', metrics)
    assert re.search(r'bridge_requests_by_hint_total\{hint="auxiliary",value="other"\} 1\.0', metrics)
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
