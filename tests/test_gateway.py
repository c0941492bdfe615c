"""A gateway (VL_ROLE=gateway: the bridge and the router, no engine) in front of two pods of ours, all three
`python -m runtime start` on loopback: two real vLLM engines serving the tiny model behind their own
bridges, the real router in the gateway, the Anthropic SDK as the client. Each conversation stays on one
pod; one pod stopped, its conversation moves to the other and nothing fails, the gateway degraded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import pytest

from runtime.engine.tinymodel import write_tiny_model
from tests.support.conversations import Conversation, grown, served, where_sessions_land
from tests.support.environ import outer_environ
from tests.support.net import free_port
from tests.support.polling import wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
START_S = 900.0  # two engines cold at once on two shared cores
WORKER_KEY = "sk-gateway-to-workers-0123456789"
CLIENT_KEY = "sk-team-client-0123456789abcdef"


@dataclass
class Started:
    process: subprocess.Popen
    state: Path
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['VL_PORT']}"

    def boot_log(self) -> str:
        path = self.state / "boot.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start(root: Path, settings: dict[str, str]) -> Started:
    state = root / "state"
    env = outer_environ() | {
        "VL_STATE_DIR": str(state), "VL_VENV": sys.prefix, "VL_PREBAKED_MARKER": str(root / "image_prebaked"),
        "VL_LISTEN": "127.0.0.1", "VL_PORT": str(free_port()), "VL_SSH": "off", "VL_ROUTER_PORT": str(free_port()),
    } | settings  # fmt: skip
    process = subprocess.Popen([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    return Started(process, state, env)


@dataclass
class Team:
    gateway: Started
    workers: list[Started]

    def engines(self) -> tuple[int, ...]:
        return tuple(int(worker.env["VL_ENGINE_PORT"]) for worker in self.workers)

    def health(self) -> dict:
        try:
            return httpx.get(f"{self.gateway.url}/health", timeout=10).json()
        except httpx.HTTPError:
            return {}  # not listening yet

    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.gateway.url, api_key=CLIENT_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    workers = []
    for n in range(2):
        root = tmp_path_factory.mktemp(f"worker{n}")
        write_tiny_model(root / "state" / "models" / "tiny")  # what the cpu image bakes
        (root / "image_prebaked").write_text('{"target": "cpu"}\n')
        workers.append(start(root, {"VL_MODEL": "tiny", "VL_API_KEYS": WORKER_KEY, "VL_ENGINE_PORT": str(free_port()),
                                    "RUNPOD_POD_ID": f"worker-pod-{n}"}))  # fmt: skip
    gateway = start(tmp_path_factory.mktemp("gateway"), {
        "VL_ROLE": "gateway", "VL_WORKERS": ",".join(worker.url for worker in workers), "VL_WORKER_KEY": WORKER_KEY,
        "VL_API_KEYS": CLIENT_KEY, "RUNPOD_POD_ID": "gateway-pod",
    })  # fmt: skip
    running = Team(gateway, workers)
    try:
        wait_until(lambda: all("engine is healthy" in worker.boot_log() for worker in workers),
                   "both workers' engines healthy", START_S, every_s=1.0)  # fmt: skip
        wait_until(lambda: running.health().get("engines") == {"worker-0": "healthy", "worker-1": "healthy"},
                   "the gateway's router to route to both pods", 180.0, every_s=0.5)  # fmt: skip
        yield running
    finally:
        for started in (gateway, *workers):
            started.stop()


def test_a_gateway_runs_no_engine_and_says_so(team: Team) -> None:
    log = team.gateway.boot_log()
    assert "a gateway in front of 2 pods" in log and "vLLM launched" not in log
    assert not (team.gateway.state / "engine.log").exists()
    assert WORKER_KEY not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_each_conversation_stays_on_one_pod(team: Team) -> None:
    where_sessions_land(
        team.client(), team.engines(), ("9a7e0000-0000-4000-8000-00000000000a", "9a7e0000-0000-4000-8000-00000000000b")
    )


def test_a_killed_router_is_restarted_and_given_the_workers_again(team: Team) -> None:
    os.kill(int((team.gateway.state / "router.pid").read_text()), signal.SIGKILL)
    wait_until(lambda: "router was killed by SIGKILL" in team.gateway.boot_log(), "the death noticed", 60.0)
    wait_until(lambda: serves(team), "the gateway to serve through its restarted router", 180.0, every_s=1.0)
    wait_until(lambda: team.health().get("engines") == {"worker-0": "healthy", "worker-1": "healthy"},
               "both pods routed to again", 180.0, every_s=0.5)  # fmt: skip


def serves(team: Team) -> bool:
    try:
        return bool(Conversation("9a7e0000-0000-4000-8000-0000000000aa").turn(team.client(), 1).content)
    except anthropic.APIError:
        return False


def test_a_stopped_pod_moves_its_conversations_and_nothing_fails(team: Team) -> None:
    conversation, client = Conversation("9a7e0000-0000-4000-8000-00000000000c"), team.client()
    before = served(team.engines())
    conversation.turn(client, 1)
    home = grown(before, served(team.engines())).index(1)
    team.workers[home].stop()
    for n in range(2, 5):  # on the other pod now
        assert conversation.turn(client, n).content
    other = 1 - home
    assert served((team.engines()[other],))[0] >= before[other] + 3
    wait_until(lambda: team.health()["status"] == "degraded", "the gateway to say degraded", 120.0, every_s=0.5)
    assert team.health()["engines"][f"worker-{home}"] == "down"
