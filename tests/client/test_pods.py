"""`python -m runtime pod` as a user runs it, against the schema-checking RunPod stand-in, with a real
`runtime start` (vLLM on the CPU, the tiny model) playing the pod behind a stand-in of RunPod's proxy, and the test
Hub with a builder that finishes a Space's build.

The README's journey is run as its console block writes it, step by step and in its order (tests/support/
transcript.py): `build.py --push --runpod` saves the template; `pod up` places the pod (the next GPU type on a
capacity refusal), watches its boot through its Hub log and its /health, and ends with a working `connect` block;
`launch` starts Claude Code (a stand-in `claude` that keeps its environment) on it; then `status`, `stop` and
`down`. Each command's output is compared with the README's lines: a README line the program no longer prints, or a
command it no longer has, fails here. Between the README's steps: `connect` and `status` through the proxy, a
`start` whose host is gone, and `replace`.

One pod for the module (a vLLM cold start costs a minute here): the tests run in file order.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from runtime.client.identity import LastPod, last_pod
from runtime.headers import USER_AGENT
from tests.support.claude_code import stand_in_claude
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.runpod_machines import Machines, pod_command
from tests.support.runpod_server import NO_CAPACITY, RunPodServer
from tests.support.scripted_builder import ScriptedBuilder
from tests.support.transcript import Shell, Step, journey

pytestmark = pytest.mark.vllm  # `runtime start` playing the pod, with its vLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "vllm-pod sm89 pod-owner/vllm-pod-sm89"
FIRST_GPU, SECOND_GPU = "NVIDIA RTX 6000 Ada Generation", "NVIDIA L40S"
KEY = f"sk-pod-{secrets.token_hex(12)}"
WATCH_MIN = "15"  # a cold start takes a minute alone, far more while other tests share the two cores
# The README's example names, each replaced by the real one once known.
EXAMPLE_OWNER, EXAMPLE_POD, EXAMPLE_TEMPLATE = "acme", "e4ppo0su", "9x4m2p7v"
EXAMPLE_URL = f"https://{EXAMPLE_POD}-8080.proxy.runpod.net"
EXAMPLE_HUB = "https://huggingface.co"  # the Hub the README's user pushes to: the test Hub here


@dataclass
class Account:
    runpod: RunPodServer
    hub: HubServer
    machines: Machines
    config: Path  # the user's config folder (XDG_CONFIG_HOME), where `pod up` remembers its pod for `launch`
    shell: Shell  # the README's journey, as the user's shell runs it
    steps: list[Step] = field(default_factory=lambda: journey((REPO_ROOT / "README.md").read_text()))
    next_step: int = 0

    def pod(self, *args: str, timeout_s: float = 1200) -> subprocess.CompletedProcess[str]:
        return pod_command(args, self.runpod, self.hub, self.machines.proxy_url, self.config, KEY, timeout_s)

    def url(self, pod_id: str) -> str:
        return self.machines.proxy_url.format(pod_id=pod_id, port=8080)

    def template_id(self) -> str:
        (template,) = self.runpod.templates
        return str(template["id"])

    def learn_names(self) -> None:
        """The README's example template and pod are the account's: its template, the newest pod (after `replace`)."""
        if self.runpod.templates:
            self.shell.examples[EXAMPLE_TEMPLATE] = self.template_id()
        if self.runpod.pods:
            self.the_pod_is(self.runpod.pods[-1]["id"])

    def the_pod_is(self, pod_id: str) -> None:
        """The README's example pod is this one from now on."""
        self.shell.examples |= {EXAMPLE_POD: pod_id, EXAMPLE_URL: self.url(pod_id)}

    def journey_through(self, starting: str, timeout_s: float = 600) -> str:
        """Runs the README's next steps, in its order, up to the one whose command starts with `starting`; returns
        that one's output. Fails when a step prints other lines than the README's, or the README lost the step."""
        while self.next_step < len(self.steps):
            step = self.steps[self.next_step]
            self.next_step += 1
            self.learn_names()  # the pod it names
            done = self.shell.run(step, timeout_s)
            if done is None:  # an export
                continue
            self.learn_names()  # the pod it made
            output = self.shell.check(step, done)
            if step.command.startswith(starting):
                return output
        raise AssertionError(f"the README's journey has no `$ {starting}` step after those already run")


@pytest.fixture(scope="module")
def account(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Account]:
    with HubServer() as hub, RunPodServer() as server:
        hub.builder = ScriptedBuilder()  # an sm89 image cannot be built here: the build log is the Dockerfile's steps
        server.add_volume("models", data_center="EU-RO-1")  # the README's network volume
        secrets_of_the_account = {"HF_TOKEN": hub.write_token, "VL_API_KEYS": KEY}
        home = tmp_path_factory.mktemp("home")
        stand_in_claude(home / "bin")
        (home / "hf").mkdir()
        (home / "hf" / "token").write_text(hub.read_token)  # the user logged in to the Hub (`hf auth login`)
        environ = outer_environ("RUNPOD_", "ANTHROPIC_") | {
            "PATH": f"{home / 'bin'}:{outer_environ()['PATH']}", "HOME": str(home), "HF_HOME": str(home / "hf"),
            "XDG_CONFIG_HOME": str(home / "config"), "CLAUDE_SEEN": str(home / "claude-environment.json"),
            "HF_ENDPOINT": hub.endpoint, "RUNPOD_API_URL": server.url, "PYTHONUNBUFFERED": "1",  # a terminal's lines
        }  # fmt: skip
        with Machines(server, hub, tmp_path_factory.mktemp("machines"), secrets_of_the_account) as machines:
            environ["RUNPOD_PROXY_URL"] = machines.proxy_url  # RunPod's proxy in front of the machines
            given = {"HF_TOKEN": hub.write_token, "HF_READ_TOKEN": hub.read_token, "RUNPOD_API_KEY": server.api_key,
                     "ANTHROPIC_API_KEY": KEY}  # fmt: skip
            examples = {EXAMPLE_OWNER: HubServer.owner, EXAMPLE_HUB: hub.endpoint, "'nemotron'": "'tiny'"}
            shell = Shell(REPO_ROOT, environ, given, examples)
            yield Account(server, hub, machines, home / "config", shell)
        assert not server.faults, server.faults


def test_the_readme_s_publishing_step_saves_the_template(account: Account) -> None:
    account.journey_through("HF_TOKEN=")
    (template,) = account.runpod.templates
    assert template["name"] == TEMPLATE and template["image"] == "registry.hf.space/pod-owner-vllm-pod-sm89:latest"
    # As on a GPU (VL_SELFCHECK=auto), `pod up` ends with the pod's self-check: set as a person would in the console.
    account.runpod.edit_template(account.template_id(), env=template["env"] | {"VL_SELFCHECK": "on"})


def test_up_places_the_pod_on_the_next_gpu_watches_its_boot_and_prints_claude_code_s_environment(
    account: Account,
) -> None:
    """No --gpu: the catalogue's sm89 cards on which the template's model (nemotron, 1M, two sessions) fits, cheapest
    first (the RTX 4090, cheaper, is too small), each in the data centre of the network volume."""
    account.runpod.state.out_of_stock.add(FIRST_GPU)
    output = account.journey_through("python -m runtime pod up", timeout_s=1200)
    print(f"\n$ python -m runtime pod up ...\n{output}")  # what a user sees (-s)

    (created,) = [r for r in account.runpod.received if r.method == "POST" and r.path == "/v2/pods" and r.status == 201]
    body = created.json()
    assert body["templateId"] == account.template_id() and body["cloud"] == "SECURE"
    assert body["gpu"] == {"id": SECOND_GPU, "count": 1, "allowedCudaVersions": ["13.0"]}
    (volume,) = account.runpod.state.volumes.values()
    assert body["mounts"] == {"network": [{"volumeId": volume["id"], "path": "/workspace"}]}
    assert body["dataCenterIds"] == ["EU-RO-1"]
    assert f"pod: {FIRST_GPU}: refused ({NO_CAPACITY}); trying the next" in output
    assert "pod: NVIDIA GeForce RTX 4090: skipped: 30.4 GiB held besides the KV is more than 0.85" in output
    tried = [r.json()["gpu"]["id"] for r in account.runpod.received if (r.method, r.path) == ("POST", "/v2/pods")]
    assert tried == [FIRST_GPU, SECOND_GPU]  # cheapest first; never a card it does not fit
    assert any(line.startswith("  | ") and "vLLM launched" in line for line in output.splitlines()), (
        "the boot, as its Hub log tells it"
    )
    pod_id = account.runpod.pods[0]["id"]
    assert f"export ANTHROPIC_BASE_URL={account.url(pod_id)}" in output
    assert "export ANTHROPIC_MODEL=tiny" in output and "one token generated" in output
    # then the self-check's verdict: the tiny model cannot find a needle
    assert output.splitlines()[-1] == f"self-check: failed: needle (python -m runtime logs {pod_id}: a line per check)"
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


def test_launch_runs_claude_code_on_the_pod_with_the_readme_s_key_then_status_lists_it_serving(
    account: Account,
) -> None:
    """The README exported ANTHROPIC_API_KEY before `pod up`: `launch` checks the pod with it and hands it to Claude
    Code as ANTHROPIC_AUTH_TOKEN, the paid API's variable removed."""
    account.journey_through("python -m runtime launch")
    seen = json.loads(Path(account.shell.environ["CLAUDE_SEEN"]).read_text())
    (pod,) = account.runpod.pods
    assert (seen["ANTHROPIC_BASE_URL"], seen["ANTHROPIC_AUTH_TOKEN"]) == (account.url(pod["id"]), KEY)
    assert "ANTHROPIC_API_KEY" not in seen and seen["ANTHROPIC_MODEL"] == "tiny"
    header, row = account.journey_through("python -m runtime pod status").splitlines()
    assert header.split() == ["id", "machine", "state", "$/h", "uptime", "URL", "serves"]
    assert row.startswith(pod["id"]) and SECOND_GPU in row and " RUNNING " in row and row.endswith(" yes")


def test_stop_says_what_it_keeps_and_the_pod_stops(account: Account) -> None:
    (pod,) = account.runpod.pods
    account.journey_through("python -m runtime pod stop")
    assert account.machines.played[pod["id"]].process.wait(60) == 0
    assert account.runpod.pods[0]["status"] == "EXITED"


def test_a_pod_whose_host_is_taken_cannot_start_and_says_what_to_do(account: Account) -> None:
    """Its network volume keeps the weights: `replace`; a pod whose volume lives on the host (one made earlier with
    --volume-gb) loses them with it, and is told so."""
    (pod,) = account.runpod.pods
    on_its_host = account.runpod.add_pod({"name": "vllm-pod-sm89", "templateId": account.template_id(),
                                          "gpu": {"id": SECOND_GPU}, "mounts": {"persistent": {"size": 50, "path": "/workspace"}}})  # fmt: skip
    account.runpod.state.host_taken.update({pod["id"], on_its_host})
    assert [(done.returncode, done.stderr) for done in (account.pod("start", pod["id"]), account.pod("start", on_its_host))] == [
        (1, f"pod: {pod['id']} cannot start: its host's GPUs are rented to someone else; its network volume keeps the "
            f"weights: python -m runtime pod replace {pod['id']}\n"),
        (1, f"pod: {on_its_host} cannot start: its host's GPUs are rented to someone else, and its volume lives on "
            f"that host: try again later, or python -m runtime pod replace {on_its_host} --yes (the weights download "
            "again)\n"),
    ]  # fmt: skip
    refused = account.pod("replace", on_its_host)  # asked first: its volume goes with it
    assert refused.returncode == 1 and refused.stderr.splitlines() == [
        f"pod: replacing pod {on_its_host} (vllm-pod-sm89, {SECOND_GPU}, EXITED): its container disk and its volume "
        "go; a new volume starts empty (the weights download again): pass --yes to confirm (no terminal to ask)"
    ]
    deleted = account.pod("down", on_its_host, "--yes")
    assert (deleted.returncode, deleted.stdout) == (
        0, f"deleted pod {on_its_host} (vllm-pod-sm89, {SECOND_GPU}, EXITED): its container disk and its volume go\n"
    )  # fmt: skip
    assert account.runpod.pods == [pod]


def test_replace_makes_the_pod_again_on_another_host_then_deletes_it_and_watches_the_new_one(account: Account) -> None:
    """The way out of a sick host (or one whose GPUs are taken): its template, its GPU type first, its network volume
    (nothing to ask: it stays), the old pod deleted once the new one exists, watched as up."""
    (old,) = account.runpod.pods
    replaced = account.pod("replace", old["id"], "--timeout", WATCH_MIN)
    assert replaced.returncode == 0, replaced.stdout[-3000:] + replaced.stderr[-3000:]
    (new,) = account.runpod.pods
    assert new["id"] != old["id"] and (new["name"], new["template"]) == (old["name"], account.template_id())
    assert new["gpu"]["id"] == SECOND_GPU and new["mounts"] == old["mounts"]  # its GPU type, its volume
    assert new["dataCenterId"] == old["dataCenterId"]  # where the volume lives
    assert f"deleted pod {old['id']} (vllm-pod-sm89, {SECOND_GPU}, EXITED): its container disk goes; its network " \
           f"volume stays: replaced by {new['id']}" in replaced.stdout  # fmt: skip
    assert f"export ANTHROPIC_BASE_URL={account.url(new['id'])}" in replaced.stdout
    assert account.pod("stop", new["id"]).returncode == 0  # the README's `pod down` takes a stopped pod
    assert account.machines.played[new["id"]].process.wait(60) == 0


def test_down_deletes_the_pod_and_the_readme_s_journey_ran_whole(account: Account) -> None:
    account.journey_through("python -m runtime pod down")
    assert account.runpod.pods == []
    assert account.next_step == len(account.steps), [step.command for step in account.steps[account.next_step :]]
    refused = account.pod("down", "nope")
    assert refused.returncode == 1 and "nope" in refused.stderr


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
