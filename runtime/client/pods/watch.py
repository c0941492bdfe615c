"""`pod watch`: a pod's boot watched again, until it serves."""

from __future__ import annotations

from runtime.client.pods.boot import Watching, watch_boot
from runtime.client.pods.facade import Pods


def watch(pods: Pods, pod_id: str, watching: Watching) -> int:
    return watch_boot(pods, pod_id, watching, pods.get(pod_id).get("env") or {})
