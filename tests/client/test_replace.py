"""`pod replace` puts the new pod on another machine than the old one's: RunPod may place it on the same host (its
other GPUs are free, or the old pod's once stopped), and a sick host's way out must not lead back to it. Against the
schema-checking RunPod stand-in, which tells each pod's host address (`ssh.direct.host`) and can be made to place
the next pods on a given host; no machine plays the pod (the watch that follows is not this test's)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

import pytest

from runtime.client.pods import placement
from runtime.client.pods.boot import Watching
from runtime.client.pods.facade import Pods
from runtime.client.pods.placement import host_of
from runtime.runpod.api import RunPodClient, RunPodError
from space import runpod
from tests.support.runpod_server import RunPodServer

TEMPLATE = "vllm-pod sm89 pod-owner/vllm-pod-sm89"
ADA, L40S, RTX4090 = "NVIDIA RTX 6000 Ada Generation", "NVIDIA L40S", "NVIDIA GeForce RTX 4090"
SICK = "203.0.113.7"  # the old pod's machine
replacing = importlib.import_module("runtime.client.pods.replace")  # the package's `replace` is the function


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pods `replace` watches boot (none serves here: each watch is said to succeed)."""
    seen: list[str] = []

    def watch_boot(pods: Pods, pod_id: str, watching: Watching, env: Mapping[str, str]) -> int:
        seen.append(pod_id)
        return 0

    monkeypatch.setattr(replacing, "watch_boot", watch_boot)
    return seen


@pytest.fixture
def pods(runpod_server: RunPodServer) -> Iterator[Pods]:
    with RunPodClient(runpod_server.api_key, runpod_server.url) as api:
        yield Pods(api)


def sick_pod(runpod_server: RunPodServer, pods: Pods) -> str:
    """A pod from the template on the sick host, running (RunPod tells a running pod's address)."""
    template = runpod_server.add_template(runpod.template_body(TEMPLATE, "registry.hf.space/o-vllm-pod-sm89:latest"))
    runpod_server.state.hosts = [SICK]
    old = pods.api.create_pod({"name": "vllm-pod-sm89", "templateId": template, "cloud": "SECURE",
                               "gpu": {"id": ADA, "count": 1}}, "the old pod")  # fmt: skip
    assert host_of(pods.get(old["id"])) == SICK
    return old["id"]


def test_a_new_pod_placed_on_the_old_one_s_host_is_deleted_and_placed_again_on_another_gpu_type(
    runpod_server: RunPodServer, pods: Pods, watched: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """RunPod placed the new pod on the sick host (its other GPUs free): it is deleted at once, and the next try asks
    for another GPU type first (a machine holds one type); the old pod is deleted once the new one is elsewhere."""
    old = sick_pod(runpod_server, pods)
    runpod_server.state.hosts = [SICK]  # the next placement lands on the old pod's machine, the one after elsewhere
    assert replacing.replace(pods, old, [], True, Watching(None, 0)) == 0
    (new,) = runpod_server.pods
    assert new["id"] != old and host_of(new) != SICK and new["gpu"]["id"] == L40S and watched == [new["id"]]
    deletes = [r.path for r in runpod_server.received if r.method == "DELETE"]
    assert len(deletes) == 2 and deletes[-1] == f"/v2/pods/{old}"  # the landed one first, then the old one
    said = capsys.readouterr().err
    assert f"landed on {old}'s host ({SICK}): deleted it (1/3); trying again, {L40S} first" in said


def test_a_replacement_that_keeps_landing_on_the_old_host_gives_up_and_keeps_the_old_pod(
    runpod_server: RunPodServer, pods: Pods, watched: list[str]
) -> None:
    old = sick_pod(runpod_server, pods)
    runpod_server.state.hosts = [SICK] * replacing.HOST_TRIES
    with pytest.raises(RunPodError, match=f"placed the new pod on {old}'s host 3 times .*{old} is kept"):
        replacing.replace(pods, old, [], True, Watching(None, 0))
    assert [pod["id"] for pod in runpod_server.pods] == [old] and watched == []  # each landed one deleted


def test_the_new_card_is_checked_as_pod_up_checks_it_its_model_fits_within_the_price_cap(
    runpod_server: RunPodServer, pods: Pods, watched: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """replace once tried every card of the target's, 24 GB ones included, with no price cap: the template's model is
    sized as `up` sizes it, and --max-price holds."""
    old = sick_pod(runpod_server, pods)  # nemotron at its 1M tokens: 48 GB cards, no 24 GB one
    with pytest.raises(RunPodError, match=r"within --max-price 0\.5"):
        replacing.replace(pods, old, [RTX4090, L40S], True, Watching(None, 0), max_price=0.5)
    assert [pod["id"] for pod in runpod_server.pods] == [old]
    assert replacing.replace(pods, old, [RTX4090, L40S], True, Watching(None, 0), max_price=0.9) == 0
    (new,) = runpod_server.pods
    assert new["gpu"]["id"] == L40S and watched == [new["id"]]
    assert f"pod: {RTX4090}: skipped: " in capsys.readouterr().err


def test_a_new_pod_that_tells_no_host_in_time_is_kept_and_said(
    runpod_server: RunPodServer, pods: Pods, watched: list[str], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """RunPod tells a pod's address once it runs (after its image's pull): replace waits for it, a line saying so,
    and when it does not come in time goes on with the pod, saying what to do if it is the old host."""
    old = sick_pod(runpod_server, pods)
    (template,) = runpod_server.templates
    runpod_server.edit_template(template["id"], ports=["8080/http"])  # no 22/tcp: no address to tell
    monkeypatch.setattr(placement, "HOST_WAIT_S", 0.3)
    monkeypatch.setattr(placement, "HOST_POLL_S", 0.05)
    assert replacing.replace(pods, old, [], True, Watching(None, 0)) == 0
    (new,) = runpod_server.pods
    said = capsys.readouterr().err
    assert f"pod: {new['id']}: waiting for its host's address (told once it runs) to check it is not {SICK}" in said
    assert f"pod: {new['id']} told no host address yet: if it is {old}'s ({SICK}), replace it again" in said
    assert watched == [new["id"]] and len([r for r in runpod_server.received if r.path == f"/v2/pods/{new['id']}"]) > 1
