"""The pod stopping itself (VL_IDLE_STOP_MIN, VL_MAX_SPEND): the real bridge marks the requests it serves,
the pod's own loop says why in its Hub log and then asks the RunPod stand-in to stop it, and a pod that
could not keep that promise refuses to start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from runtime.pod.hubside import PodHub
from runtime.pod.selfstop import SelfStop, SelfStopping
from runtime.pod.start import Pod
from runtime.runpod.api import RunPodClient
from runtime.settings import load_settings
from runtime.state.activity import activity_file
from tests.support.bridge import start_bridge
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.runpod_server import RunPodServer
from tests.support.sdk import anthropic
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.slow  # bridge processes, the test Hub and the RunPod stand-in

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-selfstop-0123456789abcdef"
GATEWAY_KEY = "sk-team-gateway-0123456789abcdef"
SELFCHECK_KEY = "sk-pod-selfcheck-0123456789abcdef"
LOGS = f"{HubServer.owner}/pod-logs"


def test_the_bridge_marks_what_it_serves_for_a_known_key_only(vllm_server: VllmServer, tmp_path: Path) -> None:
    settings = {"VL_STATE_DIR": str(tmp_path), "VL_API_KEYS": KEY, "VL_IDLE_STOP_MIN": "30"}
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", settings) as bridge:
        marked = activity_file(tmp_path)
        for refused in (httpx.get(f"{bridge.url}/health"), httpx.get(f"{bridge.url}/v1/models")):  # polling, strangers
            assert refused.status_code in (200, 401)
        assert not marked.exists()
        client = anthropic.Anthropic(base_url=bridge.url, api_key=KEY, max_retries=0, timeout=120)
        client.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hello"}])
        assert marked.exists()
        os.utime(marked, (0, 0))
        client.models.list()
        assert marked.stat().st_mtime > 0


def test_the_gateways_discovery_and_the_pods_own_checks_are_no_client(vllm_server: VllmServer, tmp_path: Path) -> None:
    """A team's worker: what its gateway asks on its own (models every 30 s, metrics for its panel) and the pod's
    self-check keep no GPU billing; what the gateway relays for a client does."""
    settings = {"VL_STATE_DIR": str(tmp_path), "VL_API_KEYS": KEY, "VL_IDLE_STOP_MIN": "30",
                "VL_WORKER_KEY": GATEWAY_KEY, "RUNTIME_SELFCHECK_KEY": SELFCHECK_KEY}  # fmt: skip
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", settings) as bridge:
        marked = activity_file(tmp_path)
        gateway = {"authorization": f"Bearer {GATEWAY_KEY}"}
        assert httpx.get(f"{bridge.url}/v1/models", headers=gateway).status_code == 200
        assert httpx.get(f"{bridge.url}/v1/models/tiny", headers=gateway).status_code == 200
        metrics = httpx.get(f"{bridge.url}/metrics", headers=gateway, timeout=30)
        assert metrics.status_code == 200 and "vllm:" in metrics.text  # what the gateway's panel reads
        assert httpx.get(f"{bridge.url}/v1/pod/status", headers=gateway).json()["you"]["admin"] is False
        checked = anthropic.Anthropic(base_url=bridge.url, api_key=SELFCHECK_KEY, max_retries=0, timeout=120)
        checked.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hello"}])
        assert not marked.exists()
        relayed = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}
        answer = httpx.post(f"{bridge.url}/v1/chat/completions", headers=gateway, json=relayed, timeout=120)
        assert answer.status_code == 200 and marked.exists()


def test_without_idle_stop_the_bridge_marks_nothing(vllm_server: VllmServer, tmp_path: Path) -> None:
    with start_bridge(vllm_server.url, tmp_path / "bridge.log", {"VL_STATE_DIR": str(tmp_path)}) as bridge:
        client = anthropic.Anthropic(base_url=bridge.url, api_key="x", max_retries=0, timeout=120)
        client.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hello"}])
    assert not activity_file(tmp_path).exists()


def stopper(tmp_path: Path, **settings: str) -> SelfStop | None:
    environ = {"VL_STATE_DIR": str(tmp_path), "RUNPOD_POD_ID": "pod-1", "RUNPOD_API_KEY": "rpa_x", **settings}
    return SelfStop.from_settings(load_settings(environ), environ)


def test_idleness_is_counted_from_the_last_request_or_the_start(tmp_path: Path) -> None:
    watch = stopper(tmp_path, VL_IDLE_STOP_MIN="30")
    assert watch is not None
    watch.started = 1_000_000.0
    assert watch.reason(1_000_000.0 + 29 * 60, None) is None
    assert watch.reason(1_000_000.0 + 31 * 60, None) == "no request served for 31.0 min (VL_IDLE_STOP_MIN=30)"
    activity_file(tmp_path).touch()
    os.utime(activity_file(tmp_path), (1_000_000.0 + 20 * 60,) * 2)
    assert watch.reason(1_000_000.0 + 31 * 60, None) is None


def test_spend_is_counted_from_the_hourly_price_since_this_start(tmp_path: Path) -> None:
    watch = stopper(tmp_path, VL_MAX_SPEND="2", VL_COST_PER_HOUR="0.69")
    assert watch is not None
    watch.started = 0.0
    assert watch.reason(2.8 * 3600, 0.69) is None
    assert watch.reason(3 * 3600, 0.69) == "this start of the pod has cost $2.07 (VL_MAX_SPEND=2)"


@pytest.mark.parametrize(("settings", "line"), [
    ({"VL_IDLE_STOP_MIN": "30"}, "VL_IDLE_STOP_MIN='30.0' is not allowed: expected empty outside RunPod: a pod stops "
     "itself with the RUNPOD_POD_ID and RUNPOD_API_KEY RunPod gives it, and this one has no RUNPOD_POD_ID and no "
     "RUNPOD_API_KEY"),
    ({"VL_MAX_SPEND": "5", "RUNPOD_POD_ID": "p", "RUNPOD_API_KEY": "k"}, "VL_MAX_SPEND='5.0' is not allowed: expected "
     "empty without VL_COST_PER_HOUR, which the spend is counted from"),
])  # fmt: skip
def test_a_pod_that_cannot_stop_itself_refuses_to_start(tmp_path: Path, settings: dict[str, str], line: str) -> None:
    env = outer_environ("RUNPOD_") | {
        "VL_STATE_DIR": str(tmp_path / "state"), "VL_PREBAKED_MARKER": str(tmp_path / "none"), "VL_VENV": sys.prefix,
    } | settings  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == line
    assert not list((tmp_path / "state").glob("*.pid")), "nothing was launched"


def test_an_idle_pod_says_so_in_its_hub_log_then_asks_runpod_to_stop_it(
    tmp_path: Path, hub_server: HubServer, runpod_server: RunPodServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNPOD_API_URL", runpod_server.url)
    with RunPodClient(runpod_server.api_key) as api:  # a pod of the account, running
        pod_id = api.call("POST", "/v2/pods", "create", {"name": "p", "image": "i", "gpu": {"id": "NVIDIA L40S"}})["id"]
        while api.call("GET", f"/v2/pods/{pod_id}", "read")["status"] != "RUNNING":
            pass
    said_before_the_stop: list[str] = []
    runpod_server.state.on_pod = lambda pod, status: said_before_the_stop.append(
        (hub_server.file(LOGS, f"etat/{pod}.log") or b"").decode()
    )
    hub_server.create_repo(LOGS, private=True)
    environ = hub_server.env() | {
        "VL_STATE_DIR": str(tmp_path), "VL_LOG_REPO": LOGS, "VL_IDLE_STOP_MIN": "0.5",
        "RUNPOD_POD_ID": pod_id, "RUNPOD_API_KEY": runpod_server.api_key,
    }  # fmt: skip
    settings = load_settings(environ)
    hub = PodHub.connect(settings, environ)
    pod = Pod(settings, environ, hub)
    assert pod.self_stop is not None
    pod.self_stop.started, pod.self_stop.check_s = time.time() - 3600, 0.05  # started an hour ago, never asked
    assert hub.log is not None
    hub.log.start()
    try:
        asyncio.run(asyncio.wait_for(SelfStopping(pod.self_stop, pod.engines, hub).run(), 120))
    finally:
        hub.close(timeout_s=30)

    assert runpod_server.pods[0]["status"] == "EXITED"
    (stop,) = [r for r in runpod_server.received if r.path == f"/v2/pods/{pod_id}/action"]
    assert stop.json() == {"action": "stop"} and stop.headers["authorization"] == f"Bearer {runpod_server.api_key}"
    assert "stopping this pod: no request served for 60.0 min (VL_IDLE_STOP_MIN=0.5)" in said_before_the_stop[-1]
