"""`python -m runtime pod` as a user runs it, against the schema-checking RunPod stand-in, with a real
`runtime start` (vLLM on the CPU, the tiny model) playing the pod behind a stand-in of RunPod's proxy: `up` places
it (the next GPU type on a capacity refusal), watches its boot through its Hub log and its /health, and
ends with a working `connect` block; then `status`, `stop`, a `start` whose host is gone, and `down`.

One pod for the module (a vLLM cold start costs a minute here): the tests run in file order.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from runtime.client.identity import USER_AGENT, LastPod, last_pod
from space import runpod
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.runpod_machines import Machines
from tests.support.runpod_server import NO_CAPACITY, RunPodServer

pytestmark = pytest.mark.vllm  # `runtime start` playing the pod, with its vLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "vllm-pod sm89 pod-owner/vllm-pod-sm89"
LOG_REPO = f"datasets/{HubServer.owner}/vllm-pod-logs"
FIRST_GPU, SECOND_GPU = "NVIDIA RTX 6000 Ada Generation", "NVIDIA L40S"
KEY = f"sk-pod-{secrets.token_hex(12)}"
WATCH_MIN = "15"  # a cold start takes a minute alone, far more while other tests share the two cores


@dataclass
class Account:
    runpod: RunPodServer
    hub: HubServer
    machines: Machines
    template_id: str
    config: Path  # the user's config folder (XDG_CONFIG_HOME), where `pod up` remembers its pod for `launch`

    def pod(self, *args: str, timeout_s: float = 1200) -> subprocess.CompletedProcess[str]:
        env = outer_environ("RUNPOD_", "ANTHROPIC_") | {
            "RUNPOD_API_KEY": self.runpod.api_key, "RUNPOD_API_URL": self.runpod.url,
            "RUNPOD_PROXY_URL": self.machines.proxy_url,  # RunPod's proxy in front of the machines
            "HF_ENDPOINT": self.hub.endpoint, "HF_TOKEN": self.hub.read_token, "ANTHROPIC_API_KEY": KEY,
            "XDG_CONFIG_HOME": str(self.config),
        }  # fmt: skip
        return subprocess.run(
            [sys.executable, "-m", "runtime", "pod", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
            timeout=timeout_s, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def url(self, pod_id: str) -> str:
        return self.machines.proxy_url.format(pod_id=pod_id, port=8080)


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Account]:
    with HubServer() as hub, RunPodServer() as server:
        body = runpod.template_body(TEMPLATE, "registry.hf.space/pod-owner-vllm-pod-sm89:latest", log_repo=LOG_REPO)
        body["env"]["VL_SELFCHECK"] = "on"  # as on a GPU (auto): `pod up` ends with the verdict
        template_id = server.add_template(body)
        secrets_of_the_account = {"HF_TOKEN": hub.write_token, "VL_API_KEYS": KEY}
        with Machines(server, hub, tmp_path_factory.mktemp("machines"), secrets_of_the_account) as machines:
            yield Account(server, hub, machines, template_id, tmp_path_factory.mktemp("config"))
        assert not server.faults, server.faults


def test_up_places_the_pod_on_the_next_gpu_watches_its_boot_and_prints_claude_code_s_environment(
    account: Account,
) -> None:
    """No --gpu: the catalogue's sm89 cards on which the template's model (nemotron, 1M, two sessions) fits, cheapest
    first (the RTX 4090, cheaper, is too small); each in the data centres that have it before the next type."""
    account.runpod.state.out_of_stock.add(FIRST_GPU)
    account.runpod.state.out_of_stock_in.add((SECOND_GPU, "US-KS-2"))  # the catalogue still lists it there
    result = account.pod("up", "--template", TEMPLATE, "--volume-gb", "50", "--timeout", WATCH_MIN)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"\n$ python -m runtime pod up ...\n{result.stderr}{result.stdout}")  # what a user sees (-s)

    (created,) = [r for r in account.runpod.received if r.method == "POST" and r.path == "/v2/pods" and r.status == 201]
    body = created.json()
    assert body["templateId"] == account.template_id and body["cloud"] == "SECURE"
    assert body["gpu"] == {"id": SECOND_GPU, "count": 1, "allowedCudaVersions": ["13.0"]}
    assert body["mounts"] == {"persistent": {"size": 50, "path": "/workspace"}}
    assert body["dataCenterIds"] == ["EU-RO-1"]
    assert f"pod: {FIRST_GPU}: refused ({NO_CAPACITY}); trying the next" in result.stderr
    assert f"pod: {SECOND_GPU} in US-KS-2: refused ({NO_CAPACITY}); trying EU-RO-1" in result.stderr
    assert "pod: NVIDIA GeForce RTX 4090: skipped: 30.4 GiB held besides the KV is more than 0.85" in result.stderr
    tried = [r.json()["gpu"]["id"] for r in account.runpod.received if (r.method, r.path) == ("POST", "/v2/pods")]
    assert tried == [FIRST_GPU, SECOND_GPU, SECOND_GPU]  # cheapest first; never a card it does not fit
    assert any(line.startswith("  | ") and "vLLM launched" in line for line in result.stdout.splitlines()), (
        "the boot, as its Hub log tells it"
    )
    assert f"export ANTHROPIC_BASE_URL={account.url(account.runpod.pods[0]['id'])}" in result.stdout
    assert "export ANTHROPIC_MODEL=tiny" in result.stdout and "one token generated" in result.stdout
    pod_id = account.runpod.pods[0]["id"]  # then the self-check's verdict: the tiny model cannot find a needle
    assert (
        result.stdout.splitlines()[-1]
        == f"self-check: failed: needle (python -m runtime logs {pod_id}: a line per check)"
    )
    # What the client commands without a URL ask (launch, check, bench, status), with the key `pod up` was given.
    assert last_pod({"XDG_CONFIG_HOME": str(account.config)}) == LastPod(account.url(pod_id), KEY)
    assert {r.headers.get("user-agent") for r in account.runpod.received} == {USER_AGENT}


def test_connect_and_status_reach_the_pod_through_runpod_s_proxy_which_refuses_python_s_default_agent(
    account: Account,
) -> None:
    """RunPod's proxy answers 403 to Python's default User-Agent: the client commands must each say who they are."""
    url = account.url(account.runpod.pods[0]["id"])
    refused = httpx.get(f"{url}/health", timeout=30)  # httpx's own User-Agent, as a bare script would send
    assert (refused.status_code, refused.text) == (403, "error code: 1010")
    for command in (["connect", url, "--shell", "bash"], ["status", url]):
        done = subprocess.run([sys.executable, "-m", "runtime", *command, "--key", KEY], cwd=REPO_ROOT,
                              env=outer_environ("ANTHROPIC_"), capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        assert done.returncode == 0, (command[0], done.stderr)
        assert "tiny" in done.stdout, done.stdout  # the model, as the pod told it


def test_status_lists_the_pod_serving(account: Account) -> None:
    (pod,) = account.runpod.pods
    result = account.pod("status")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    assert header.split() == ["id", "machine", "state", "$/h", "uptime", "URL", "serves"]
    assert row.startswith(pod["id"]) and SECOND_GPU in row and " RUNNING " in row and row.endswith(" yes")


def test_stop_says_what_it_keeps_and_the_pod_stops(account: Account) -> None:
    (pod,) = account.runpod.pods
    result = account.pod("stop", pod["id"])
    assert result.returncode == 0, result.stderr
    assert "the container disk is lost (anything outside /workspace), the volume keeps the weights" in result.stdout
    assert account.machines.played[pod["id"]].process.wait(60) == 0
    assert account.runpod.pods[0]["status"] == "EXITED"


def test_a_pod_whose_host_is_taken_cannot_start_and_says_what_to_do(account: Account) -> None:
    (pod,) = account.runpod.pods
    account.runpod.state.host_taken.add(pod["id"])
    result = account.pod("start", pod["id"])
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"pod: {pod['id']} cannot start: its host's GPUs are rented to someone else, and its volume lives on that "
        f"host: try again later, or python -m runtime pod replace {pod['id']} --yes (the weights download again)"
    ]


def test_replace_makes_the_pod_again_on_another_host_then_deletes_it_and_watches_the_new_one(account: Account) -> None:
    """The way out of a sick host (or one whose GPUs are taken): its template, its GPU type first, a new volume
    (said, and asked: the weights download again), the old pod deleted once the new one exists, watched as up."""
    (old,) = account.runpod.pods
    refused = account.pod("replace", old["id"])
    assert refused.returncode == 1 and refused.stderr.splitlines() == [
        f"pod: replacing pod {old['id']} (vllm-pod-sm89, {SECOND_GPU}, EXITED): its container disk and its volume go; "
        "a new volume starts empty (the weights download again): pass --yes to confirm (no terminal to ask)"
    ]
    assert [pod["id"] for pod in account.runpod.pods] == [old["id"]]

    replaced = account.pod("replace", old["id"], "--yes", "--timeout", WATCH_MIN)
    assert replaced.returncode == 0, replaced.stdout[-3000:] + replaced.stderr[-3000:]
    (new,) = account.runpod.pods
    assert new["id"] != old["id"] and (new["name"], new["template"]) == (old["name"], account.template_id)
    assert new["gpu"]["id"] == SECOND_GPU and new["mounts"] == old["mounts"]  # its GPU type, a volume as big
    assert f"deleted pod {old['id']} (vllm-pod-sm89, {SECOND_GPU}, EXITED): its container disk and its volume go: " \
           f"replaced by {new['id']}" in replaced.stdout  # fmt: skip
    assert f"export ANTHROPIC_BASE_URL={account.url(new['id'])}" in replaced.stdout
    assert account.pod("stop", new["id"]).returncode == 0  # the module's next tests take a stopped pod
    assert account.machines.played[new["id"]].process.wait(60) == 0


def test_down_asks_first_then_deletes(account: Account) -> None:
    (pod,) = account.runpod.pods
    refused = account.pod("down", pod["id"])
    assert refused.returncode == 1 and "pass --yes to confirm (no terminal to ask)" in refused.stderr
    assert account.runpod.pods
    deleted = account.pod("down", pod["id"], "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.startswith(f"deleted pod {pod['id']} (vllm-pod-sm89, {SECOND_GPU}, EXITED): its container")
    assert account.runpod.pods == []


def test_a_card_of_another_architecture_or_none_that_fits_is_refused_before_anything_is_created(
    account: Account,
) -> None:
    """The notes' sm89 image on an A100 must be refused, not tried; a price cap no fitting card meets names the
    smallest card that would do; `pod gpus` shows the catalogue as `pod up` reads it."""
    created = len(account.runpod.pods)
    a100 = account.pod("up", "--template", TEMPLATE, "--gpu", "NVIDIA A100 80GB PCIe")
    assert (a100.returncode, a100.stderr.splitlines()[-1]) == (1, (
        "pod: NVIDIA A100 80GB PCIe is an sm80 card and this template's image is for sm89: the sm80 image serves it "
        "(build.py --arch sm80 --push --runpod)"
    ))  # fmt: skip
    blackwell = account.pod("up", "--template", TEMPLATE, "--gpu", "NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert "the sm120 image serves it (build.py --arch sm120 --push --runpod)" in blackwell.stderr
    cheap = account.pod("up", "--template", TEMPLATE, "--max-price", "0.70")
    assert cheap.returncode == 1 and cheap.stderr.splitlines()[-1] == (
        "pod: nemotron at 1,048,576 tokens for 2 sessions fits none of RTX 4090, RTX 6000 Ada, L40S within "
        "--max-price 0.7: the smallest card that holds it is the L40S (NVIDIA L40S, image sm89)"
    )
    assert len(account.runpod.pods) == created
    listed = account.pod("gpus")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == [
        "id",
        "GiB",
        "arch",
        "image",
        "secure",
        "$/h",
        "community",
        "$/h",
        "stock",
    ]
    l40s = next(line for line in listed.stdout.splitlines() if line.startswith(SECOND_GPU))
    assert l40s.split()[-6:] == ["45.0", "sm89", "sm89", "0.86", "0.60", "HIGH"]  # nvidia-smi's GiB, not RunPod's GB


def test_no_capacity_anywhere_is_one_line_listing_what_was_tried(account: Account) -> None:
    account.runpod.state.out_of_stock.update({FIRST_GPU, SECOND_GPU})
    result = account.pod("up", "--template", TEMPLATE, "--gpu", FIRST_GPU, "--gpu", SECOND_GPU)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"pod: no pod could be placed, tried: {FIRST_GPU} ({NO_CAPACITY}); {SECOND_GPU} ({NO_CAPACITY}): "
        "try other --gpu types, --cloud community, or later"
    )
    assert account.runpod.pods == []


def test_an_unknown_template_names_the_account_s(account: Account) -> None:
    result = account.pod("up", "--template", "nope")
    assert (result.returncode, result.stderr) == (
        1,
        f"pod: no template(s) named 'nope' (yours: {TEMPLATE!r}): pass one name or id (build.py --runpod saves one)\n",
    )
