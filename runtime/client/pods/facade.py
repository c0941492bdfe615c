"""What every `pod` verb shares: the account's pods and what they are made from, through RunPod's API (`Pods`), a
line per step on stdout; what a pod runs on and what goes with it; a question at the terminal."""

from __future__ import annotations

import sys

from runtime.redact import Redactor
from runtime.runpod.api import RunPodClient, RunPodError
from runtime.runpod.payloads import Cluster, GpuType, NetworkVolume, Pod, Template
from runtime.sizing.cards import DEFAULT_GPUS


class Pods:
    """The account's pods and what they are made from, through the API; a line per step on stdout."""

    def __init__(self, api: RunPodClient, redactor: Redactor | None = None) -> None:
        self.api, self.redactor = api, redactor or Redactor()

    def hold(self, secret: str) -> None:
        """A secret made here (the team's key): never in an error line, nor in anything printed."""
        self.api.secrets += (secret,)
        self.redactor.add([secret])

    def get(self, pod_id: str) -> Pod:
        return self.api.pod(pod_id)

    def all(self) -> list[Pod]:
        return self.api.pods()

    def cluster(self, cluster_id: str) -> Cluster | None:
        """The account's cluster of that id; None when the id is not a cluster's (a pod's, say)."""
        return next((cluster for cluster in self.api.clusters() if cluster["id"] == cluster_id), None)

    def act(self, pod_id: str, action: str) -> None:
        self.api.act(pod_id, action)

    def template(self, name_or_id: str) -> Template:
        templates = self.api.templates()
        found = [t for t in templates if name_or_id in (t["id"], t["name"])]
        if len(found) != 1:
            names = ", ".join(repr(t["name"]) for t in templates) or "none"
            raise RunPodError(
                f"{len(found) or 'no'} template(s) named {name_or_id!r} (yours: {names}): "
                "pass one name or id (build.py --runpod saves one)"
            )
        return found[0]

    def catalogue(self) -> list[GpuType]:
        """RunPod's GPU types (memory, prices, stock by data centre); the targets' usual cards, unpriced, when
        RunPod cannot say."""
        try:
            return self.api.gpu_types()
        except RunPodError as error:
            print(f"pod: RunPod's GPU catalogue: {error}; choosing from the usual cards", file=sys.stderr)
            return [GpuType(id=gpu) for listed in DEFAULT_GPUS.values() for gpu in listed]

    def volume(self, name: str) -> NetworkVolume:
        volumes = self.api.network_volumes()
        found = [v for v in volumes if name in (v["id"], v["name"])]
        if len(found) != 1:
            names = ", ".join(repr(v["name"]) for v in volumes) or "none"
            raise RunPodError(f"{len(found) or 'no'} network volume(s) named {name!r} (yours: {names})")
        return found[0]


def warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def confirm(what: str, yes: bool) -> None:
    """Asks at a terminal whether to go on with `what`; RunPodError when the answer is no, or when there is no
    terminal to ask and `--yes` was not given."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise RunPodError(f"{what}: pass --yes to confirm (no terminal to ask)")
    if input(f"{what}. Go on? [y/N] ").strip().lower() not in ("y", "yes"):
        raise RunPodError("kept: nothing was changed")


def going(pod: Pod) -> str:
    """A pod, and what goes with it when it is deleted."""
    network = bool((pod.get("mounts") or {}).get("network"))
    goes = "its container disk goes; its network volume stays" if network else "its container disk and its volume go"
    return f"pod {pod['id']} ({pod['name']}, {machine(pod)}, {pod['status']}): {goes}"


def machine(pod: Pod) -> str:
    """What the pod runs on: its GPU type, or its CPU flavour."""
    if gpu := pod.get("gpu"):
        return gpu["id"]
    return f"{cpu['id']} ({cpu['vcpuCount']} vCPU)" if (cpu := pod.get("cpu")) else "-"
