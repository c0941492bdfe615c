"""An Instant Cluster's CreateClusterRequest spread from a template, as RunPod's OpenAPI says one is made ("the
container configuration … can be spread from a template response"): its image, environment, ports, disk and volume,
on `podCount` nodes of `gpuCountPerPod` GPUs each; `build.py`'s design and `pod up --nodes` both make theirs here.

The type is APPLICATION: RunPod then only sets each node's variables (NUM_NODES, NODE_RANK, PRIMARY_ADDR/PORT,
NODE_ADDR, NUM_TRAINERS…) and the image decides what runs where (vLLM's own multi-node engine: rank 0 serves, the
other ranks run headless). RAY would have RunPod start a Ray head and workers, which the images do not hold.
"""

from __future__ import annotations

from collections.abc import Mapping

from runtime.runpod.api import RunPodError
from runtime.runpod.payloads import ClusterBody, ClusterCompute, Mounts, Template, TemplateBody

CLUSTER_TYPE = "APPLICATION"
MIN_NODES = 2  # ClusterCompute.podCount's minimum: one node is a pod


def cluster_body(
    name: str,
    template: Template | TemplateBody,
    compute: ClusterCompute,
    mounts: Mounts | None = None,
    env: Mapping[str, str] | None = None,
) -> ClusterBody:
    """The CreateClusterRequest for `compute` from `template` (its `mounts` unless others are given, its env with
    `env` over it); RunPodError in one line when its image is private: a cluster has no registry credential."""
    if template.get("registry"):
        raise RunPodError(
            f"the template {template['name']!r} pulls a private image with a registry credential, and RunPod's "
            f"clusters take public images only (no registry field): push the image to a public repository "
            f"(build.py --push --registry REF) and save a template for it"
        )
    if "image" not in template:
        raise RunPodError(f"the template {template['name']!r} names no image")
    body = ClusterBody(
        name=name,
        type=CLUSTER_TYPE,
        compute=compute,
        image=template["image"],
        env={**template.get("env", {}), **(env or {})},
    )
    if "disk" in template:
        body["disk"] = template["disk"]
    if "ports" in template:
        body["ports"] = list(template["ports"])
    if "startSsh" in template:
        body["startSsh"] = template["startSsh"]
    if mounts:
        body["mounts"] = mounts
    elif persistent := template.get("mounts", {}).get("persistent"):
        body["mounts"] = Mounts(persistent=persistent)
    return body
