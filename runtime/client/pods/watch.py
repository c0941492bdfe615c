"""`pod watch`: a pod's boot (or a cluster's, every node's) watched again, until it serves."""

from __future__ import annotations

from runtime.client.pods.boot import Watching, watch_boot
from runtime.client.pods.cluster import watch_cluster
from runtime.client.pods.facade import Pods


def watch(pods: Pods, pod_id: str, watching: Watching) -> int:
    if pods.cluster(pod_id):
        return watch_cluster(pods, pod_id, watching)
    return watch_boot(pods, pod_id, watching, pods.get(pod_id).get("env") or {})
