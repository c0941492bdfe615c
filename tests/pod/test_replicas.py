"""A pod of two engines behind the router (VL_REPLICAS=2), end to end as `python -m runtime start` runs
it: two real vLLM engines serving the tiny model, the real router (smg), the real bridge, the Anthropic
SDK as the client, and the local test Hub for a live engine change.

ONE pod serves every test here, in file order: each Claude Code session kept on one engine with its
prefix cached; each engine in the console, `runtime status` and `/metrics`; one engine killed (the pod
degraded, the other serving, then healthy again); a rolling engine change from the Hub with a client
asking throughout, none of whose requests fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.engine.tinymodel import write_tiny_model
from tests.support.conversations import Conversation, Endpoint, grown, where_sessions_land
from tests.support.environ import outer_environ
from tests.support.hub_server import POD_CONFIG_REPO, HubServer
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.sdk import anthropic
from tests.support.signals import stop

# `runtime start` with two engines; a roll of both under load takes minutes: in the side step, beside the others
pytestmark = [pytest.mark.vllm, pytest.mark.side]

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILE = "replicas.env"  # its own file in the shared config repo: test_start's pod reads pod.env
START_S = 900.0  # two engines cold on two shared cores, each slower than one alone
ROLL_S = 1500.0  # two engine restarts in turn, on a loaded machine


@dataclass
class Pod(Endpoint):
    process: subprocess.Popen
    state: Path
    env: dict[str, str]
    hub: HubServer

    def boot_log(self) -> str:
        path = self.state / "boot.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture(scope="module")
def pod(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    root = tmp_path_factory.mktemp("replicas")
    state = root / "state"
    write_tiny_model(state / "models" / "tiny")  # what the cpu image bakes
    (root / "image_prebaked").write_text('{"target": "cpu"}\n')
    engine_port = free_port()
    env = outer_environ() | hub.env() | {
        "RUNPOD_POD_ID": "replicas-pod",
        "VL_API_KEYS": "sk-replicas-0123456789abcdef",
        "VL_MODEL": "tiny", "VL_REPLICAS": "2",
        "VL_STATE_DIR": str(state), "VL_VENV": sys.prefix, "VL_PREBAKED_MARKER": str(root / "image_prebaked"),
        "VL_LISTEN": "127.0.0.1", "VL_PORT": str(free_port()), "VL_SSH": "off",
        "VL_ENGINE_PORT": str(engine_port), "VL_ROUTER_PORT": str(free_port()),
        "VL_CONFIG_REPO": POD_CONFIG_REPO, "VL_CONFIG_FILE": CONFIG_FILE, "VL_CONFIG_POLL_S": "5",
    }  # fmt: skip
    hub.put_file(POD_CONFIG_REPO, CONFIG_FILE, "VL_ALIASES=team\n")
    process = subprocess.Popen([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{env['VL_PORT']}"
    running = Pod(
        url, env["VL_API_KEYS"], (engine_port, engine_port + 1), int(env["VL_ROUTER_PORT"]), process, state, env, hub
    )
    try:
        wait_until(lambda: "engine-0 is healthy" in running.boot_log() and "engine-1 is healthy" in running.boot_log(),
                   "both engines' first healthy probe", START_S, every_s=1.0)  # fmt: skip
        wait_until(running.routes_to_all, "the router to route to both engines", 120.0, every_s=0.5)
        yield running
    finally:
        stop(process)


def test_each_session_stays_on_one_engine_and_its_later_turns_hit_the_prefix_cache(pod: Pod) -> None:
    where_sessions_land(
        pod.client(), pod.engines, ("5e551011-0000-4000-8000-00000000000a", "5e551011-0000-4000-8000-00000000000b")
    )


def test_the_console_status_and_metrics_show_each_engine(pod: Pod) -> None:
    headers = {"x-api-key": pod.key}
    status = httpx.get(f"{pod.url}/v1/pod/status", headers=headers, timeout=30).json()
    assert status["engine"]["state"] == "healthy"
    assert [(e["replica"], e["state"]) for e in status["engines"]] == [(0, "healthy"), (1, "healthy")]
    assert max(e["prefix_hit_rate"] for e in status["engines"]) > 0  # the sessions above were served from the cache
    metrics = httpx.get(f"{pod.url}/metrics", headers=headers, timeout=30).text
    assert metrics.count("# TYPE vllm:num_requests_running gauge") == 1
    assert {m for m in re.findall(r'vllm:num_requests_running\{[^}]*replica="(\d)"', metrics)} == {"0", "1"}
    shown = subprocess.run([sys.executable, "-m", "runtime", "status", pod.url, "--key", pod.key],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert re.search(r"Engines\n  engine 0  healthy .*\n  engine 1  healthy ", shown.stdout), shown.stdout


def test_a_killed_engine_leaves_the_other_serving_and_the_pod_degraded_until_it_is_back(pod: Pod) -> None:
    conversation, client = Conversation("5e551011-0000-4000-8000-00000000000c"), pod.client()
    before = pod.served()
    conversation.turn(client, 1)
    home = grown(before, pod.served()).index(1)
    name = f"engine-{home}"
    os.kill(int((pod.state / f"{name}.pid").read_text()), signal.SIGKILL)
    wait_until(lambda: pod.health()["status"] == "degraded", "/health to say degraded", 60.0, every_s=0.2)
    assert pod.health()["engines"][name] == "down"
    checked = subprocess.run([sys.executable, "-m", "runtime.health"], cwd=REPO_ROOT, env=pod.env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0 and f"degraded: {name} down" in checked.stdout  # still serving: the check passes
    for n in range(2, 5):  # its conversation moves to the other engine: nothing fails
        conversation.turn(client, n)
    wait_until(lambda: pod.health()["status"] == "ok", "the killed engine back and healthy", START_S, every_s=1.0)
    assert f"{name} was killed by SIGKILL" in pod.boot_log()


@pytest.mark.timeout(ROLL_S + 120)
def test_a_rolling_engine_change_from_the_hub_fails_no_request(pod: Pod) -> None:
    wait_until(pod.routes_to_all, "the router to route to both engines again", 120.0, every_s=0.5)
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def keep_asking() -> None:
        client = pod.client()
        conversations = [Conversation(f"5e551011-0000-4000-8000-0000000000d{n}") for n in range(2)]
        while not stop.is_set():
            for conversation in conversations:
                conversation.messages = conversation.messages[-6:]  # a long run must not outgrow the new window
                try:
                    conversation.turn(client, answered[0])
                    answered[0] += 1
                except (anthropic.APIError, httpx.HTTPError) as error:
                    failures.append(f"{type(error).__name__}: {error}")

    asking = threading.Thread(target=keep_asking, daemon=True)
    asking.start()
    try:
        pod.hub.put_file(POD_CONFIG_REPO, CONFIG_FILE, "VL_ALIASES=team\nVL_CTX=8192\n")
        wait_until(lambda: "engine-1 serves the new settings" in pod.boot_log(), "both engines restarted in turn",
                   ROLL_S, every_s=1.0)  # fmt: skip
    finally:
        stop.set()
        asking.join(180)
    log = pod.boot_log()
    assert log.index("engine-0 serves the new settings") < log.index("restarting engine-1")  # one at a time
    for name in ("engine-0", "engine-1"):  # the one drain policy (runtime.pod.engines), as for a Hub change and a swap
        assert f"{name} serves the new settings: withdrawn, drained, restarted, healthy, readmitted" in log
    windows = [httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
               for port in pod.engines]  # fmt: skip
    assert windows == [8192, 8192]
    assert answered[0] > 0 and failures == [], json.dumps(failures[:5])
