"""API keys (VL_API_KEYS): who gets in, and usage counted per key name or salted hash, never per key."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.bridge.auth import SALT_FILE, ApiKeys, label_of
from runtime.client.status import render
from runtime.engine import tinymodel as tiny
from runtime.health import serves_model
from runtime.settings import load_settings
from runtime.state.enginehealth import FILE as ENGINE_HEALTH
from runtime.state.enginehealth import write_engine_stopped
from runtime.state.statefile import write_json
from tests.support.bench_report import nemotron_on_an_ada
from tests.support.bridge import Process, pod_status, start_bridge
from tests.support.sdk import anthropic
from tests.support.vllm_server import VllmServer

ALICE, ANONYMOUS = "sk-alice-0123456789", "sk-anon-9876543210"
ASK = {"model": "claude-tiny", "max_tokens": 20, "messages": [{"role": "user", "content": tiny.MARK_TEXT}]}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("guarded")


@pytest.fixture(scope="module")
def guarded(vllm_server: VllmServer, root: Path) -> Iterator[Process]:
    settings = {"VL_API_KEYS": f"alice:{ALICE}, {ANONYMOUS}", "VL_STATE_DIR": str(root / "state")}
    with start_bridge(vllm_server.url, root / "bridge.log", settings) as bridge:
        yield bridge


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-api-key": "sk-wrong"}, {"authorization": "Bearer sk-wrong"}, {"authorization": f"Basic {ALICE}"},
     {"authorization": f"Bearer {ALICE}", "x-api-key": ANONYMOUS}],
    ids=["none", "wrong-x-api-key", "wrong-bearer", "not-bearer", "two-different-keys"],
)  # fmt: skip
def test_refused_without_a_valid_key(guarded: Process, headers: dict[str, str]) -> None:
    for method, path in (
        ("POST", "/v1/messages"),
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/metrics"),
    ):
        response = httpx.request(method, guarded.url + path, json=ASK, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["x-should-retry"] == "false"  # Claude Code would retry for ~3 minutes


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": ALICE},
        {"authorization": f"Bearer {ANONYMOUS}"},
        {"authorization": f"bearer {ALICE}", "x-api-key": ALICE},
    ],
    ids=["x-api-key", "bearer", "both-agree"],
)
def test_accepted_with_a_valid_key(guarded: Process, headers: dict[str, str]) -> None:
    response = httpx.post(f"{guarded.url}/v1/messages", json=ASK, headers=headers)
    assert response.status_code == 200 and response.json()["content"][0]["text"] == tiny.ANSWER


def test_sdk_clients_with_api_key_or_auth_token(guarded: Process) -> None:
    """ANTHROPIC_API_KEY travels as x-api-key, ANTHROPIC_AUTH_TOKEN as a Bearer token."""
    for client in (anthropic.Anthropic(base_url=guarded.url, api_key=ALICE, max_retries=0),
                   anthropic.Anthropic(base_url=guarded.url, auth_token=ANONYMOUS, max_retries=0)):  # fmt: skip
        assert client.messages.create(**ASK).content[0].text == tiny.ANSWER


def test_health_and_warm_up_stay_open(guarded: Process) -> None:
    assert httpx.get(f"{guarded.url}/health").status_code == 200
    assert httpx.head(f"{guarded.url}/").status_code == 200


def test_an_engine_left_stopped_makes_health_say_stopped_and_keys_learn_why(guarded: Process, root: Path) -> None:
    """A sick host, or a setting vLLM cannot take: the supervisor leaves the engine stopped; `/health` says so in one
    word (pod up stops waiting on it), and a key's holder reads the supervisor's line, which says what to do."""
    why = ("exited with code 1; not restarted after 1 failed start in a row: this host is sick: recreate the pod "
           "(python -m runtime pod replace POD: a new pod lands elsewhere)")  # fmt: skip
    write_engine_stopped(root / "state", "engine", why)
    try:
        assert httpx.get(f"{guarded.url}/health").json() == {"status": "stopped"}
        keyed = httpx.get(f"{guarded.url}/health", headers={"x-api-key": ALICE}).json()
        assert keyed["status"] == "stopped" and keyed["stopped"] == {"engine": why}
        assert not serves_model(200, httpx.get(f"{guarded.url}/health", headers={"x-api-key": ALICE}).content)
        status = pod_status(guarded.url, ALICE)  # the console's source, and `python -m runtime status`'s
        assert status["stopped"] == {"engine": why} and f"Stopped engine {why}" in render(status).splitlines()
    finally:
        write_engine_stopped(root / "state", "engine", None)  # launched again
    assert httpx.get(f"{guarded.url}/health").json() == {"status": "ok"}


def test_a_lost_cluster_node_makes_the_pod_degraded_and_is_named_with_since_when(guarded: Process, root: Path) -> None:
    """Rank 0's node link writes each worker's state (runtime.pod.nodelink): `/health`, the console's status and
    `runtime status` say which node is lost and since when, the pod degraded (its other nodes serve)."""
    state = root / "state"
    write_json(state / ENGINE_HEALTH, {"engine": "healthy", "node 1": "lost since 18:13:45 UTC"})
    try:
        assert httpx.get(f"{guarded.url}/health").json() == {"status": "degraded"}
        keyed = httpx.get(f"{guarded.url}/health", headers={"x-api-key": ALICE}).json()
        assert keyed["engines"] == {"engine": "healthy", "node 1": "lost since 18:13:45 UTC"}
        status = pod_status(guarded.url, ALICE)
        assert status["nodes"] == {"node 1": "lost since 18:13:45 UTC"} and status["engine"]["state"] == "degraded"
        assert "Node 1  lost since 18:13:45 UTC" in render(status).splitlines()
    finally:
        (state / ENGINE_HEALTH).unlink()
    assert pod_status(guarded.url, ALICE)["nodes"] is None


def test_usage_is_counted_per_key_name_never_per_key(guarded: Process) -> None:
    httpx.post(f"{guarded.url}/v1/messages", json=ASK, headers={"x-api-key": ALICE})
    httpx.post(f"{guarded.url}/v1/messages", json=ASK, headers={"x-api-key": ANONYMOUS})
    metrics = httpx.get(f"{guarded.url}/metrics", headers={"x-api-key": ALICE}).text
    anonymous = label_of(ANONYMOUS, (guarded.log_path.parent / "state" / SALT_FILE).read_bytes())
    for label in ("alice", anonymous):
        assert re.search(
            rf'bridge_requests_total\{{error_type="",key="{re.escape(label)}",route="/v1/messages",status="200"\}} [1-9]',
            metrics,
        )
        assert re.search(rf'bridge_tokens_total\{{key="{re.escape(label)}",kind="output"\}} [1-9]', metrics)
    assert re.search(
        r'bridge_requests_total\{error_type="authentication_error",key="-",route="/v1/messages",status="401"\}', metrics
    )
    for secret in (ALICE, ANONYMOUS):
        assert secret not in metrics and secret not in guarded.log()
    assert "API keys required (2 configured)" in guarded.log()


def test_strangers_refused_in_a_burst_leave_one_trace_line(guarded: Process) -> None:
    """A burst of unauthenticated requests (150 in 0.22 s filled the Hub log's bridge section) leaves
    the first one's trace line; the rest are counted, and said in one line a minute at most."""
    marker = f"burst-{time.monotonic_ns()}"
    for n in range(40):
        httpx.post(f"{guarded.url}/v1/messages", json=ASK, headers={"x-request-id": f"{marker}-{n}"})
    ask = httpx.post(f"{guarded.url}/v1/messages", json=ASK, headers={"x-api-key": ALICE, "x-request-id": marker})
    assert ask.status_code == 200
    guarded.wait_for_log(f"client_id={marker}$")  # alice's request, after the burst: traced as always
    traced = [line for line in guarded.log().splitlines() if f"client_id={marker}-" in line]
    assert len(traced) <= 1  # the first of the burst, unless another test's refusal opened the minute


def test_roles_an_admin_marked_anywhere_else_the_first_entry_and_never_the_gateway() -> None:
    """`name:key:admin` makes that key the admin (and only it); entries without roles make the first one
    the admin (a pod's owner writes their key first); a worker's gateway key is never one."""

    def admins(keys: str, gateway: str | None = None) -> list[str]:
        entries = load_settings({"VL_API_KEYS": keys}).api_keys
        return [caller.label for caller, _ in ApiKeys(entries, b"secret", gateway).keys if caller.admin]

    assert admins(f"alice:{ALICE},ops:{ANONYMOUS}:admin") == ["ops"]
    assert admins(f"alice:{ALICE},ops:{ANONYMOUS}") == ["alice"]
    assert admins(f"alice:{ALICE}:admin,ops:{ANONYMOUS}:admin") == ["alice", "ops"]
    assert admins("", "sk-gateway-0123456789") == []
    entry = load_settings({"VL_API_KEYS": f"ops:{ANONYMOUS}:admin"}).api_keys[0]
    assert (entry.name, entry.key, entry.admin, entry.entry) == ("ops", ANONYMOUS, True, f"ops:{ANONYMOUS}:admin")


def test_the_admin_alone_keeps_a_bench_report_which_the_status_then_shows(guarded: Process) -> None:
    """`runtime bench` sends its report with the pod's key: an admin's is kept (beside the ledger) for the console and
    `runtime status`; another key's is refused, and so is anything that is not a report, checked field by field."""
    report = nemotron_on_an_ada()
    solo = report["solo"]

    def keep(key: str, body: object = None, content: bytes | None = None) -> httpx.Response:
        headers = {"x-api-key": key}
        url = f"{guarded.url}/v1/pod/bench"
        return (
            httpx.put(url, headers=headers, content=content) if content else httpx.put(url, headers=headers, json=body)
        )

    refused = keep(ANONYMOUS, report)
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
    wrong = keep(ALICE, report | {"solo": [{**solo[0], "decode_tok_s": "fast"}]})
    assert wrong.status_code == 400 and wrong.json()["error"]["message"].startswith("not a bench report: solo.0.")
    too_large = keep(ALICE, content=b"[" * 100_000)
    assert (too_large.status_code, too_large.json()["error"]["message"]) == (
        413, "the request body exceeds a bench report's limit of 64 KiB"
    )  # fmt: skip
    assert keep(ALICE, content=b"[" * 10_000).status_code == 400  # nested past 128 levels
    assert pod_status(guarded.url, ANONYMOUS)["bench"] is None  # none kept yet
    assert keep(ALICE, report).status_code == 204
    status = pod_status(guarded.url, ANONYMOUS)  # every key sees how fast the pod runs
    assert {name: value for name, value in status["bench"].items() if name != "at"} == report
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", status["bench"]["at"])
    row = next(line for line in render(status).splitlines() if line.startswith("Bench"))
    assert row.endswith(
        ": solo 199.4 tok/s at 3,050 tokens, 8 sessions 583.2 tok/s, prefill 21,333.3 tok/s cold, "
        "0.95 of the notes' solo on an RTX 6000 Ada"
    )
