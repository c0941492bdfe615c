"""`pod replace`: a pod made again from its template on another host (a sick one's way out), its network volume
kept, the old one deleted once the new one exists, then watched as `up` watches."""

from __future__ import annotations

from collections.abc import Sequence

from runtime.client.pods.boot import Watching, watch_boot
from runtime.client.pods.facade import Pods, confirm, going, warn
from runtime.client.pods.placement import host_of, place, placed_host
from runtime.runpod.api import CUDA_VERSIONS, RunPodError
from runtime.runpod.payloads import Pod, PodBody
from runtime.sizing.cards import DEFAULT_GPUS
from runtime.sizing.choice import Choice, choices, template_model

HOST_TRIES = 3  # placements that land on the old pod's host, each deleted at once, before giving up


def replace(
    pods: Pods, pod_id: str, gpus_asked: Sequence[str], yes: bool, watching: Watching, max_price: float | None = None
) -> int:
    """The pod made again from its template on another host than its own (its network volume kept), the card
    checked as `up` checks it (its model fits, within `max_price`), the old one deleted once the new one exists,
    then watched as `up` watches: a sick host's way out."""
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
    model = template_model({**(template.get("env") or {}), **(old.get("env") or {})})  # what it serves, as `up` sizes
    gpus = choices(pods.catalogue(), target or None, asked, model, max_price, body["cloud"].lower(), say=warn)
    new = place_elsewhere(pods, old, body, gpus, template.get("allowedCudaVersions") or CUDA_VERSIONS)
    pods.api.delete_pod(pod_id)
    print(f"deleted {going(old)}: replaced by {new['id']}", flush=True)
    return watch_boot(pods, new["id"], watching, old.get("env") or {})


def place_elsewhere(pods: Pods, old: Pod, body: PodBody, gpus: list[Choice], cuda: list[str]) -> Pod:
    """The new pod, on another host than `old`'s: one placed on it is deleted at once and the placement tried again,
    other GPU types first (a machine holds one type), HOST_TRIES times at most, a line each; RunPodError after."""
    avoid = host_of(old)
    if avoid is None:
        warn(
            f"pod: {old['id']}'s host is unknown (RunPod tells a pod's address only while it runs, "
            f"{old['status']} here): the new pod may land on it"
        )
    for attempt in range(1, HOST_TRIES + 1):
        new = place(pods, body, gpus, cuda)
        if avoid is None:
            return new
        if host_of(new) is None:
            warn(f"pod: {new['id']}: waiting for its host's address (told once it runs) to check it is not {avoid}")
        host = placed_host(pods, new)
        if host is None:
            warn(f"pod: {new['id']} told no host address yet: if it is {old['id']}'s ({avoid}), replace it again")
            return new
        if host != avoid:
            return new
        pods.api.delete_pod(new["id"])
        landed = new.get("gpu", {}).get("id", "")
        gpus = [c for c in gpus if c.gpu != landed] + [c for c in gpus if c.gpu == landed]
        warn(
            f"pod: {new['id']} landed on {old['id']}'s host ({host}): deleted it ({attempt}/{HOST_TRIES}); "
            + (f"trying again, {gpus[0].gpu} first" if attempt < HOST_TRIES else "giving up")
        )
    raise RunPodError(
        f"RunPod placed the new pod on {old['id']}'s host {HOST_TRIES} times (deleted each; {old['id']} is kept): "
        "try --gpu another type, or later"
    )
