"""How the runtime names and reaches a Hub repo: repo ids, the pod's id, bounded waits."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub.utils import get_session

from runtime.hub.repo import HUB_TIMEOUT_S, HubRepo, pod_id
from tests.support.hub_lies import HostileHub, Lies

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("spec", "repo_id", "repo_type", "shown"),
    [
        ("patdev/k3-a40-bootstrap", "patdev/k3-a40-bootstrap", "model", "patdev/k3-a40-bootstrap"),
        ("datasets/me/pod-logs", "me/pod-logs", "dataset", "datasets/me/pod-logs"),
        ("spaces/me/status", "me/status", "space", "spaces/me/status"),
        (" me/logs/ ", "me/logs", "model", "me/logs"),
    ],
)
def test_repo_specs(spec: str, repo_id: str, repo_type: str, shown: str) -> None:
    repo = HubRepo.parse(spec)
    assert (repo.repo_id, repo.repo_type, str(repo)) == (repo_id, repo_type, shown)


@pytest.mark.parametrize("spec", ["logs", "a/b/c", "me/has space", "datasets/logs", "-me/logs"])
def test_bad_repo_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="is not a Hub repo id"):
        HubRepo.parse(spec)


@pytest.mark.slow  # starts a Python process
def test_a_bad_repo_setting_is_refused_by_the_settings_with_one_line() -> None:
    """The settings hold the repo id check: `python -m runtime settings` refuses it before a pod starts."""
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "settings"],
        capture_output=True,
        text=True,
        env={"VL_LOG_REPO": "my-logs", "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "VL_LOG_REPO='my-logs' is not allowed: expected a Hub repo id (owner/name, "
        "datasets/owner/name or spaces/owner/name), or empty\n"
    )


def test_the_environment_gives_endpoint_and_token() -> None:
    repo = HubRepo.from_environ("me/logs", {"HF_ENDPOINT": "http://127.0.0.1:1", "HF_TOKEN": "hf_x"})
    assert (repo.endpoint, repo.token) == ("http://127.0.0.1:1", "hf_x")
    anonymous = HubRepo.from_environ("me/logs", {})
    assert (anonymous.endpoint, anonymous.token) == (None, False)  # never a token found elsewhere on disk


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"RUNPOD_POD_ID": "udpfa0l4z65m09"}, "udpfa0l4z65m09"),
        ({"RUNPOD_POD_ID": "../../etc/passwd"}, "etc-passwd"),
        ({"RUNPOD_POD_ID": "a b/c"}, "a-b-c"),
    ],
)
def test_pod_id(environ: dict[str, str], expected: str) -> None:
    assert pod_id(environ) == expected


def test_pod_id_falls_back_to_the_hostname() -> None:
    assert pod_id({}) == pod_id({"RUNPOD_POD_ID": socket.gethostname()})


def test_hub_requests_have_a_timeout() -> None:
    """huggingface_hub's shared client waits forever by default; a hung Hub must not freeze a thread."""
    api = HubRepo.parse("me/logs").api  # the client every Hub call makes, which bounds the shared session
    assert api.endpoint
    assert get_session().timeout.read == HUB_TIMEOUT_S
    assert get_session().timeout.connect == HUB_TIMEOUT_S


def test_a_file_version_at_a_revision_that_is_not_a_commit_id_is_refused() -> None:
    """`read_text` downloads at `version.commit` into a throwaway cache, where huggingface_hub writes
    `refs/<revision>`: a Hub that answered `../../…` there, then the true commit, wrote outside that cache."""
    repo_id, forged = "pod-owner/pod-config", "../../../../escaped"
    with HostileHub(Lies(repo_id, sha=forged)) as hub:
        hub.create_repo(repo_id)
        hub.put_file(repo_id, "pod.toml", "[settings]\n")
        repo = HubRepo(repo_id, endpoint=hub.endpoint, token=hub.read_token)
        with pytest.raises(ConnectionError) as refused:
            repo.version("pod.toml")
    assert str(refused.value) == (
        f"{hub.endpoint} answered {repo_id}'s revision as '{forged}', not a 40-hex commit id (for pod.toml)"
    )
