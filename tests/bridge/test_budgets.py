"""Budgets per key (issue 34, item 4): `name:key:1ktokens/day` in VL_API_KEYS. Claude Code's gateway contract: each
answer within a budget carries the `anthropic-ratelimit-unified-*` headers; past it, `429 billing_error` before any
work, whose message the CLI prints as it is; the spend is the ledger's, so a restart forgets none of it.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from runtime.bridge.budgets import (
    BYTES_PER_TOKEN,
    HELD_RETRY_S,
    BudgetGate,
    Budgets,
    allowed_headers,
    described,
    refusal,
    worst_case,
)
from runtime.bridge.ledger import Buckets
from runtime.bridge.trace import Trace
from runtime.bridge.usage import KeyUsage
from runtime.budget import Budget, budget
from runtime.engine import tinymodel as tiny
from runtime.settings import ApiKey, SettingsError, load_settings
from tests.support.bridge import Process, pod_status, start_bridge
from tests.support.claude_code import require_claude_code, run_claude
from tests.support.polling import wait_until
from tests.support.sdk import anthropic, openai
from tests.support.vllm_server import VllmServer

TEAM = "sk-team-budget-0123456789"
SPENDER = "sk-spender-0123456789ab"
BROKE = "sk-broke-0123456789abcd"
STREAMER = "sk-streamer-0123456789a"
BURST = "sk-burst-0123456789abcd"
KEYS = (
    f"team:{TEAM}, spender:{SPENDER}:1ktokens/day, broke:{BROKE}:swap:100tokens/day:0.01usd/month, "
    f"streamer:{STREAMER}:1ktokens/day, burst:{BURST}:300tokens/day"
)
ASK = {"model": "claude-tiny", "max_tokens": 20, "messages": [{"role": "user", "content": f"Hi {tiny.MARK_TEXT}"}]}
UNIFIED = "anthropic-ratelimit-unified-"
SUNDAY_NOON = datetime(2026, 12, 27, 12, 0, tzinfo=UTC)  # the last Sunday of the year: every period ends soon


def usage(name: str, day: str, input_tokens: int = 0, output_tokens: int = 0, busy_s: float = 0.0) -> Buckets:
    return {(name, day): KeyUsage(name, "2026-12-01T00:00:00Z", 1, input_tokens, 10_000, output_tokens, 0, busy_s)}


# --- the budget as written ---


def test_a_budget_is_written_after_a_named_key_and_its_role() -> None:
    first, second, *_ = load_settings({"VL_API_KEYS": KEYS, "VL_COST_PER_HOUR": "2"}).api_keys[1:]
    assert (first.name, first.key, first.budgets) == ("spender", SPENDER, (Budget(1000, "tokens", "day"),))
    assert (second.key, second.swap) == (BROKE, True)
    assert second.budgets == (Budget(100, "tokens", "day"), Budget(0.01, "usd", "month"))
    written = (*second.budgets, Budget(2_000_000, "tokens", "month"), Budget(0.125, "usd", "week"))
    assert [budget(one.entry) for one in written] == list(written)  # written back as read
    assert second.entry == f"broke:{BROKE}:swap:100tokens/day:0.01usd/month"
    assert str(Budget(2_000_000, "tokens", "month")) == "2,000,000 tokens a month"
    assert str(Budget(5, "usd", "week")) == "$5.00 a week"


REFUSED = {  # the settings, the variable named, the reason said
    f"{TEAM}:5usd/day": ({}, "VL_API_KEYS", "entry 1 has a budget but no name: write it `name:key:5usd/day`"),
    f"a:{TEAM}:0tokens/day": ({}, "VL_API_KEYS", "entry 1 (a) has a budget of 0tokens/day: above 0, or no budget"),
    f"a:{TEAM}:1tokens/day:2tokens/day": ({}, "VL_API_KEYS", "entry 1 (a) has two budgets in tokens a day"),
    f"a:{TEAM}:5usd/day": ({}, "VL_COST_PER_HOUR", "a budget in dollars"),
    f"a:{TEAM}:5tokens/day:admin": ({}, "VL_API_KEYS", "entry 1 (a) has a budget before its role"),  # else in the key
    f"b:{TEAM}:5tokens/day": ({"VL_BRIDGE": "off"}, "VL_BRIDGE", "the bridge counts it"),  # vLLM alone cannot
}


@pytest.mark.parametrize("keys", REFUSED)
def test_a_budget_that_cannot_be_counted_stops_start_up_in_one_line_without_the_key(keys: str) -> None:
    settings, variable, reason = REFUSED[keys]
    with pytest.raises(SettingsError) as refused:
        load_settings({"VL_API_KEYS": keys} | settings)
    assert refused.value.variable == variable and reason in str(refused.value)
    assert TEAM not in str(refused.value)


@pytest.mark.parametrize(
    ("period", "began", "resets"),
    [
        ("day", datetime(2026, 12, 27, tzinfo=UTC), datetime(2026, 12, 28, tzinfo=UTC)),
        ("week", datetime(2026, 12, 21, tzinfo=UTC), datetime(2026, 12, 28, tzinfo=UTC)),  # from Monday
        ("month", datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),  # into the next year
    ],
)
def test_each_period_is_a_utc_calendar_one(period: str, began: datetime, resets: datetime) -> None:
    one = Budget(1, "tokens", period)
    assert (one.began(SUNDAY_NOON), one.resets(SUNDAY_NOON)) == (began, resets)


# --- the spend and what the client is told ---


def test_the_spend_is_counted_in_the_period_from_the_ledgers_days_and_each_request_after() -> None:
    """Tokens the engine computed (the cached ones left out); dollars of busy time at the pod's price; a day
    before the period does not count, and a new period starts whole."""
    entries = load_settings({"VL_API_KEYS": KEYS, "VL_COST_PER_HOUR": "3.6"}).api_keys
    days = usage("broke", "2026-12-27", 60, 10, busy_s=2) | usage("broke", "2026-11-30", 500, busy_s=50)
    clock = [SUNDAY_NOON]
    budgets = Budgets(entries, 3.6, days | usage("team", "2026-12-27", 99), lambda: clock[0])
    daily, monthly = budgets.standings("broke")
    assert (daily.spent, daily.utilization, daily.spent_out) == (70, 0.7, False)
    assert monthly.spent == pytest.approx(0.002) and monthly.resets == datetime(2027, 1, 1, tzinfo=UTC)
    assert budgets.standings("team") == [] and "team" not in budgets.views()
    budgets.record("broke", "", KeyUsage("broke", "", 1, 20, 5_000, 10, 0, 1))
    assert [standing.spent_out for standing in budgets.standings("broke")] == [True, False]
    assert described(budgets.standings("broke")).budget.period == "day"  # blocked: the one that frees it
    clock[0] = datetime(2026, 12, 28, 0, 0, 1, tzinfo=UTC)  # Monday: a new day, the month goes on
    daily, monthly = budgets.standings("broke")
    assert daily.spent == 0 and monthly.spent == pytest.approx(0.003)
    assert described([daily, monthly]).budget.period == "month"  # the fullest one


@pytest.mark.parametrize(
    ("spent", "told"),
    [
        (500, {"status": "allowed", "overage-utilization": "0.50"}),
        (750, {"status": "allowed", "overage-utilization": "0.75"}),  # at it is not past it
        (820, {"status": "allowed_warning", "overage-utilization": "0.82", "overage-surpassed-threshold": "0.75"}),
        (999, {"status": "allowed_warning", "overage-utilization": "0.99", "overage-surpassed-threshold": "0.95"}),
    ],
)
def test_the_headers_within_a_budget_follow_the_contracts_table(spent: float, told: dict[str, str]) -> None:
    budgets = Budgets(load_settings({"VL_API_KEYS": f"a:{TEAM}:1ktokens/day"}).api_keys, None,
                      usage("a", "2026-12-27", spent), lambda: SUNDAY_NOON)  # fmt: skip
    headers = {name.decode(): value.decode() for name, value in allowed_headers(described(budgets.standings("a")))}
    reset = str(int(datetime(2026, 12, 28, tzinfo=UTC).timestamp()))
    expected = {"representative-claim": "overage", "overage-status": told["status"], "reset": reset,
                "overage-reset": reset} | told  # fmt: skip
    assert headers == {UNIFIED + name: value for name, value in expected.items()}


def test_past_a_budget_the_429_says_when_it_is_whole_again_in_one_sentence() -> None:
    budgets = Budgets(load_settings({"VL_API_KEYS": f"a:{TEAM}:1ktokens/day"}).api_keys, None,
                      usage("a", "2026-12-27", 1_200), lambda: SUNDAY_NOON)  # fmt: skip
    error, unified = refusal("a", described(budgets.standings("a")), SUNDAY_NOON)
    headers = error.headers() | unified  # as the response sends them
    assert (error.status, error.type) == (429, "billing_error")
    assert error.message == (
        "a's budget of 1,000 tokens a day is spent (1,200 tokens) \xb7 resets Dec 28, 00:00 UTC (in 12 h 0 min) \xb7 "
        "ask the pod's admin to raise it (VL_API_KEYS)"
    )
    assert headers["retry-after"] == str(12 * 3600) and headers["x-should-retry"] == "false"
    assert headers[UNIFIED + "status"] == "rejected" and headers[UNIFIED + "overage-period"] == "daily"
    assert not {UNIFIED + "representative-claim", UNIFIED + "overage-status"} & set(headers)  # the CLI's own line else


# --- a real bridge, its ledger seeded ---


@pytest.fixture(scope="module")
def budgeted(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """The bridge with three keys: no budget, a budget 80 % spent and one spent, as the ledger on its volume says
    (what an earlier start of the pod counted today)."""
    root = tmp_path_factory.mktemp("budgets")
    ledger = root / "volume" / "usage-ledger.jsonl"
    ledger.parent.mkdir()
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    spent = {"spender": 800, "broke": 100}
    ledger.write_text("".join(json.dumps({"name": name, "since": "2026-12-01T00:00:00Z", "requests": 3,
                                          "input_tokens": tokens, "day": day}) + "\n" for name, tokens in spent.items()))  # fmt: skip
    settings = {"VL_API_KEYS": KEYS, "VL_COST_PER_HOUR": "1", "VL_STATE_DIR": str(root / "state")}
    with start_bridge(vllm_server.url, root / "bridge.log", settings, "--ledger", str(ledger)) as bridge:
        yield bridge


def told(response: httpx.Response) -> dict[str, str]:
    return {name.removeprefix(UNIFIED): value for name, value in response.headers.items() if name.startswith(UNIFIED)}


def test_each_answer_tells_claude_code_how_much_of_the_budget_is_used(budgeted: Process) -> None:
    """Through the SDK, streamed and whole: the headers of the contract, the spend growing with each answer; a key
    without a budget gets none of them."""
    client = anthropic.Anthropic(base_url=budgeted.url, api_key=SPENDER, max_retries=0)
    whole = client.messages.with_raw_response.create(**ASK)
    budgeted.wait_for_log(rf"trace id={whole.parse().id} ")  # its tokens counted (after its last byte was sent)
    with client.messages.with_streaming_response.create(**ASK, stream=True) as streamed:
        streamed.read()
    first, second = told(whole.http_response), told(streamed.http_response)
    assert first["status"] == "allowed_warning" and first["overage-surpassed-threshold"] == "0.75"
    assert float(second["overage-utilization"]) > float(first["overage-utilization"]) >= 0.8
    assert first["representative-claim"] == "overage" and first["reset"] == first["overage-reset"]
    plain = httpx.post(f"{budgeted.url}/v1/messages", json=ASK, headers={"x-api-key": TEAM}, timeout=60)
    assert plain.status_code == 200 and told(plain) == {}


def test_a_spent_budget_is_refused_before_any_work_and_the_sdk_does_not_retry(budgeted: Process) -> None:
    client = anthropic.Anthropic(base_url=budgeted.url, api_key=BROKE, max_retries=2)
    before = budgeted.log()
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(**ASK)
    assert refused.value.body["error"]["type"] == "billing_error"
    assert "broke's budget of 100 tokens a day is spent" in refused.value.message
    assert told(refused.value.response)["overage-disabled-reason"] == "org_spend_cap_reached"
    chat = httpx.post(f"{budgeted.url}/v1/chat/completions", headers={"x-api-key": BROKE}, timeout=60,
                      json={"model": "claude-tiny", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert chat.status_code == 429 and chat.json()["error"]["type"] == "billing_error"
    count = httpx.post(f"{budgeted.url}/v1/messages/count_tokens", json=ASK, headers={"x-api-key": BROKE}, timeout=60)
    assert count.status_code == 200  # counting is free
    budgeted.wait_for_log(r"POST /v1/messages/count_tokens 200 key=broke")
    traced = re.findall(r"POST (\S+) (\d+) key=broke.*", budgeted.log()[len(before) :])
    assert traced == [("/v1/messages", "429"), ("/v1/chat/completions", "429"), ("/v1/messages/count_tokens", "200")]
    assert "error=billing_error" in budgeted.log()


def test_streamed_relays_that_did_not_ask_for_their_usage_are_counted_all_the_same(budgeted: Process) -> None:
    """vLLM sends a stream's usage only when asked: the bridge asks on the client's behalf, counts it, and keeps the
    usage chunk from a client that did not ask (5 such streams counted 0 tokens against a budget before)."""
    client = openai.OpenAI(base_url=f"{budgeted.url}/v1", api_key=STREAMER, max_retries=0)
    chat = list(client.chat.completions.create(model="claude-tiny", stream=True, max_tokens=20,
                                               messages=[{"role": "user", "content": tiny.MARK_TEXT}]))  # fmt: skip
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chat if chunk.choices) == tiny.ANSWER
    assert all(chunk.usage is None and chunk.choices for chunk in chat)  # as vLLM streams it unasked
    budgeted.wait_for_log(r"POST /v1/chat/completions 200 key=streamer")
    after_chat = pod_status(budgeted.url, STREAMER)["keys"][0]["budgets"][0]["spent"]
    text = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model="claude-tiny", prompt="Say it", max_tokens=len(tiny.ANSWER_PIECES) + 1, stream=True))  # fmt: skip
    assert text == tiny.ANSWER
    budgeted.wait_for_log(r"POST /v1/completions 200 key=streamer")
    after_both = pod_status(budgeted.url, STREAMER)["keys"][0]["budgets"][0]["spent"]
    assert 0 < after_chat < after_both
    asked = list(client.chat.completions.create(model="claude-tiny", stream=True, max_tokens=20,
                                                messages=[{"role": "user", "content": "hello"}],
                                                stream_options={"include_usage": True}))  # fmt: skip
    assert asked[-1].usage is not None and asked[-1].usage.completion_tokens > 0  # one who asked gets it


def test_requests_at_once_hold_their_worst_case_so_a_burst_ends_within_the_budget_and_one_request(
    budgeted: Process,
) -> None:
    """20 requests at once against 300 tokens a day: each admitted one holds its prompt's estimate and max_tokens
    until it is settled; the others wait (429, retried soon, not the spent budget's billing error). The spend ends
    within the budget and one request's worst case (20 answered at once spent 20 requests' worth before)."""
    ask = {**ASK, "max_tokens": 20}
    worst = len(json.dumps(ask)) // BYTES_PER_TOKEN + 20
    barrier = threading.Barrier(20)

    def one(_: int) -> httpx.Response:
        with httpx.Client(timeout=120) as client:
            barrier.wait()
            return client.post(f"{budgeted.url}/v1/messages", json=ask, headers={"x-api-key": BURST})

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(one, range(20)))
    statuses = Counter(answer.status_code for answer in answers)
    waited = {answer.json()["error"]["type"] for answer in answers if answer.status_code == 429}
    assert statuses[200] >= 1 and statuses[200] + statuses[429] == 20, statuses
    assert waited <= {"rate_limit_error", "billing_error"}  # held by the others in flight, or spent once settled
    answered = statuses[200]  # each settled once its trace line is written (after its last byte)
    wait_until(lambda: budgeted.log().count("POST /v1/messages 200 key=burst") == answered, "the burst settled")
    [standing] = pod_status(budgeted.url, BURST)["keys"][0]["budgets"]
    assert 0 < standing["spent"] <= 300 + worst


@pytest.mark.anyio
async def test_each_admitted_request_holds_its_worst_case_until_it_is_settled() -> None:
    """The gate alone, its requests held in flight until the test lets them end: against 300 tokens, requests of
    ~100 tokens' worst case are admitted while the budget is not held whole, the next waits (429, retried soon);
    once they are settled (their real spend recorded, smaller) the budget has room again."""
    budgets = Budgets([ApiKey("burst", BURST, budgets=(Budget(300, "tokens", "day"),))], None)
    release = asyncio.Event()

    async def generation(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await release.wait()
        budgets.record("burst", "2026-12-01T00:00:00Z", KeyUsage("burst", "", 1, 10, 0, 5))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = BudgetGate(generation, budgets, max_body=2**20)

    async def identified(scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {}).update(key="burst", trace=Trace())
        await gate(scope, receive, send)

    body = json.dumps({"max_tokens": 60, "messages": [{"role": "user", "content": "x" * 150}]}).encode()
    worst = worst_case(body)
    assert worst == len(body) // BYTES_PER_TOKEN + 60  # ~50 + 60 tokens
    transport = httpx.ASGITransport(identified)
    async with httpx.AsyncClient(transport=transport, base_url="http://pod") as client:
        first = [asyncio.create_task(client.post("/v1/messages", content=body)) for _ in range(3)]
        await wait_for(lambda: budgets.held["burst"] == 3 * worst)  # 2 of them left room: the third was admitted
        held = await client.post("/v1/chat/completions", content=body)
        assert (held.status_code, held.json()["error"]["type"], held.headers["retry-after"]) == (
            429, "rate_limit_error", str(HELD_RETRY_S)
        )  # fmt: skip
        assert "burst's budget of 300 tokens a day is held by its requests in flight" in held.json()["error"]["message"]
        release.set()
        assert [answer.status_code for answer in await asyncio.gather(*first)] == [200, 200, 200]
        assert budgets.held["burst"] == 0 and budgets.standings("burst")[0].spent == 45
        release.clear()
        again = asyncio.create_task(client.post("/v1/messages", content=body))
        await wait_for(lambda: budgets.held["burst"] > 0)
        release.set()
        assert (await again).status_code == 200


async def wait_for(condition: Callable[[], bool]) -> None:
    """Until `condition` holds (the gate's own state, changed by the tasks the test started); a failure past 30 s."""
    async with asyncio.timeout(30):
        while not condition():
            await asyncio.sleep(0)


def test_the_console_shows_each_keys_budget_and_its_use(budgeted: Process) -> None:
    """An admin sees every budget (a key before its first request too); a key its own."""
    keys = {row["name"]: row for row in pod_status(budgeted.url, TEAM)["keys"]}
    assert "budgets" not in keys.get("team", {})  # a key without a budget (listed once it has asked)
    [daily, monthly] = keys["broke"]["budgets"]
    assert (daily["budget"], daily["spent"], daily["utilization"]) == ("100 tokens a day", 100, 1.0)
    assert (monthly["budget"], monthly["unit"], monthly["period"]) == ("$0.01 a month", "usd", "month")
    [own] = pod_status(budgeted.url, SPENDER)["keys"]
    assert own["name"] == "spender" and own["budgets"][0]["utilization"] >= 0.8


def test_claude_code_prints_the_refusal_as_it_is_and_asks_once(budgeted: Process, tmp_path: Path) -> None:
    """What 2.1.332 does with it through a base URL, interactive or not: `API Error: Request rejected (429) ·
    <our message>`, no retry. (Within the budget it shows no notice: the contract says it does so for a client
    signed in to a gateway; seen in tmux at 81 %, written in docs/explanation/decisions.md.)"""
    require_claude_code()
    (home := tmp_path / "home").mkdir()
    before = budgeted.log()
    retries = {"CLAUDE_CODE_MAX_RETRIES": "3"}  # it would, were it told it may
    done = run_claude(budgeted, "claude-tiny", ["Say hello", "--output-format", "json"], tmp_path, home, retries, BROKE)
    result = json.loads(done.stdout)
    print(result["result"])  # for the record (-s)
    assert done.returncode == 1 and result["is_error"] and result["api_error_type"] == "billing_error"
    assert result["result"].startswith("API Error: Request rejected (429) \xb7 broke's budget of 100 tokens a day")
    assert "ask the pod's admin to raise it" in result["result"]
    assert len(re.findall(r"POST /v1/messages 429 key=broke", budgeted.log()[len(before) :])) == 1
