"""`pod replace`: a pod made again from its template on another host (a sick one's way out), its network volume
kept, the old one deleted once the new one exists, then watched as `up` watches."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.client.pods.boot import Watching, watch_boot
from runtime.client.pods.facade import Pods, confirm, going, warn
from runtime.client.pods.placement import place
from runtime.runpod.api import CUDA_VERSIONS, RunPodError
from runtime.runpod.payloads import PodBody
from runtime.sizing.cards import DEFAULT_GPUS
from runtime.sizing.choice import choices


def replace(pods: Pods, pod_id: str, gpus_asked: Sequence[str], yes: bool, watching: Watching) -> int:
    """The pod made again from its template on the first host RunPod places it on (its network volume kept), the
    old one deleted once the new one exists, then watched as `up` watches: a sick host's way out."""
    old = pods.get(pod_id)
    made_from, gpu = old.get("template"), old.get("gpu")
    if not gpu or not made_from:
        raise RunPodError(f"{pod_id} is no GPU pod made from a template (a team's gateway: pod up --workers again)")
    template = pods.template(made_from)
    mounts = old.get("mounts") or {}
    body = PodBody(
        name=old["name"],
        templateId=template["id"],
        cloud=old.get("cloud", ""),
        env={k: v for k, v in (old.get("env") or {}).items() if (template.get("env") or {}).get(k) != v},
    )
    if network := mounts.get("network"):
        body["mounts"] = {"network": network}
        body["dataCenterIds"] = [old.get("dataCenterId") or ""]
    else:
        if mounts.get("persistent"):
            body["mounts"] = {"persistent": mounts["persistent"]}  # a new one, empty, on the new host
        confirm(f"replacing {going(old)}; a new volume starts empty (the weights download again)", yes)
    target = next((t for t in DEFAULT_GPUS if f"-{t}" in old["name"] or f" {t} " in f" {template['name']} "), "")
    asked = list(dict.fromkeys(gpus_asked or [gpu["id"], *DEFAULT_GPUS.get(target, [])]))
    gpus = choices(pods.catalogue(), target or None, asked, None, None, body["cloud"].lower(), say=warn)
    new = place(pods, body, gpus, template.get("allowedCudaVersions") or CUDA_VERSIONS)
    pods.api.delete_pod(pod_id)
    print(f"deleted {going(old)}: replaced by {new['id']}", flush=True)
    return watch_boot(pods, new["id"], watching, old.get("env") or {})
