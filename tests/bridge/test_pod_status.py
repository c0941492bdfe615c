"""`GET /v1/pod/status` (issue 12): the console's data, from a real bridge in front of the real vLLM.

Counts grow with what clients were told (the anthropic SDK's own usage figures), per key label; the
body never holds a key or token, wherever one was planted (keys, environment, build facts, engine log);
the engine's state follows the engine: starting (with its log), healthy, restarting.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.bridge.affinity import SESSION_HEADER
from runtime.bridge.auth import SALT_FILE, label_of
from runtime.bridge.enginemetrics import EngineView, engine_view
from runtime.engine import tinymodel as tiny
from tests.support.bridge import Process, pod_status, start_bridge, start_stand_in
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.sdk import anthropic
from tests.support.vllm_server import MAX_MODEL_LEN, VllmServer

pytestmark = pytest.mark.slow  # bridge processes (and the session's vLLM for some)

ALICE, BOB, UNNAMED = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef", "sk-unnamed-0123456789abcd"
HF_TOKEN = "hf_plantedPlantedPlanted0123456789"
FACT_SECRET = "planted-build-secret-0123456789"
LOG_SECRET = "planted-in-the-environment-0123456789"
PLANTED = (ALICE, BOB, UNNAMED, HF_TOKEN, FACT_SECRET, LOG_SECRET)


def pod_settings(root: Path) -> dict[str, str]:
    """Keys, a price, build facts with secret-looking names, and an HF token in the environment."""
    marker = root / "image_prebaked"
    facts = {
        "target": "cpu",
        "revision": "83c465b",
        "hf_token": FACT_SECRET,
        "build": {"registry_password": FACT_SECRET},
    }
    marker.write_text(json.dumps(facts))
    return {
        "VL_API_KEYS": f"alice:{ALICE}, bob:{BOB}, {UNNAMED}",
        "VL_STATE_DIR": str(root / "state"),
        "VL_PREBAKED_MARKER": str(marker),
        "VL_COST_PER_HOUR": "0.69",
        "HF_TOKEN": HF_TOKEN,
        "WANDB_API_KEY": LOG_SECRET,  # another service's secret in the pod's environment
    }


@pytest.fixture(scope="module")
def pod(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    root = tmp_path_factory.mktemp("pod")
    with start_bridge(vllm_server.url, root / "bridge.log", pod_settings(root)) as bridge:
        wait_until(
            lambda: pod_status(bridge.url, ALICE)["engine"]["state"] == "healthy",
            "the bridge to know the model",
            60,
            0.2,
        )
        yield bridge


def get(bridge: Process, key: str | None, **headers: str) -> httpx.Response:
    auth = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{bridge.url}/v1/pod/status", headers=auth | headers, timeout=30)


def pod_state_dir(bridge: Process) -> Path:
    """The VL_STATE_DIR that pod_settings gave this bridge (beside its log)."""
    return bridge.log_path.parent / "state"


def by_name(state: dict) -> dict[str, dict]:
    return {row["name"]: row for row in state["keys"]}


def test_without_a_key_the_answer_is_the_401_envelope(pod: Process):
    for headers in ({}, {"x-api-key": "sk-wrong-0123456789abcdef"}):
        response = get(pod, None, **headers)
        assert response.status_code == 401 and response.json()["type"] == "error"
        assert response.json()["error"]["type"] == "authentication_error"
    assert get(pod, None, **{"x-api-key": BOB}).status_code == 200  # x-api-key as well as Bearer


def test_a_healthy_pod_says_its_model_engine_image_and_cost(pod: Process, vllm_server: VllmServer):
    state = pod_status(pod.url, ALICE)
    assert state["model"] == {"name": vllm_server.model, "context_window": MAX_MODEL_LEN}
    assert state["engine"] == {"state": "healthy", "boot_log": []}
    assert state["image"] == {"target": "cpu", "revision": "83c465b", "build": {}}  # secret-looking names dropped
    assert state["uptime_s"] > 0
    assert state["cost"]["per_hour"] == 0.69 and state["cost"]["so_far"] >= 0
    assert isinstance(state["traffic"]["running"], int) and isinstance(state["traffic"]["waiting"], int)
    assert state["gpus"] or state["gpu_note"]  # this machine has none; a GPU machine lists them
    panel = pod_status(pod.url, ALICE)["capacity"]  # a second sample: rates since the first
    assert panel["over_s"] > 0 and 0 <= panel["kv_use"] <= 1
    # Nothing ran on the session's vLLM since this bridge started (the module's first requests come later): an
    # engine with nothing running, waiting or generated over the window is idle, and the verdict says exactly that.
    assert (panel["running"], panel["waiting"], panel["decode_tokens_per_s"], panel["prefill_tokens_per_s"]) == (
        0, 0, 0.0, 0.0,
    )  # fmt: skip
    assert panel["verdict"] == "idle"


def test_usage_grows_per_key_as_the_clients_were_told(pod: Process):
    before = pod_status(pod.url, ALICE)
    alice = anthropic.Anthropic(base_url=pod.url, api_key=ALICE, max_retries=0)
    unnamed = anthropic.Anthropic(base_url=pod.url, auth_token=UNNAMED, max_retries=0)
    prompt = [{"role": "user", "content": f"{tiny.MARK_TEXT} " + " ".join(f"word{n}" for n in range(300))}]
    told = [alice.messages.create(model="claude-tiny", max_tokens=8, messages=prompt) for _ in range(2)]
    with alice.messages.stream(model="claude-tiny", max_tokens=8, messages=prompt) as stream:
        told.append(stream.get_final_message())
    unnamed.messages.create(model="claude-tiny", max_tokens=8, messages=prompt)
    with pytest.raises(anthropic.BadRequestError):
        alice.messages.create(model="claude-tiny", max_tokens=8, messages=[])  # one error of alice's
    after = pod_status(pod.url, ALICE)

    salt = (pod_state_dir(pod) / SALT_FILE).read_bytes()
    was, now = by_name(before).get("alice"), by_name(after)["alice"]
    counts = ("requests", "input_tokens", "cached_tokens", "output_tokens", "errors")
    grown = {k: now[k] - (was[k] if was else 0) for k in counts}
    assert grown == {
        "requests": 4,
        "input_tokens": sum(m.usage.input_tokens for m in told),
        "cached_tokens": sum(m.usage.cache_read_input_tokens or 0 for m in told),
        "output_tokens": sum(m.usage.output_tokens for m in told),
        "errors": 1,
    }
    assert sum(m.usage.cache_read_input_tokens or 0 for m in told) > 0  # the same prompt, thrice
    assert now["busy_s"] > (was["busy_s"] if was else 0) and now["cost"] == pytest.approx(
        now["busy_s"] * 0.69 / 3600, abs=1e-6
    )
    assert by_name(after)[label_of(UNNAMED, salt)]["requests"] >= 1
    traffic = after["traffic"]
    assert traffic["requests_per_min"] > before["traffic"]["requests_per_min"]
    assert traffic["output_tokens_per_s"] > 0 and traffic["ttft_p50_s"] is not None
    assert traffic["ttft_p50_s"] <= traffic["ttft_p95_s"]
    assert traffic["prompt_tokens"] - before["traffic"]["prompt_tokens"] >= sum(
        m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) for m in told
    )
    assert traffic["prefix_cache_hit_rate"] == round(traffic["cached_tokens"] / traffic["prompt_tokens"], 4)
    assert after["cost"]["per_million_output_tokens"] == pytest.approx(
        0.69 / (traffic["output_tokens_per_s"] * 3600) * 1e6, rel=1e-3
    )
    assert "-" not in by_name(after) and all(row["name"] not in PLANTED for row in after["keys"])


def test_an_ordinary_key_sees_its_own_usage_and_the_pod_s_health_the_admin_sees_all(pod: Process):
    """alice, the first of entries without roles, is the admin; bob sees his usage, his sessions (even one
    that reuses the id of alice's) and the pod's health, never another key's; /metrics is the admin's."""
    session = {SESSION_HEADER: "shared-session-id"}
    for key in (ALICE, BOB):
        anthropic.Anthropic(base_url=pod.url, api_key=key, max_retries=0, default_headers=session).messages.create(
            model="claude-tiny", max_tokens=4, messages=[{"role": "user", "content": tiny.MARK_TEXT}]
        )
    bob, alice = pod_status(pod.url, BOB), pod_status(pod.url, ALICE)
    assert (bob["you"], alice["you"]) == ({"key": "bob", "admin": False}, {"key": "alice", "admin": True})
    assert [row["name"] for row in bob["keys"]] == ["bob"]
    assert {"alice", "bob"} <= set(by_name(alice))

    def owners(state: dict) -> list[set[str]]:
        return [{agent["key"] for agent in s["agents"]} for s in state["sessions"] if s["id"] == "shared-session-id"]

    assert owners(bob) == [{"bob"}] and sorted(map(sorted, owners(alice))) == [["alice"], ["bob"]]
    assert bob["engine"]["state"] == "healthy" and bob["model"] and bob["capacity"] and "traffic" in bob
    refused = httpx.get(f"{pod.url}/metrics", headers={"authorization": f"Bearer {BOB}"}, timeout=30)
    assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
    assert "bob" not in refused.text and "alice" not in refused.text
    shown = httpx.get(f"{pod.url}/metrics", headers={"authorization": f"Bearer {ALICE}"}, timeout=30)
    assert shown.status_code == 200 and 'key="bob"' in shown.text


def test_no_key_or_token_anywhere_in_the_body(pod: Process):
    anthropic.Anthropic(base_url=pod.url, api_key=BOB, max_retries=0).messages.create(
        model="claude-tiny", max_tokens=4, messages=[{"role": "user", "content": f"{tiny.MARK_TEXT} {BOB} {ALICE}"}]
    )
    body = get(pod, BOB).text
    assert "bob" in body and [secret for secret in PLANTED if secret in body] == []


def test_a_starting_engine_shows_its_log_redacted_and_without_controls(tmp_path: Path):
    settings = pod_settings(tmp_path)
    state_dir = Path(settings["VL_STATE_DIR"])
    state_dir.mkdir()
    lines = [f"INFO loading shard {n}" for n in range(30)]
    lines += [
        f"ERROR startup with --api-key {ALICE} WANDB_API_KEY={LOG_SECRET} HF_TOKEN={HF_TOKEN}",
        "\x1b[31mred\x1b[0m \x1b]52;c;eA==\x07!",
    ]
    (state_dir / "engine.log").write_text("\n".join(lines) + "\n")
    nobody = f"http://127.0.0.1:{free_port()}"
    with start_bridge(nobody, tmp_path / "bridge.log", settings) as bridge:
        response = get(bridge, ALICE)
    assert response.status_code == 200, response.text  # a starting engine does not keep the console dark
    state = response.json()
    assert (state["model"], state["engine"]["state"]) == (None, "starting")
    assert state["engine"]["boot_log"][:18] == lines[12:30]  # the last 20 lines
    assert state["engine"]["boot_log"][18:] == [
        "ERROR startup with --api-key [redacted] WANDB_API_KEY=[redacted] HF_TOKEN=[redacted]",
        "red !",
    ]
    assert (state["traffic"]["running"], state["traffic"]["waiting"]) == (None, None)
    assert [secret for secret in PLANTED if secret in response.text] == []


def test_an_engine_that_stops_answering_is_restarting(tmp_path: Path):
    settings = pod_settings(tmp_path)
    Path(settings["VL_STATE_DIR"]).mkdir()
    (Path(settings["VL_STATE_DIR"]) / "engine.log").write_text("engine died\nrelaunching\n")
    with (
        start_stand_in(tmp_path / "upstream.log") as upstream,
        start_bridge(upstream.url, tmp_path / "bridge.log", settings) as bridge,
    ):
        wait_until(
            lambda: pod_status(bridge.url, ALICE)["engine"]["state"] == "healthy", "the model to be known", 30, 0.2
        )
        upstream.process.terminate()
        upstream.process.wait(10)
        state = pod_status(bridge.url, ALICE)
    assert state["engine"] == {"state": "restarting", "boot_log": ["engine died", "relaunching"]}
    assert state["model"]["name"]  # the last one known


def test_the_queue_is_summed_over_vllms_engines():
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 7.0\n'
        "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0\n'
        "# TYPE vllm:prefix_cache_queries counter\n"
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 200.0\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 150.0\n'
    )
    assert engine_view((True, text.encode())) == EngineView(True, 5, 7, None, 0.75)
    assert engine_view((True, b"")) == EngineView(True)  # an engine that exports none of them
    assert engine_view((False, None)) == EngineView(False)  # an engine that exports neither
