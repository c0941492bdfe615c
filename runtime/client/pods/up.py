"""`pod up`: a pod made from a template on the GPU types its model fits, then watched until it serves; with
`--workers N`, a team: N such pods and a gateway (a CPU pod) in front of them, a key of the team's own between them;
with `--nodes N`, a RunPod Instant Cluster of N nodes (pods/cluster.py)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from runtime.checks.endpoint import check_endpoint
from runtime.client.environment import print_environment
from runtime.client.identity import pod_key, remember_pod
from runtime.client.pods.boot import Watching, boot, watch_boot
from runtime.client.pods.cluster import ClusterRequest, up_cluster
from runtime.client.pods.facade import Pods, warn
from runtime.client.pods.placement import place
from runtime.runpod.api import CUDA_VERSIONS, VOLUME_PATH, RunPodError
from runtime.runpod.payloads import Mounts, Pod, PodBody
from runtime.runpod.proxy import proxy_url
from runtime.sizing.cards import DEFAULT_GPUS
from runtime.sizing.choice import Choice, choices, template_model
from runtime.sizing.nodes import GPUS_PER_NODE

GATEWAY_CPU = "cpu3c"  # compute-optimised: the gateway only relays (the bridge and the router, no engine)
GATEWAY_VCPUS = 2  # RunPod's smallest CPU pod; its RAM is the flavour's share per vCPU


@dataclass(frozen=True)
class PodRequest:
    """What `pod up` is asked for: the template, the GPUs in order, the volume, the cloud, the pod's name, and with
    `workers` a team of that many pods behind a gateway on `gateway_cpu`."""

    template: str
    gpus: Sequence[str] = ()
    volume: str | None = None
    volume_gb: int | None = None
    cloud: str = "secure"
    name: str | None = None
    workers: int | None = None
    nodes: int | None = None  # a cluster of that many nodes, of `gpus_per_node` GPUs each
    gpus_per_node: int = GPUS_PER_NODE
    gateway_cpu: str = GATEWAY_CPU
    max_price: float | None = None


def up(pods: Pods, request: PodRequest, watching: Watching) -> int:
    template = pods.template(request.template)
    target = next((t for t in DEFAULT_GPUS if f" {t} " in f" {template['name']} "), None)
    if not request.gpus and not target:
        raise RunPodError(f"which GPU? pass --gpu TYPE (the template {template['name']!r} names no target)")
    if request.nodes:
        return up_cluster(pods, template, target, cluster_request(pods, request), watching)
    model = template_model(template.get("env") or {})
    gpus = choices(pods.catalogue(), target, request.gpus, model, request.max_price, request.cloud, say=warn)
    cuda = template.get("allowedCudaVersions") or CUDA_VERSIONS
    body = PodBody(
        name=request.name or f"vllm-pod-{target or 'pod'}", templateId=template["id"], cloud=request.cloud.upper()
    )
    if request.volume:
        volume = pods.volume(request.volume)  # a network volume lives in one data centre: the pod must too
        body["mounts"] = {"network": [{"volumeId": volume["id"], "path": VOLUME_PATH}]}
        body["dataCenterIds"] = [volume["dataCenter"]]
    elif request.volume_gb:
        body["mounts"] = {"persistent": {"size": request.volume_gb, "path": VOLUME_PATH}}
    env = template.get("env") or {}
    if request.workers:
        return up_team(pods, request, watching, body, gpus, cuda, env)
    pod = place(pods, body, gpus, cuda)
    return watch_boot(pods, pod["id"], watching, env)


def cluster_request(pods: Pods, request: PodRequest) -> ClusterRequest:
    """`pod up --nodes`'s request: its volume on every node (a network volume pins the cluster to its data centre)."""
    mounts, centres = None, []
    if request.volume:
        volume = pods.volume(request.volume)
        mounts = Mounts(network=[{"volumeId": volume["id"], "path": VOLUME_PATH}])
        centres = [volume["dataCenter"]]
    elif request.volume_gb:
        mounts = Mounts(persistent={"size": request.volume_gb, "path": VOLUME_PATH})
    return ClusterRequest(
        nodes=request.nodes or 0,
        gpus_per_node=request.gpus_per_node,
        gpus=request.gpus,
        max_price=request.max_price,
        cloud=request.cloud,
        name=request.name,
        mounts=mounts,
        data_centres=centres,
    )


def up_team(
    pods: Pods,
    request: PodRequest,
    watching: Watching,
    body: PodBody,
    gpus: list[Choice],
    cuda: list[str],
    env: Mapping[str, str],
) -> int:
    """N pods from the template, then a gateway in front of them (a CPU pod: no GPU to pay for), a key
    of the team's own between them; watched until the gateway serves, which is what Claude Code is given."""
    key = secrets.token_urlsafe(32)  # in the team's pods' environment at RunPod, printed nowhere
    pods.hold(key)
    workers: list[Pod] = []
    try:
        for index in range(request.workers or 0):
            worker = body.copy()
            worker["name"], worker["env"] = f"{body['name']}-worker-{index}", {"VL_WORKER_KEY": key}
            workers.append(place(pods, worker, gpus, cuda))
    except RunPodError as error:
        raise RunPodError(f"{error}{still_running(workers)}") from None
    team_cost = sum(worker["cost"] for worker in workers)
    gateway_body = PodBody(
        {
            "name": f"{body['name']}-gateway",
            "templateId": body["templateId"],
            "cloud": body["cloud"],
            "cpu": {"id": request.gateway_cpu, "vcpuCount": GATEWAY_VCPUS},  # no volume: a gateway keeps no weights
            "env": {
                "VL_ROLE": "gateway",
                "VL_WORKERS": ",".join(proxy_url(worker["id"]) for worker in workers),
                "VL_WORKER_KEY": key,
                "VL_COST_PER_HOUR": f"{team_cost:g}",
            },  # the console counts the team's GPUs
        }
    )
    try:
        gateway = pods.api.create_pod(gateway_body, f"the gateway on {request.gateway_cpu}")
    except RunPodError as error:
        raise RunPodError(f"{error} (try --gateway-cpu another flavour){still_running(workers)}") from None
    print(
        f"gateway {gateway['id']} ({gateway['name']}): {request.gateway_cpu}, ${gateway['cost']:.2f}/h, "
        f"{gateway['status']}, in front of {', '.join(worker['id'] for worker in workers)}",
        flush=True,
    )
    deadline = watching.deadline()
    for pod in [*workers, gateway]:
        status = boot(pods, pod["id"], env, deadline)
        if status:
            return status
    url = proxy_url(gateway["id"])
    gateway_key = pod_key(watching.key, url)
    print_environment(check_endpoint(url, gateway_key or "x"))
    remember_pod(url, gateway_key)  # the client commands without a URL: this team's gateway
    every = " ".join(pod["id"] for pod in [gateway, *workers])
    print(f"\n# the team: python -m runtime pod status; pod stop {every}; pod down {every}")
    return 0


def still_running(pods: list[Pod]) -> str:
    """What a failed team leaves behind, and how to remove it."""
    if not pods:
        return ""
    ids = " ".join(pod["id"] for pod in pods)
    return f"; created already, and billing: {ids} (python -m runtime pod down {ids} --yes)"
