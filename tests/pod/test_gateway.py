"""A team as a user makes it: `python -m runtime pod up --template T --workers 2` against the schema-checking
RunPod stand-in creates two pods of ours and a gateway (a CPU pod, VL_ROLE=gateway) in front of them;
each pod is played by a real `python -m runtime start` on loopback (two real vLLM engines serving the tiny
model behind their own bridges, the real router in the gateway) and reached through a stand-in of RunPod's
proxy; the Anthropic SDK is the client. Each conversation stays on one pod; one pod stopped
(`pod stop`), its conversation moves to the other and nothing fails, the gateway degraded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from space import runpod
from tests.support.conversations import Conversation, grown, served, where_sessions_land
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.polling import wait_until
from tests.support.runpod_machines import Machines, Played
from tests.support.runpod_server import GPU_PRICES, RunPodServer
from tests.support.sdk import anthropic

pytestmark = pytest.mark.vllm  # `runtime start` pods, each with its vLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "vllm-pod sm89 pod-owner/vllm-pod-sm89"
GPU = "NVIDIA RTX 6000 Ada Generation"
CLIENT_KEY = "sk-team-client-0123456789abcdef"
WATCH_MIN = "20"  # two engines cold at once on two shared cores, then the gateway


@dataclass
class Team:
    runpod: RunPodServer
    machines: Machines
    up: subprocess.CompletedProcess[str]

    @property
    def bodies(self) -> list[dict]:
        """The create requests RunPod accepted, in order."""
        return [
            r.json() for r in self.runpod.received if r.method == "POST" and r.path == "/v2/pods" and r.status == 201
        ]

    @property
    def gateway(self) -> Played:
        (gateway,) = [p for p in self.machines.played.values() if p.env.get("VL_ROLE") == "gateway"]
        return gateway

    @property
    def workers(self) -> list[Played]:
        return [p for p in self.machines.played.values() if p.env.get("VL_ROLE") != "gateway"]

    def engines(self) -> tuple[int, ...]:
        return tuple(int(worker.env["VL_ENGINE_PORT"]) for worker in self.workers)

    def worker_names(self) -> dict[str, str]:
        """worker-<i> (the gateway's name for it) -> its pod id, in VL_WORKERS' order."""
        urls = self.gateway.env["VL_WORKERS"].split(",")
        return {f"worker-{i}": next(w.pod_id for w in self.workers if w.pod_id in url) for i, url in enumerate(urls)}

    def health(self) -> dict:
        try:
            return httpx.get(f"{self.gateway.url}/health", headers={"x-api-key": CLIENT_KEY}, timeout=10).json()
        except httpx.HTTPError:
            return {}  # not listening yet

    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.gateway.url, api_key=CLIENT_KEY, max_retries=0, timeout=120)

    def pod(self, *args: str) -> subprocess.CompletedProcess[str]:
        return pod(self.runpod, self.machines.proxy_url, *args)


def pod(runpod: RunPodServer, proxy_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m runtime pod ...` as the user runs it, against the stand-in and its proxy."""
    env = outer_environ("RUNPOD_", "ANTHROPIC_") | {
        "RUNPOD_API_KEY": runpod.api_key, "RUNPOD_API_URL": runpod.url,
        "RUNPOD_PROXY_URL": proxy_url, "ANTHROPIC_API_KEY": CLIENT_KEY,
    }  # fmt: skip
    return subprocess.run([sys.executable, "-m", "runtime", "pod", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    with HubServer() as hub, RunPodServer() as server:
        body = runpod.template_body(TEMPLATE, "registry.hf.space/pod-owner-vllm-pod-sm89:latest")
        server.add_template(body)
        secrets_of_the_account = {"HF_TOKEN": hub.write_token, "VL_API_KEYS": CLIENT_KEY}
        with Machines(server, hub, tmp_path_factory.mktemp("machines"), secrets_of_the_account) as machines:
            made = Team(server, machines, subprocess.CompletedProcess([], 0))
            made.up = made.pod("up", "--template", TEMPLATE, "--gpu", GPU, "--workers", "2", "--timeout", WATCH_MIN)
            print(f"\n$ python -m runtime pod up ... --workers 2\n{made.up.stderr}{made.up.stdout}")  # what a user sees
            assert made.up.returncode == 0, made.up.stdout[-3000:] + made.up.stderr[-3000:]
            yield made
        assert not server.faults, server.faults


def test_a_gateway_that_cannot_be_placed_says_which_workers_are_left_billing() -> None:
    with RunPodServer() as server:  # no machine plays these pods: only what RunPod is asked matters here
        server.add_template(runpod.template_body(TEMPLATE, "registry.hf.space/pod-owner-vllm-pod-sm89:latest"))
        server.state.out_of_stock.add("cpu3c")
        failed = pod(server, "http://127.0.0.1:9/{pod_id}-{port}", "up", "--template", TEMPLATE, "--workers", "2")
        workers = " ".join(created["id"] for created in server.pods)
        assert failed.returncode == 1 and len(server.pods) == 2
        assert failed.stderr.splitlines()[-1].endswith(
            f"(try --gateway-cpu another flavour); created already, and billing: {workers} "
            f"(python -m runtime pod down {workers} --yes)"
        )
        assert "--workers: '0' is not a whole number of pods, at least 1" in pod(server, "", "up", "--template",
                                                                                 TEMPLATE, "--workers", "0").stderr  # fmt: skip
        assert not server.faults, server.faults


def test_keys_that_runpod_quotes_back_are_never_printed() -> None:
    """RunPod's 400 can quote the request back: its Authorization (the account's key) and body (the team's key).
    `pod up` showed both in its 'refused (...)' lines; every line it prints now masks the keys it holds."""
    with RunPodServer() as server:
        server.add_template(runpod.template_body(TEMPLATE, "registry.hf.space/pod-owner-vllm-pod-sm89:latest"))
        server.state.quotes_requests = True
        server.state.out_of_stock.add(GPU)
        failed = pod(server, "http://127.0.0.1:9/{pod_id}-{port}", "up", "--template", TEMPLATE, "--gpu", GPU,
                     "--workers", "2")  # fmt: skip
        sent = [json.loads(r.body) for r in server.state.received if (r.method, r.path) == ("POST", "/v2/pods")]
        team_key = sent[0]["env"]["VL_WORKER_KEY"]
        printed = failed.stdout + failed.stderr
        assert failed.returncode == 1 and f"{GPU}: refused (" in printed and "(request: " in printed, printed
        assert server.api_key not in printed and team_key not in printed, printed
        assert not server.faults, server.faults


def test_pod_up_makes_two_gpu_pods_and_a_cpu_gateway_with_a_key_of_their_own(team: Team) -> None:
    first, second, gateway = team.bodies
    assert first["gpu"]["id"] == second["gpu"]["id"] == GPU and "cpu" not in first
    key = first["env"]["VL_WORKER_KEY"]
    assert second["env"] == {"VL_WORKER_KEY": key} and len(key) >= 32
    assert gateway["cpu"] == {"id": "cpu3c", "vcpuCount": 2} and "gpu" not in gateway and "mounts" not in gateway
    workers = [pod["id"] for pod in team.runpod.pods if "gpu" in pod]
    assert gateway["env"] == {
        "VL_ROLE": "gateway", "VL_WORKER_KEY": key, "VL_COST_PER_HOUR": f"{2 * GPU_PRICES[GPU]:g}",
        "VL_WORKERS": ",".join(team.machines.proxy_url.format(pod_id=pod, port=8080) for pod in workers),
    }  # fmt: skip
    assert key not in team.up.stdout + team.up.stderr
    (gateway_pod,) = [pod for pod in team.runpod.pods if "cpu" in pod]
    assert (
        f"export ANTHROPIC_BASE_URL={team.machines.proxy_url.format(pod_id=gateway_pod['id'], port=8080)}"
        in team.up.stdout
    )
    assert "export ANTHROPIC_MODEL=tiny" in team.up.stdout
    assert f"pod stop {gateway_pod['id']} {' '.join(workers)}" in team.up.stdout


def test_a_gateway_runs_no_engine_and_says_so(team: Team) -> None:
    log = team.gateway.boot_log()
    assert "a gateway in front of 2 pods" in log and "vLLM launched" not in log
    assert not (team.gateway.state / "engine.log").exists()
    key = team.gateway.env["VL_WORKER_KEY"]
    commands = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert key not in commands
    bridge_log = (team.gateway.state / "bridge.log").read_text()  # it starts with the bridge's command
    for url in team.gateway.env["VL_WORKERS"].split(","):  # kept out like a secret: a URL can carry one
        assert url not in commands and url not in bridge_log


def test_the_gateways_metrics_and_capacity_panel_show_the_workers(team: Team) -> None:
    """The workers let the gateway's key read their /metrics (403 left the team's panel empty)."""
    admin = {"x-api-key": CLIENT_KEY}
    metrics = httpx.get(f"{team.gateway.url}/metrics", headers=admin, timeout=60).text
    assert all(f'replica="{n}"' in metrics for n in (0, 1)) and "vllm:num_requests_running" in metrics
    status = httpx.get(f"{team.gateway.url}/v1/pod/status", headers=admin, timeout=60).json()
    assert status["capacity"] is not None and len(status["engines"]) == 2
    assert all(engine["running"] is not None and engine["kv_use"] is not None for engine in status["engines"])


def test_status_lists_the_team(team: Team) -> None:
    listed = team.pod("status")
    assert listed.returncode == 0, listed.stderr
    rows = {row.split()[0]: row for row in listed.stdout.splitlines()[1:]}
    assert {team.gateway.pod_id, *(worker.pod_id for worker in team.workers)} == set(rows)
    assert "cpu3c (2 vCPU)" in rows[team.gateway.pod_id] and rows[team.gateway.pod_id].endswith("yes")
    assert all(GPU in rows[worker.pod_id] and rows[worker.pod_id].endswith("yes") for worker in team.workers)


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
    stopped = team.pod("stop", team.workers[home].pod_id)
    assert stopped.returncode == 0, stopped.stderr
    team.workers[home].process.wait(60)
    for n in range(2, 5):  # on the other pod now
        assert conversation.turn(client, n).content
    other = 1 - home
    assert served((team.engines()[other],))[0] >= before[other] + 3
    wait_until(lambda: team.health()["status"] == "degraded", "the gateway to say degraded", 120.0, every_s=0.5)
    name = next(name for name, pod in team.worker_names().items() if pod == team.workers[home].pod_id)
    assert team.health()["engines"][name] == "down"
