"""`pod stop` and `pod start`: a pod's GPU released (its volume kept), or taken again and the boot watched; a host
whose GPUs were rented meanwhile is said with what to do. A cluster is never stopped (RunPod's API has no such
action: it deletes one whole), nor is one of its nodes: each is said in one line with `pod down`."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.client.pods.boot import Watching, watch_boot
from runtime.client.pods.cluster import cannot_stop, not_one_by_one
from runtime.client.pods.facade import Pods
from runtime.runpod.api import VOLUME_PATH, RunPodError
from runtime.runpod.payloads import Pod

HOST_TAKEN = "not enough free GPUs"  # RunPod's words when a stopped pod's host has been rented again


def start(pods: Pods, pod_id: str, watching: Watching) -> int:
    pod = pods.get(pod_id)
    if pod.get("cluster"):
        raise not_one_by_one(pod, stopping=True)
    try:
        pods.act(pod_id, "start")
    except RunPodError as error:
        if HOST_TAKEN not in error.detail:
            raise
        raise RunPodError(f"{pod_id} cannot start: {restart_advice(pod)}") from None
    return watch_boot(pods, pod_id, watching, pod.get("env") or {})


def restart_advice(pod: Pod) -> str:
    """What to do with a stopped pod whose host's GPUs are rented again."""
    if (pod.get("mounts") or {}).get("network"):
        return (
            f"its host's GPUs are rented to someone else; its network volume keeps the weights: "
            f"python -m runtime pod replace {pod['id']}"
        )
    return (
        f"its host's GPUs are rented to someone else, and its volume lives on that host: try again later, or "
        f"python -m runtime pod replace {pod['id']} --yes (the weights download again)"
    )


def stop(pods: Pods, pod_ids: Sequence[str]) -> int:
    clusters = {cluster["id"] for cluster in pods.api.clusters()}
    for pod_id in pod_ids:
        if pod_id in clusters:
            raise cannot_stop(pod_id)
        if (pod := pods.get(pod_id)).get("cluster"):
            raise not_one_by_one(pod, stopping=True)
    for pod_id in pod_ids:
        pods.act(pod_id, "stop")
        print(
            f"stopped {pod_id}: its GPU is released and billing stops but for its volume; the container disk "
            f"is lost (anything outside {VOLUME_PATH}), the volume keeps the weights and compile caches "
            f"(python -m runtime pod start {pod_id})"
        )
    return 0
