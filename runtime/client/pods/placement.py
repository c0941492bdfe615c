"""Where a pod is placed: the first GPU type RunPod can place it on, in the first of its data centres that takes it,
each refusal said; for `up` (a pod, a team's workers) and `replace`."""

from __future__ import annotations

import sys
import time
from typing import Any

from runtime.client.pods.facade import Pods
from runtime.runpod.api import RunPodError
from runtime.runpod.payloads import Pod, PodBody
from runtime.sizing.choice import Choice

HOST_WAIT_S = 600.0  # a pod tells its host's address once it runs: after its image's pull, minutes for ours
HOST_POLL_S = 5.0
PLACING = ("PROVISIONING", "STARTING", "RUNNING")


def place(pods: Pods, body: PodBody, gpus: list[Choice], cuda: list[str]) -> Pod:
    """The pod created on the first GPU type RunPod can place it on, in the first of its data centres that takes
    it (a volume's data centre only, when a network volume pins it), said in a line; else one line listing what
    was tried."""
    tried = []
    for choice in gpus:
        gpu, pod = choice.gpu, None
        wheres = [[]] if "dataCenterIds" in body or not choice.centres else [[c] for c in choice.centres]
        for index, where in enumerate(wheres):
            on = body.copy()
            on["gpu"] = {"id": gpu, "count": 1, "allowedCudaVersions": cuda}
            if where:
                on["dataCenterIds"] = where
            try:
                pod = pods.api.create_pod(on, f"a pod on {gpu}")
                break
            except RunPodError as error:
                if error.status not in (400, 403):  # 400: no capacity (or a rule), 403: not this pool; else stop
                    raise
                reason = error.detail or error.status
                if index + 1 < len(wheres):  # the next data centre first (the notes: dataCenterIds usually does)
                    print(
                        f"pod: {gpu} in {where[0]}: refused ({reason}); trying {wheres[index + 1][0]}", file=sys.stderr
                    )
                    continue
                tried.append(f"{gpu} ({reason})")
                print(f"pod: {gpu}: refused ({reason}); trying the next", file=sys.stderr)
        if pod is None:
            continue
        print(f"pod {pod['id']} ({pod['name']}): {gpu}, ${pod['cost']:.2f}/h, {pod['status']}", flush=True)
        host = pod.get("cudaVersion")
        if host and host.split(".")[0] != cuda[0].split(".")[0]:
            print(
                f"pod: warning: its host reports CUDA {host}, the image needs {', '.join(cuda)}: it will say so "
                f"and stop (python -m runtime pod down {pod['id']})",
                file=sys.stderr,
            )
        return pod
    raise RunPodError(
        f"no pod could be placed, tried: {'; '.join(tried)}: try other --gpu types, --cloud community, or later"
    )


def host_of(pod: Pod) -> str | None:
    """The machine a pod runs on, as RunPod's API v2 tells it: the public address of its direct SSH (`22/tcp`, in our
    templates) or of another published TCP port. The v2 Pod has no machine id (v1's `machineId`); its address is known
    only while it runs, and pods of one machine share it (each on its own ports)."""
    found: Any = pod
    direct = ((found.get("ssh") or {}).get("direct") or {}).get("host")
    if direct:
        return str(direct)
    ports = (found.get("runtime") or {}).get("ports") or []
    return next((str(port["ip"]) for port in ports if port.get("type") == "tcp" and port.get("ip")), None)


def placed_host(pods: Pods, pod: Pod) -> str | None:
    """The host a new pod landed on, once RunPod tells it (asked every HOST_POLL_S while the pod is being placed,
    started or runs, HOST_WAIT_S at most); None when it does not say in time, or the pod stops first."""
    deadline = time.monotonic() + HOST_WAIT_S
    while (host := host_of(pod)) is None and pod["status"] in PLACING and time.monotonic() < deadline:
        time.sleep(HOST_POLL_S)
        pod = pods.get(pod["id"])
    return host
