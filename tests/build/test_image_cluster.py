"""The cpu image as two nodes of a RunPod Instant Cluster: two containers on a Docker network of the test's own, one
core each, RunPod's variables set as RunPod sets them (NUM_NODES, NODE_RANK, PRIMARY_ADDR, PRIMARY_PORT, NODE_ADDR,
NUM_TRAINERS). Rank 0 runs vLLM's API server with one data-parallel engine and the bridge; rank 1 a headless engine
that joins it (vLLM's own multi-node engine, no Ray). Two Claude Code-shaped sessions each stay on one node's engine,
later turns from its prefix cache; the second container stopped is said on rank 0 in one line, its agents served
by rank 0 meanwhile, and healed when it comes back.
Slow (the cpu image, two vLLM starts on one core each): marked `docker`, run in the side step of .ci/run.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import httpx
import pytest
from docker.models.containers import Container
from docker.models.networks import Network
from docker.types import IPAMConfig, IPAMPool

from tests.support.conversations import Conversation, grown
from tests.support.images import Engine, report
from tests.support.polling import wait_until
from tests.support.sdk import anthropic

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

STATE_DIR = "/var/lib/vlpod"  # the image's VL_STATE_DIR
SUBNET, HEAD, WORKER = "10.213.47.0/24", "10.213.47.10", "10.213.47.11"  # the cluster network: the test's own
PRIMARY_PORT = "29500"
START_S = 1200.0  # two engines cold, one core each, on cores the other CI step shares


@dataclass
class Cluster:
    url: str
    key: str
    head: Container
    worker: Container

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", headers={"x-api-key": self.key}, timeout=10).json()

    def serves(self) -> bool:
        try:
            return self.health()["status"] == "ok"
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    def served(self) -> list[float]:
        """Conversation turns each data-parallel rank has finished (more than 100 prompt tokens: not the
        supervisor's probes), from vLLM's per-engine counters as the bridge's /metrics relays them."""
        text = httpx.get(f"{self.url}/metrics", headers={"x-api-key": self.key}, timeout=30).text
        counts, short = [0.0, 0.0], [0.0, 0.0]
        for line in text.splitlines():
            for rank in (0, 1):
                if f'engine="{rank}"' not in line:
                    continue
                if line.startswith("vllm:request_prompt_tokens_count"):
                    counts[rank] += float(line.rsplit(" ", 1)[1])
                elif line.startswith("vllm:request_prompt_tokens_bucket") and 'le="100.0"' in line:
                    short[rank] += float(line.rsplit(" ", 1)[1])
        return [count - below for count, below in zip(counts, short, strict=True)]

    def client(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.key, max_retries=0, timeout=300)


def node(engine: docker.DockerClient, image: str, network: Network, rank: int, key: str) -> Container:
    """One node as RunPod starts it: the image's own entrypoint, RunPod's variables, its address on the network."""
    address = HEAD if rank == 0 else WORKER
    environment = {
        "RUNPOD_POD_ID": f"cluster-node-{rank}", "VL_API_KEYS": key, "VL_SSH": "off",
        "NUM_NODES": "2", "NODE_RANK": str(rank), "PRIMARY_ADDR": HEAD, "PRIMARY_PORT": PRIMARY_PORT,
        "NODE_ADDR": address, "NUM_TRAINERS": "1",
    }  # fmt: skip
    container = engine.containers.create(
        image, detach=True, environment=environment, network=network.name, nano_cpus=10**9, shm_size="2g"
    )  # one core each; the default 64 MiB of /dev/shm kills vLLM's CPU engine
    network.disconnect(container)
    network.connect(container, ipv4_address=address)
    container.start()
    return container


@pytest.fixture(scope="module")
def cluster(image_engine: Engine, cpu_image: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    engine = image_engine[1]
    key = f"sk-cluster-{secrets.token_hex(20)}"
    ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=SUBNET)])
    network = engine.networks.create(f"cluster-{secrets.token_hex(4)}", driver="bridge", ipam=ipam)
    containers: list[Container] = []
    started = time.monotonic()
    try:
        containers += [node(engine, cpu_image, network, 0, key), node(engine, cpu_image, network, 1, key)]
        running = Cluster(f"http://{HEAD}:8080", key, *containers)
        wait_until(lambda: alive(containers) and running.serves(), "both nodes serving", START_S, every_s=2.0)
        report(request, f"two-node cluster (one core each) start → serving: {time.monotonic() - started:.0f} s")
        yield running
    except AssertionError as error:
        raise AssertionError(f"{error}\n{logs(containers)}") from None
    finally:
        for container in containers:
            container.remove(force=True)
        network.remove()


def alive(containers: list[Container]) -> bool:
    for container in containers:
        container.reload()
        assert container.status == "running", logs(containers)
    return True


def logs(containers: list[Container], tail: int = 60) -> str:
    return "\n".join(f"--- {c.name}:\n{c.logs(tail=tail).decode(errors='replace')}" for c in containers)


def test_data_parallel_across_two_nodes_pins_each_session_to_one_node(cluster: Cluster) -> None:
    assert cluster.health()["engines"] == {"engine": "healthy", "node 1": "healthy"}
    # NCCL and Gloo keep to the interface that holds NODE_ADDR, found on the node (not RunPod's ens1 here).
    code, output = cluster.worker.exec_run(
        ["sh", "-c", f"tr '\\0' '\\n' < /proc/$(cat {STATE_DIR}/engine.pid)/environ"]
    )
    assert code == 0 and b"GLOO_SOCKET_IFNAME=eth0" in output and f"VLLM_HOST_IP={WORKER}".encode() in output
    client = cluster.client()
    for session in ("c1a57e00-0000-4000-8000-00000000000a", "c1a57e00-0000-4000-8000-00000000000b"):
        conversation, before = Conversation(session), cluster.served()
        answers = [conversation.turn(client, n) for n in range(1, 4)]
        grew = grown(before, cluster.served())
        assert sorted(grew) == [0.0, 3.0], f"{session}'s three turns were served as {grew}"
        assert all((answer.usage.cache_read_input_tokens or 0) > 0 for answer in answers[1:])


def test_a_stopped_node_is_said_its_agents_are_served_meanwhile_and_it_rejoins(cluster: Cluster) -> None:
    client = cluster.client()
    on_worker = next(c for c in map(Conversation, sessions()) if lands_on(cluster, c, client) == 1)
    cluster.worker.stop(timeout=30)
    wait_until(lambda: cluster.health()["status"] == "degraded", "/health to say degraded", 120.0, every_s=1.0)
    assert cluster.health()["engines"]["node 1"].startswith("lost since ")
    said = [line for line in head_log(cluster) if "cluster: node 1 lost at" in line]
    assert len(said) == 1, head_log(cluster)[-20:]
    before = cluster.served()
    for n in range(2, 4):  # its agent is served by rank 0 while node 1 is away: nothing fails
        on_worker.turn(client, n)
    assert grown(before, cluster.served()) == [2.0, 0.0]
    cluster.worker.start()
    wait_until(cluster.serves, "the cluster whole again", START_S, every_s=2.0)
    assert any("cluster: node 1 back after" in line for line in head_log(cluster))
    before = cluster.served()
    on_worker.turn(client, 4)
    assert grown(before, cluster.served()) == [0.0, 1.0]  # home again, on node 1's engine


def sessions() -> Iterator[str]:
    for n in range(64):
        yield f"c1a57e00-0000-4000-8000-0000000001{n:02x}"


def lands_on(cluster: Cluster, conversation: Conversation, client: anthropic.Anthropic) -> int:
    before = cluster.served()
    conversation.turn(client, 1)
    return grown(before, cluster.served()).index(1.0)


def head_log(cluster: Cluster) -> list[str]:
    return cluster.head.logs().decode(errors="replace").splitlines()
