"""Why a turn missed the prompt cache (Anthropic's `diagnostics.cache_miss_reason`): the reasons from the prompts'
fingerprints, then two turns of one conversation through the bridge and real vLLM, each answer parsed by the SDK
into its types, streamed and not, and what the operator sees on the trace line and the console."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import msgspec
import pytest

from runtime.bridge.cachemiss import EVICTED, CacheCheck, Fingerprint, Prompts, reason
from runtime.bridge.schema import MessagesRequest
from runtime.bridge.sessions import Asker
from runtime.engine import tinymodel as tiny
from tests.support.bridge import Process
from tests.support.sdk import anthropic

TOOL = {"name": "look", "description": "Look something up.", "input_schema": {"type": "object", "properties": {}}}
FIRST = [{"role": "user", "content": f"{tiny.MARK_TEXT} " + " ".join(f"word{n}" for n in range(600))}]


def fingerprint(prompt_tokens: int = 0, **request: Any) -> Fingerprint:
    fields = {"model": "tiny", "max_tokens": 10, "messages": FIRST, "system": "Be brief.", "tools": [TOOL]}
    found = Fingerprint.of(MessagesRequest(**(fields | request)))
    found.prompt_tokens = prompt_tokens
    return found


def next_turn(*extra: dict) -> list[dict]:
    return [*FIRST, {"role": "assistant", "content": tiny.ANSWER}, *extra]


AGAIN = {"role": "user", "content": f"{tiny.MARK_TEXT} again"}


# --- the reasons, from the fingerprints ---------------------------------------------------------------------------


def test_a_turn_that_only_appends_has_no_reason_and_each_change_is_named_with_the_tokens_it_cost() -> None:
    before = fingerprint(prompt_tokens=1000)
    assert reason(before, fingerprint(messages=next_turn(AGAIN))) is None
    assert reason(before, fingerprint(model="other")) == {"type": "model_changed", "cache_missed_input_tokens": 1000}
    assert reason(before, fingerprint(system="Be long.")) == {
        "type": "system_changed",
        "cache_missed_input_tokens": 1000,
    }
    assert reason(before, fingerprint(tools=[TOOL | {"name": "peek"}]))["type"] == "tools_changed"
    assert reason(before, fingerprint(thinking={"type": "adaptive"})) == {"type": "unavailable"}
    assert reason(None, fingerprint()) == {"type": "previous_message_not_found"}


def test_an_earlier_message_edited_costs_the_prompt_from_that_message_on() -> None:
    messages = [*FIRST, {"role": "assistant", "content": "x" * 3000}, {"role": "user", "content": "y" * 3000}]
    before = fingerprint(prompt_tokens=2000, messages=messages)
    edited = reason(before, fingerprint(messages=[*messages[:2], {"role": "user", "content": "z"}]))
    assert edited is not None and edited["type"] == "messages_changed"
    share = before.sizes[-1] / (before.head_size + sum(before.sizes))  # the last message's part of the prompt
    assert edited["cache_missed_input_tokens"] == round(2000 * share) and 0.2 < share < 0.4
    shorter = reason(before, fingerprint(messages=messages[:1]))
    assert shorter is not None and shorter["type"] == "messages_changed"


def test_two_edited_messages_cost_the_prompt_from_the_first_of_them_on() -> None:
    """Both later messages edited: the cache is lost from the first edit on, so the tokens counted are those two
    messages' share of the prompt, not the last one's alone."""
    messages = [*FIRST, {"role": "assistant", "content": "x" * 3000}, {"role": "user", "content": "y" * 3000}]
    before = fingerprint(prompt_tokens=2000, messages=messages)
    both = [*FIRST, {"role": "assistant", "content": "X" * 3000}, {"role": "user", "content": "Y" * 3000}]
    edited = reason(before, fingerprint(messages=both))
    total = before.head_size + sum(before.sizes)
    from_first, from_last = round(2000 * sum(before.sizes[1:]) / total), round(2000 * before.sizes[-1] / total)
    assert edited == {"type": "messages_changed", "cache_missed_input_tokens": from_first}
    assert from_first > 1.5 * from_last  # counted from the last edit, the figure would be about half


def test_a_key_finds_only_its_own_prompts_and_one_past_its_share_forgets_its_own() -> None:
    prompts = Prompts(capacity=8, per_key=2)
    for n in range(3):
        prompts.keep("alice", "s", "main", f"msg_{n}", fingerprint())
    prompts.keep("bob", "s", "main", "msg_b", fingerprint())
    assert prompts.find("alice", "msg_b") is None and prompts.find("bob", "msg_b") is not None
    assert [prompts.find("alice", f"msg_{n}") is not None for n in range(3)] == [False, True, True]
    assert prompts.last_of("alice", "s", "main") is prompts.find("alice", "msg_2")


def test_the_operator_sees_a_prefix_the_engine_evicted_though_the_client_never_asked() -> None:
    """Nothing changed between two turns of an agent, and yet the engine read little of the prompt from its cache:
    the console's own reason (`evicted`), never one of Anthropic's types sent to the client."""
    prompts, asker = Prompts(), Asker("k", session="s")

    def check(message_id: str, messages: list[dict]) -> CacheCheck:
        return CacheCheck(prompts, asker, MessagesRequest(model="tiny", max_tokens=5, messages=messages), message_id)

    assert check("msg_1", FIRST).settle(prompt_tokens=1200, cached_tokens=0) is None  # a first turn
    second = check("msg_2", next_turn(AGAIN))
    assert second.answer is msgspec.UNSET and second.settle(prompt_tokens=1300, cached_tokens=40) == EVICTED
    third = check("msg_3", [*next_turn(AGAIN), {"role": "assistant", "content": "ok"}, AGAIN])
    assert third.settle(prompt_tokens=1400, cached_tokens=1296) is None  # read from the cache, as it should


# --- through the bridge and real vLLM ------------------------------------------------------------------------------

conversations = itertools.count()


def turn(client: anthropic.Anthropic, stream: bool, session: str, previous: str | None, **request: Any):
    """One turn asking why it missed the cache; the SDK's own types (`Message`, its `diagnostics`)."""
    fields = {"model": "claude-tiny", "max_tokens": 5, "system": "Be brief.", "tools": [TOOL], "messages": FIRST}
    fields |= request | {"diagnostics": {"previous_message_id": previous}}
    headers = {"x-claude-code-session-id": session}
    if not stream:
        return client.messages.create(**fields, extra_headers=headers)
    events = list(client.messages.create(**fields, stream=True, extra_headers=headers))
    assert events[0].type == "message_start"
    return events[0].message  # where Claude Code 2.1.332 reads the reason of a streamed turn


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"messages": next_turn(AGAIN)}, None),
        ({"system": "Be long.", "messages": next_turn(AGAIN)}, "system_changed"),
        ({"tools": [TOOL | {"name": "peek"}], "messages": next_turn(AGAIN)}, "tools_changed"),
        ({"messages": [{"role": "user", "content": "edited"}, *next_turn(AGAIN)[1:]]}, "messages_changed"),
    ],
    ids=["unchanged", "system", "tools", "edited"],
)
def test_the_second_turn_says_why_it_missed_the_cache(
    client: anthropic.Anthropic, bridge: Process, stream: bool, change: dict, expected: str | None
) -> None:
    session = f"cache-{next(conversations)}"
    first = turn(client, False, session, None)
    assert first.diagnostics is None  # `null` opts in: nothing to compare on a first turn
    second = turn(client, stream, session, first.id, **change)
    if expected is None:
        assert second.diagnostics is None
    else:
        miss = second.diagnostics.cache_miss_reason
        assert miss.type == expected and miss.cache_missed_input_tokens > 0, miss
    if not stream:  # whole answers: the cache read is known, and the trace line says the reason
        prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
        read = second.usage.cache_read_input_tokens or 0
        assert read > prompt * 0.9 if expected is None else read < prompt / 2, (read, prompt)
        trace = bridge.wait_for_log(rf"trace id={second.id} ")
        assert (f" miss={expected}" in trace) == (expected is not None), trace


@pytest.mark.vllm
def test_an_unknown_previous_message_is_said_and_the_console_counts_the_reasons(
    client: anthropic.Anthropic, bridge: Process
) -> None:
    session = f"cache-{next(conversations)}"
    answer = turn(client, False, session, "msg_0123456789abcdef01234567")
    assert answer.diagnostics.cache_miss_reason.type == "previous_message_not_found"
    turn(client, False, session, answer.id, system="Be long.", messages=next_turn(AGAIN))
    status = httpx.get(f"{bridge.url}/v1/pod/status", timeout=30).json()
    [found] = [s for s in status["sessions"] if s["id"] == session]
    assert found["agents"][0]["cache_misses"] == {"previous_message_not_found": 1, "system_changed": 1}
