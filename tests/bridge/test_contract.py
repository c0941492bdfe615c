"""Claude Code's gateway contract ("Gateway protocol reference"), clause by clause, against the bridge
with keys in front of real vLLM; docs/explanation/bridge.md's "Claude Code's gateway contract" table points here.

The real CLI's side of it (model discovery, a session with a subagent) is in test_claude_code.py.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator

import httpx
import pytest

from runtime.bridge.errors import RETRY_AFTER_S, BridgeError
from runtime.bridge.exchange import upstream_refusal
from runtime.engine import tinymodel as tiny
from tests.support.bridge import Process, start_bridge
from tests.support.net import free_port
from tests.support.sdk import anthropic
from tests.support.vllm_server import VllmServer

KEY = "sk-contract-0123456789"
AUTH = {"authorization": f"Bearer {KEY}", "anthropic-version": "2023-06-01"}
ASK = {
    "model": "claude-tiny",
    "max_tokens": 20,
    "messages": [{"role": "user", "content": f"Say hello {tiny.MARK_TEXT}"}],
}
EPHEMERAL = {"type": "ephemeral"}
BASH = {"name": tiny.TOOL_NAME, "description": "Run a shell command.", "cache_control": EPHEMERAL,
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}  # fmt: skip


@pytest.fixture(scope="module")
def guarded(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("contract")
    settings = {"VL_API_KEYS": f"team:{KEY}", "VL_STATE_DIR": str(root / "state")}
    with start_bridge(vllm_server.url, root / "bridge.log", settings) as bridge:
        yield bridge


@pytest.fixture(scope="module")
def client(guarded: Process) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=guarded.url, auth_token=KEY, max_retries=0)


def answered(guarded: Process, body: dict, headers: dict[str, str] | None = None, path: str = "/v1/messages") -> dict:
    response = httpx.post(guarded.url + path, json=body, headers=AUTH | (headers or {}), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


# --- endpoints ---


@pytest.mark.parametrize("path", ["/", "/api/hello"])
def test_connection_probes_are_answered_without_a_key_or_a_body(guarded: Process, path: str) -> None:
    """Claude Code sends HEAD /api/hello (and a HEAD / warm-up) before anything else, with no key."""
    probe = httpx.head(guarded.url + path)
    assert probe.status_code == 200 and probe.content == b""
    assert httpx.get(guarded.url + path).content == b""  # nothing to read there either
    marker = f"after-probe-{path.strip('/').replace('/', '-') or 'root'}"  # a traced request, written after
    assert httpx.get(guarded.url + "/v1/no-such-route", headers=AUTH | {"x-request-id": marker}).status_code == 501
    guarded.wait_for_log(rf"trace id=\S+ GET other 501 key=team .*client_id={marker}")
    assert not re.search(rf"trace id=\S+ (HEAD|GET) {re.escape(path)} ", guarded.log()), "anyone may probe: not traced"


def test_inference_is_matched_on_the_path_not_the_url(guarded: Process) -> None:
    """Claude Code posts to /v1/messages?beta=true."""
    assert answered(guarded, ASK, path="/v1/messages?beta=true")["content"][0]["text"] == tiny.ANSWER


# --- headers and fields: an open list ---

OPEN_LIST = {
    "context_management without its beta": ({"context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                                               "keep": "all"}]}}, {}),
    "clear_tool_uses edit": ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, {}),
    "tool strict and defer_loading": ({"tools": [BASH | {"strict": True, "defer_loading": True}]}, {}),
    "output_config without its beta": ({"output_config": {"effort": "high"}}, {}),
    "an effort level we do not know": ({"output_config": {"effort": "ultra"}}, {}),
    "a field we do not know": ({"future_field": {"any": ["shape"]}, "container": "c", "speed": "fast"}, {}),
    "betas we do not know": ({}, {"anthropic-beta": "claude-code-20250219,some-future-beta-2027-01-01"}),
    "Claude Code's own headers": ({}, {"x-app": "cli", "x-claude-code-session-id": "s", "x-claude-code-agent-id": "a",
                                       "x-claude-code-request-class": "main", "anthropic-dangerous-direct-browser-access":
                                       "true", "x-stainless-retry-count": "0"}),
}  # fmt: skip


@pytest.mark.parametrize(("extra", "headers"), OPEN_LIST.values(), ids=OPEN_LIST.keys())
def test_fields_and_headers_we_do_not_use_are_ignored(guarded: Process, extra: dict, headers: dict) -> None:
    """Never a 400 for a field we do not read, nor for one of a pair (a beta and its field) without the other."""
    assert answered(guarded, ASK | extra, headers)["content"][0]["text"] == tiny.ANSWER


# --- cache_control and mid-conversation system entries ---

# A turn as Claude Code 2.1.332 sends it: system blocks and tools marked for caching, a reminder and the
# prompt as two user messages, then the environment as a `role: "system"` entry after them.
FIRST_TURN = {
    "model": "claude-tiny", "max_tokens": 20, "tools": [BASH],
    "system": [{"type": "text", "text": "You are Claude Code."},
               {"type": "text", "text": "Use the tools well. " * 40, "cache_control": EPHEMERAL}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>Attribution.</system-reminder>"},
                                     {"type": "text", "text": f"Say hello {tiny.MARK_TEXT}"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux\n" * 20,
                                        "cache_control": EPHEMERAL}]},
    ],
}  # fmt: skip


def next_turn(turn: dict, answer: str) -> dict:
    """The turn after: the answer, the user's next words, and a new system entry after them (Claude Code's
    `<total_tokens>` reminder)."""
    following = copy.deepcopy(turn)
    following["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        {"role": "user", "content": [{"type": "text", "text": f"Again {tiny.MARK_TEXT}", "cache_control": EPHEMERAL}]},
        {"role": "system", "content": "<total_tokens>1234 tokens left</total_tokens>"},
    ]
    return following


def test_mid_conversation_system_entries_keep_the_prefix_cached(client: anthropic.Anthropic) -> None:
    """Every system entry stays where it was sent: the next turn reads all of this one from vLLM's prefix
    cache. (Merged into the system prompt, each new entry would change the prompt's start, and the cache
    would hold nothing past the tools.)"""
    client.messages.create(**FIRST_TURN)
    again = client.messages.create(**FIRST_TURN)
    whole_turn_cached = again.usage.cache_read_input_tokens
    assert whole_turn_cached and again.content[0].text == tiny.ANSWER
    second = client.messages.create(**next_turn(FIRST_TURN, tiny.ANSWER))
    assert second.content[0].text == tiny.ANSWER
    assert second.usage.cache_read_input_tokens >= whole_turn_cached
    third = client.messages.create(**next_turn(next_turn(FIRST_TURN, tiny.ANSWER), tiny.ANSWER))
    assert third.usage.cache_read_input_tokens > second.usage.cache_read_input_tokens


# --- errors ---


@pytest.fixture(scope="module")
def engine_down(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A bridge whose engine does not answer (nothing listens on its port): every inference is a 529."""
    root = tmp_path_factory.mktemp("engine-down")
    upstream = f"http://127.0.0.1:{free_port()}"
    with start_bridge(upstream, root / "bridge.log", {"VL_API_KEYS": f"team:{KEY}"}) as bridge:
        yield bridge


@pytest.mark.slow  # a bridge process of its own, in front of no engine
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_overload_says_when_to_retry(engine_down: Process, stream: bool) -> None:
    """Claude Code retries a 529, or a body with `"type":"overloaded_error"`, after `retry-after`."""
    response = httpx.post(f"{engine_down.url}/v1/messages", json=ASK | {"stream": stream}, headers=AUTH, timeout=60)
    assert response.status_code == 529
    assert b'"type":"overloaded_error"' in response.content
    assert response.headers["retry-after"] == str(RETRY_AFTER_S[529]) and response.headers["x-should-retry"] == "true"


def test_an_ordinary_refusal_says_nothing_of_retrying(guarded: Process) -> None:
    refused = httpx.post(f"{guarded.url}/v1/messages", json={"model": "claude-tiny"}, headers=AUTH)
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    assert "retry-after" not in refused.headers and "x-should-retry" not in refused.headers


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/messages/batches"), ("GET", "/v1/files"), ("GET", "/v1/realtime")]
)
def test_an_api_the_pod_does_not_serve_is_not_supported_and_never_retried(
    guarded: Process, method: str, path: str
) -> None:
    """The contract's 501 `not_supported` with `x-should-retry: false` (a 404 reads as a missing resource)."""
    refused = httpx.request(method, guarded.url + path, json={}, headers=AUTH, timeout=60)
    assert refused.status_code == 501 and refused.headers["x-should-retry"] == "false"
    error = refused.json()["error"]
    assert error["type"] == "not_supported" and error["message"].startswith(f"{method} {path} is not served"), error


def test_safeguards_are_refused_by_name_so_that_the_client_runs_its_own_check(guarded: Process) -> None:
    """Auto mode's `safeguards`: no model here applies them; the contract wants a 400 whose message starts with the
    field's name (Claude Code's pattern, below), after which the client retries without them."""
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = ASK | {"safeguards": {"version": "2026-11-01", "checks": ["cyber"]}}
        refused = httpx.post(guarded.url + path, json=body, headers=AUTH, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
        assert re.match(r"^(?:body\.)?safeguards(?:\.\w+)*:", refused.json()["error"]["message"]), refused.text
    assert answered(guarded, ASK | {"safeguards": None})["content"][0]["text"] == tiny.ANSWER  # none sent


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"  # 1x1 pixel
PDF = "JVBERi0xLjQKJcfsj6IKMSAwIG9iago8PD4+CmVuZG9iagp0cmFpbGVyCjw8Pj4KJSVFT0YK"


@pytest.mark.parametrize(
    ("block", "rejected"),
    [({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}, "image_block"),
     ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}},
      "document_block")],
    ids=["image-to-a-text-model", "pdf"],
)  # fmt: skip
def test_what_the_model_cannot_take_is_a_capability_the_client_drops_and_retries_without(
    guarded: Process, block: dict, rejected: str
) -> None:
    body = {**ASK, "messages": [{"role": "user", "content": [block, {"type": "text", "text": "What is it?"}]}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        refused = httpx.post(guarded.url + path, json=body, headers=AUTH, timeout=60)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"] == {
            "type": "invalid_request_error",
            "message": f"capability_rejected: {rejected}",
        }


LOOK_BEHIND = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}, "required": ["a"]}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_schema_the_engine_cannot_compile_is_a_capability_and_a_wrong_one_the_clients_error(
    guarded: Process, stream: bool
) -> None:
    """`output_config.format` with a look-behind, which vLLM's grammar compilers lack: `structured_outputs_unsupported`
    (the client retries without structured output), as a 400 also when streamed, where vLLM refuses it after its 200;
    a `$ref` to nothing stays the engine's own words; a schema it can follow is answered."""

    def asked(schema: dict) -> httpx.Response:
        body = ASK | {"stream": stream, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
        return httpx.post(guarded.url + "/v1/messages", json=body, headers=AUTH, timeout=60)

    refused = asked(LOOK_BEHIND)
    assert (refused.status_code, refused.json()["error"]["message"]) == (
        400,
        "capability_rejected: structured_outputs_unsupported",
    )
    wrong = asked({"type": "object", "properties": {"a": {"$ref": "#/defs/none"}}})
    assert wrong.status_code == 400 and wrong.json()["error"]["message"].startswith("Grammar error: ")
    assert asked({"type": "object", "properties": {"a": {"type": "string"}}}).status_code == 200


def test_vllms_image_refusals_map_to_their_classes_and_the_rest_is_relayed_as_it_is() -> None:
    refusals = {  # as vLLM 0.32 words them
        "tiny is not a multimodal model": "capability_rejected: image_block",
        "At most 0 image(s) may be provided in one prompt.": "capability_rejected: image_block",
        "At most 4 image(s) may be provided in one prompt.": "capability_rejected: media_budget",
        "This model's maximum context length is 4096 tokens. However, you requested 5000 input tokens":
            "prompt is too long: 5000 tokens > 4095 maximum",
        "temperature must be non-negative": "temperature must be non-negative",
    }  # fmt: skip
    for said, relayed in refusals.items():
        assert upstream_refusal(BridgeError(400, said)).message == relayed
    lacking = "Grammar error: Unknown format: idn-hostname"  # only where the client asked for structured output
    assert (
        upstream_refusal(BridgeError(400, lacking), structured=True).message
        == "capability_rejected: structured_outputs_unsupported"
    )
    assert upstream_refusal(BridgeError(400, lacking)).message == lacking


# --- model discovery ---


def test_model_discovery_lists_claude_ids_first_with_names_to_show(guarded: Process) -> None:
    """Claude Code asks `GET /v1/models?limit=1000` (3 s, redirects refused) and keeps ids naming claude."""
    listing = httpx.get(f"{guarded.url}/v1/models?limit=1000", headers=AUTH, follow_redirects=False)
    assert listing.status_code == 200
    models = listing.json()["data"]
    assert [model["id"] for model in models] == ["claude-tiny", "tiny", "tiny[1m]"]
    for model in models:
        assert model["display_name"] == model["id"]
        assert model["description"] == f"tiny on this pod's vLLM, {models[0]['max_input_tokens']:,}-token window"
