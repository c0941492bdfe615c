"""Keys that share one engine do not share its prefix cache (VL_PREFIX_CACHE): measured on the real vLLM.

vLLM caches a prompt's blocks under the request's `cache_salt`; the bridge salts each key's generations
with a secret of the pod's, on the Anthropic route and the relayed OpenAI ones alike, in place of any salt
the client sent, except its gateway's (a gateway salts its own keys' requests). A key's second turn still
hits its first; another key's identical prompt hits nothing, unless the team asked for `shared`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.engine import tinymodel as tiny
from tests.support.bridge import Process, start_bridge
from tests.support.sdk import anthropic, openai
from tests.support.vllm_server import VllmServer

ALICE, BOB, GATEWAY = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef", "sk-gateway-0123456789abcdef"


def team(root: Path, **settings: str) -> dict[str, str]:
    return {"VL_API_KEYS": f"alice:{ALICE},bob:{BOB}", "VL_STATE_DIR": str(root / "state"), **settings}


@pytest.fixture(scope="module")
def per_key(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("per-key")  # a worker pod: its gateway's key is accepted too
    with start_bridge(vllm_server.url, root / "bridge.log", team(root, VL_WORKER_KEY=GATEWAY)) as bridge:
        yield bridge


@pytest.fixture(scope="module")
def shared(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("shared")
    with start_bridge(vllm_server.url, root / "bridge.log", team(root, VL_PREFIX_CACHE="shared")) as bridge:
        yield bridge


def a_new_prompt() -> str:
    """A prompt no earlier request has put in the session vLLM's cache, several blocks long."""
    return f"{tiny.MARK_TEXT} {uuid.uuid4().hex} " + " ".join(f"word{n}" for n in range(300))


def cached_by_messages(bridge: Process, key: str, prompt: str) -> int:
    client = anthropic.Anthropic(base_url=bridge.url, api_key=key, max_retries=0)
    answer = client.messages.create(model="claude-tiny", max_tokens=4, messages=[{"role": "user", "content": prompt}])
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) > 300
    return answer.usage.cache_read_input_tokens or 0


def cached_by_chat(bridge: Process, key: str, prompt: str, salt: str | None = None) -> int:
    client = openai.OpenAI(base_url=f"{bridge.url}/v1", api_key=key, max_retries=0)
    extra = {"cache_salt": salt} if salt else None
    answer = client.chat.completions.create(
        model="claude-tiny", max_tokens=4, messages=[{"role": "user", "content": prompt}], extra_body=extra
    )
    assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    return answer.usage.prompt_tokens_details.cached_tokens or 0


def test_another_key_s_identical_prompt_gets_no_cached_token_while_the_key_s_second_turn_does(per_key: Process):
    prompt = a_new_prompt()
    first = cached_by_messages(per_key, ALICE, prompt)
    second = cached_by_messages(per_key, ALICE, prompt)
    stranger = cached_by_messages(per_key, BOB, prompt)
    print(f"per-key: alice first {first}, alice second {second}, bob's identical first {stranger} cached tokens")
    assert first == 0 and second > 0 and stranger == 0


def test_a_relayed_request_is_salted_as_its_key_whatever_salt_it_sends(per_key: Process):
    prompt = a_new_prompt()
    assert cached_by_messages(per_key, ALICE, prompt) == 0
    assert cached_by_chat(per_key, ALICE, prompt) > 0  # the same key's salt on the OpenAI route
    assert cached_by_chat(per_key, BOB, prompt, salt="a-guess-at-alice-s-salt") == 0
    assert cached_by_chat(per_key, BOB, prompt, salt="another-guess") > 0  # both were bob's salt, not his own


def test_the_gateway_s_own_salt_is_kept(per_key: Process):
    """A worker leaves the salt its gateway set per key: the same salt hits, another one does not."""
    prompt = a_new_prompt()
    assert cached_by_chat(per_key, GATEWAY, prompt, salt="gateway-salt-of-carol") == 0
    assert cached_by_chat(per_key, GATEWAY, prompt, salt="gateway-salt-of-carol") > 0
    assert cached_by_chat(per_key, GATEWAY, prompt, salt="gateway-salt-of-dave") == 0


def test_a_team_that_shares_its_prefix_gets_the_other_key_s_cached_tokens(shared: Process):
    prompt = a_new_prompt()
    first = cached_by_messages(shared, ALICE, prompt)
    stranger = cached_by_messages(shared, BOB, prompt)
    print(f"shared: alice first {first}, bob's identical first {stranger} cached tokens")
    assert first == 0 and stranger > 0
