"""A RunPod Instant Cluster as one unit, for `pod up --nodes N`, `watch`, `status`, `stop` and `down`: made from the
template (spread into RunPod's CreateClusterRequest, type APPLICATION: each node takes its role from RunPod's variables,
rank 0 serves), every node's boot watched (its Hub log, its state) until rank 0's bridge serves through RunPod's proxy,
then rank 0's endpoint checked as `pod up` checks a pod's. A cluster is deleted whole (`DELETE /v2/clusters/{id}`);
RunPod's API stops no cluster, and its members are never stopped or deleted one by one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from runtime.checks.endpoint import check_endpoint
from runtime.client.environment import print_environment
from runtime.client.identity import pod_key, remember_pod
from runtime.client.pods.boot import GONE, LOG_LINE_CHARS, POLL_S, Watching, boot_log, health, print_verdict
from runtime.client.pods.facade import Pods, warn
from runtime.health import health_answer, serves_model
from runtime.liveline import LiveLine
from runtime.runpod.api import RunPodError
from runtime.runpod.clusters import cluster_body
from runtime.runpod.payloads import Cluster, ClusterCompute, Mounts, Pod, Template
from runtime.runpod.proxy import proxy_url
from runtime.sizing.cards import card_of
from runtime.sizing.choice import cluster_choices, template_model
from runtime.sizing.nodes import GPUS_PER_NODE
from runtime.units import human_seconds


@dataclass(frozen=True)
class ClusterRequest:
    """What `pod up --nodes` is asked for: the nodes, each node's GPUs, the GPU types in order, a volume."""

    nodes: int
    gpus_per_node: int = GPUS_PER_NODE
    gpus: Sequence[str] = ()
    max_price: float | None = None
    cloud: str = "secure"
    name: str | None = None
    mounts: Mounts | None = None
    data_centres: Sequence[str] = ()


def up_cluster(pods: Pods, template: Template, target: str | None, request: ClusterRequest, watching: Watching) -> int:
    """The cluster made on the first GPU type RunPod places it on (each refusal said), then watched until it serves."""
    env = template.get("env") or {}
    model = template_model(env)
    tried = []
    for choice in cluster_choices(
        pods.catalogue(), target, request.gpus, model, request.nodes, request.gpus_per_node, request.max_price,
        request.cloud, say=warn,
    ):  # fmt: skip
        compute = ClusterCompute(gpuTypeId=choice.gpu, gpuCountPerPod=request.gpus_per_node, podCount=request.nodes)
        body = cluster_body(request.name or f"vllm-pod-{target or 'cluster'}", template, compute, request.mounts)
        if request.data_centres:
            body["dataCenterIds"] = list(request.data_centres)
        try:
            cluster = pods.api.create_cluster(body, f"a cluster of {request.nodes} nodes of {choice.gpu}")
        except RunPodError as error:
            if error.status not in (400, 403):  # no capacity (or a rule), not this pool; else stop
                raise
            tried.append(f"{choice.gpu} ({error.detail or error.status})")
            warn(f"pod: a cluster on {choice.gpu}: refused ({error.detail or error.status}); trying the next")
            continue
        split = f", {choice.split}" if choice.split else ""
        print(f"cluster {cluster['id']} ({cluster['name']}): {shape(cluster)}{split}", flush=True)
        return watch_cluster(pods, cluster["id"], watching, env)
    raise RunPodError(f"no cluster could be placed, tried: {'; '.join(tried)}: try other --gpu types, or later")


def watch_cluster(pods: Pods, cluster_id: str, watching: Watching, env: Mapping[str, str] | None = None) -> int:
    """Every node's boot until rank 0 serves, then Claude Code's environment for rank 0 and its self-check."""
    deadline = watching.deadline()
    if env is None:  # `pod watch CLUSTER`: the nodes' environment, as their template gave it
        members = ranked(pods.api.cluster_pods(cluster_id))
        env = (members[0].get("env") or {}) if members else {}
    status, primary = boot_nodes(pods, cluster_id, env, deadline)
    if status:
        return status
    url = proxy_url(primary)
    key = pod_key(watching.key, url)
    print_environment(check_endpoint(url, key or "x"))  # an open pod takes any text
    remember_pod(url, key)  # the commands without a URL: rank 0
    print_verdict(primary, key or "x", deadline)
    print(f"\n# the cluster: python -m runtime pod status {cluster_id}; pod down {cluster_id}")
    return 0


def boot_nodes(pods: Pods, cluster_id: str, env: Mapping[str, str], deadline: float) -> tuple[int, str]:
    """Each node's Hub log and every node's state on one live line until rank 0 serves (0 and rank 0's id), a node
    is gone (raises), or the deadline passes or Ctrl-C comes: then what to type to watch again, and the exit status."""
    logs: dict[str, Callable[[], list[str]]] = {}
    line, started, last, primary = LiveLine(), time.monotonic(), "", ""
    try:
        while True:
            nodes = ranked(pods.api.cluster_pods(cluster_id))
            for node in nodes:
                reader = logs.setdefault(node["id"], boot_log(node["id"], env))
                for text in reader():
                    cut = text if len(text) <= LOG_LINE_CHARS else text[:LOG_LINE_CHARS] + "..."
                    line.say(f"  | {rank_of(node)} | {cut}")
                    last = text
            for node in nodes:
                if node["status"] in GONE:
                    line.end()
                    raise RunPodError(
                        f"node {rank_of(node)} ({node['id']}) of cluster {cluster_id} is {node['status']}: its log "
                        f"above says why; a cluster is not restarted node by node: python -m runtime pod down "
                        f"{cluster_id}, then pod up again"
                    )
            primary = nodes[0]["id"] if nodes and rank(nodes[0]) == 0 else ""
            running = bool(nodes) and all(node["status"] == "RUNNING" for node in nodes)
            answer = health(proxy_url(primary)) if primary and running else None
            if answer is not None and serves_model(*answer):
                break
            if answer is not None and health_answer(answer[1]).get("status") == "stopped":
                line.end()
                raise RunPodError(
                    f"cluster {cluster_id}'s engine is left stopped: its log above says why (python -m runtime "
                    f"pod down {cluster_id}, then pod up again)"
                )
            line.show(time.monotonic() - started, states(nodes), last)
            if time.monotonic() > deadline:
                line.end()
                print(
                    f"pod: cluster {cluster_id} is not serving after {human_seconds(time.monotonic() - started)}; it "
                    f"keeps running: python -m runtime pod watch {cluster_id}",
                    file=sys.stderr,
                )
                return 1, primary
            time.sleep(POLL_S)  # RunPod has no notification of a change: poll it
    except KeyboardInterrupt:
        line.end()
        print(
            f"pod: stopped watching; cluster {cluster_id} keeps running: python -m runtime pod watch {cluster_id}",
            file=sys.stderr,
        )
        return 130, primary
    line.end()
    print(f"cluster {cluster_id} serves after {time.monotonic() - started:.0f} s (rank 0: {primary})", flush=True)
    return 0, primary


def ranked(nodes: Sequence[Pod]) -> list[Pod]:
    """A cluster's nodes by rank (one not yet ranked last)."""
    return sorted(nodes, key=lambda node: (rank(node) is None, rank(node) or 0))


def rank(node: Pod) -> int | None:
    return member["rank"] if (member := node.get("cluster")) else None


def rank_of(node: Pod) -> str:
    return f"rank {rank(node)}" if rank(node) is not None else "rank ?"


def states(nodes: Sequence[Pod]) -> str:
    """`rank 0 RUNNING, rank 1 STARTING`: where each node is."""
    return ", ".join(f"{rank_of(node)} {node['status']}" for node in nodes) or "PROVISIONING"


def shape(cluster: Cluster) -> str:
    """`2 nodes of 8 x H100 SXM`: what a cluster runs on."""
    compute = cluster["compute"]
    card = card_of(compute["gpuTypeId"])
    return f"{compute['podCount']} nodes of {compute['gpuCountPerPod']} x {card.name}"


def summary(nodes: Sequence[Pod]) -> str:
    """A cluster's state: its nodes' one state, or each state counted."""
    counted: dict[str, int] = {}
    for node in nodes:
        counted[node["status"]] = counted.get(node["status"], 0) + 1
    if len(counted) == 1:
        return next(iter(counted))
    return ", ".join(f"{state} {count}" for state, count in counted.items()) or "-"


def going(cluster: Cluster, nodes: Sequence[Pod]) -> str:
    """A cluster, and what goes with it when it is deleted."""
    network = any((node.get("mounts") or {}).get("network") for node in nodes)
    goes = (
        "every node's container disk goes; the network volume stays"
        if network
        else "every node's container disk and volume go"
    )
    return f"cluster {cluster['id']} ({cluster['name']}, {shape(cluster)}, {summary(nodes)}): {goes}"


def not_one_by_one(pod: Pod, stopping: bool) -> RunPodError:
    """A cluster's member is never stopped or deleted alone: the cluster goes whole."""
    cluster = member["id"] if (member := pod.get("cluster")) else "?"
    why = "RunPod stops no cluster" if stopping else "a cluster is deleted whole"
    return RunPodError(
        f"pod {pod['id']} is {rank_of(pod)} of cluster {cluster}: {why}: python -m runtime pod down {cluster}"
    )


def cannot_stop(cluster_id: str) -> RunPodError:
    return RunPodError(
        f"cluster {cluster_id} cannot be stopped: RunPod's API stops no cluster, it deletes one whole (python -m "
        f"runtime pod down {cluster_id})"
    )
