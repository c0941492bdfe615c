"""`python -m runtime start` end to end, as the image runs it: real vLLM serving the tiny model, the
real bridge, a real sshd, and the real huggingface_hub client against the local test Hub.

A vLLM cold start costs ~30 s on two shared cores, so ONE pod serves every test here, in file order
(four cold starts in all): serving (on its environment's port, its Hub file at start refused), the Hub
log, SSH, remote config (pod settings refused, bridge-only, invalid, engine), the watchdogs,
VL_BRIDGE=off, then SIGTERM.
The measured times are printed (`-s`): the report's numbers, never asserted on.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from runtime.engine.tinymodel import ANSWER, MARK_TEXT, write_tiny_model
from tests.support.environ import outer_environ
from tests.support.hub_server import POD_CONFIG_REPO, POD_LOG_REPO, HubServer
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.sdk import anthropic
from tests.support.ssh import ssh_argv

pytestmark = pytest.mark.vllm  # `runtime start` with its vLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
POD_ID = "e2e-pod"
LOG_REPO, CONFIG_REPO = POD_LOG_REPO, POD_CONFIG_REPO  # the `hub` fixture (tests/support/hub_server.py) makes them
HUB_LOG = f"etat/{POD_ID}.log"
MARKER = "VLPOD_TEST_MARK"  # in the start process's environment, so in every descendant's
ENGINE_START_S = 600.0  # ~30 s alone; far more while other engineers' tests share the two cores
RELOAD_S = 120.0  # a config poll (5 s) plus a bridge start, on a loaded machine
HUB_BUDGET_S = 300.0  # past its first burst, the Hub log commits about once a minute


@dataclass
class RunningPod:
    """The `runtime start` process, its state directory, and how to reach what it serves."""

    process: subprocess.Popen
    state: Path
    env: dict[str, str]
    hub: HubServer
    client_key: Path
    marker: str  # in every descendant's environment: how the last test finds leftovers
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return int(self.env["VL_PORT"])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pid(self, name: str) -> int | None:
        path = self.state / f"{name}.pid"
        try:
            return int(path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def boot_log(self) -> str:
        path = self.state / "boot.log"
        return path.read_text() if path.exists() else ""

    def hub_log(self) -> str:
        return (self.hub.file(LOG_REPO, HUB_LOG) or b"").decode()

    def set_remote_config(self, text: str) -> None:
        self.hub.put_file(CONFIG_REPO, "pod.env", text)

    def ask(self) -> str:
        client = anthropic.Anthropic(base_url=self.url, api_key=self.env["VL_API_KEYS"], max_retries=0, timeout=60)
        message = client.messages.create(
            model="claude-tiny", max_tokens=64, messages=[{"role": "user", "content": f"{MARK_TEXT} hello"}]
        )
        return "".join(block.text for block in message.content if block.type == "text")

    def serves(self) -> bool:
        try:
            return self.ask() == ANSWER
        except (anthropic.APIError, httpx.HTTPError):
            return False

    def model_ids(self) -> list[str]:
        headers = {"x-api-key": self.env["VL_API_KEYS"], "anthropic-version": "2023-06-01"}
        return [m["id"] for m in httpx.get(f"{self.url}/v1/models", headers=headers, timeout=10).json()["data"]]

    def engine_window(self) -> int:
        listing = httpx.get(f"http://127.0.0.1:{self.env['VL_ENGINE_PORT']}/v1/models", timeout=10).json()
        return listing["data"][0]["max_model_len"]

    def processes(self) -> set[psutil.Process]:
        """Every live process of the pod: the start process's tree, plus anything carrying the pod's
        marker (a process orphaned by its parent's death). psutil tells a reused pid apart."""
        found: set[psutil.Process] = set()
        with contextlib.suppress(psutil.Error):
            start = psutil.Process(self.process.pid)
            found |= {start, *start.children(recursive=True)}
        found |= {p for p in psutil.process_iter() if carries(p, MARKER, self.marker)}
        return {p for p in found if alive(p)}


def carries(process: psutil.Process, name: str, value: str) -> bool:
    try:
        return process.environ().get(name) == value
    except psutil.Error:
        return False


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def launch(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", "start"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def pod(hub: HubServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningPod]:
    root = tmp_path_factory.mktemp("pod")
    state = root / "state"
    write_tiny_model(state / "models" / "tiny")  # what the cpu image bakes: start generates nothing
    (root / "image_prebaked").write_text('{"target": "cpu"}\n')
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "client_key")], check=True)
    marker = secrets.token_hex(8)
    outer = outer_environ("PUBLIC_KEY", "SSH_PUBLIC_KEY")
    env = (
        outer
        | hub.env()
        | {
            MARKER: marker,
            "RUNPOD_POD_ID": POD_ID,
            "PUBLIC_KEY": (root / "client_key.pub").read_text(),
            "POD_GREETING": "hello from the pod",
            "MY_SERVICE_PASSWORD": f"planted-{secrets.token_hex(12)}",  # a secret no published byte may carry
            "VL_API_KEYS": f"sk-planted-{secrets.token_hex(12)}",
            "VL_MODEL": "tiny",
            "VL_STATE_DIR": str(state),
            "VL_VENV": sys.prefix,
            "VL_PREBAKED_MARKER": str(root / "image_prebaked"),
            "VL_LISTEN": "127.0.0.1",
            "VL_PORT": str(free_port()),
            "VL_ENGINE_PORT": str(free_port()),
            "VL_SSH_PORT": str(free_port()),
            "VL_SSH_HOST_KEYS": str(root / "hostkeys"),
            "VL_SSH_AUTHORIZED_KEYS": str(root / "home" / ".ssh" / "authorized_keys"),
            "VL_SSH_ENV_FILE": str(root / "pod-environment.sh"),
            "VL_SSH_STRICT_MODES": "off",  # the temp dir sits under the world-writable /tmp
            "VL_LOG_REPO": LOG_REPO,
            "VL_LOG_INTERVAL_S": "5",
            "VL_CONFIG_REPO": CONFIG_REPO,
            "VL_CONFIG_POLL_S": "5",
        }
    )
    # At start, a Hub file that sets pod settings: refused whole, the pod starts on its environment.
    hub.put_file(CONFIG_REPO, "pod.env", f"VL_PORT={free_port()}\nVL_STATE_DIR={root / 'elsewhere'}\nVL_ALIASES=x\n")
    started = time.monotonic()
    running = RunningPod(launch(env), state, env, hub, root / "client_key", marker)
    try:
        wait_until(
            lambda: "engine is healthy" in running.boot_log(),
            "the engine's first healthy probe",
            ENGINE_START_S,
            every_s=0.5,
        )
        running.timings["start → healthy (s)"] = time.monotonic() - started
        launched = re.search(r"vLLM launched ([\d.]+) s after the process started", running.boot_log())
        running.timings["start → vLLM launched (s)"] = float(launched[1])
        yield running
    finally:
        if running.process.poll() is None:
            running.process.send_signal(signal.SIGTERM)
            try:
                running.process.wait(30)
            except subprocess.TimeoutExpired:
                running.process.kill()
        for process in running.processes():  # only after a failure: the last test leaves none
            with contextlib.suppress(psutil.Error):
                process.kill()
        print("\n" + "\n".join(f"{name}: {value:.2f}" for name, value in running.timings.items()))


def test_the_bridge_answers_messages(pod: RunningPod) -> None:
    assert wait_until(pod.serves, "an answer through the bridge", 60, every_s=0.5)


def test_a_hub_file_with_pod_settings_at_start_is_refused_and_all_agree_on_the_environment_s_port(
    pod: RunningPod,
) -> None:
    refusal = (
        f"refused {CONFIG_REPO}/pod.env: VL_PORT, VL_STATE_DIR are pod settings: set them in the pod's environment "
        "(the RunPod template); the current configuration keeps serving"
    )
    assert refusal in pod.boot_log()
    assert not (pod.state.parent / "elsewhere").exists(), "the pod writes to its environment's folder only"
    assert "x" not in pod.model_ids(), "the file was refused whole"
    # The HEALTHCHECK (the image's command, with the pod's environment) asks the port the bridge serves.
    healthcheck = subprocess.run([sys.executable, "-m", "runtime.health"], cwd=REPO_ROOT, env=pod.env, timeout=60)
    assert healthcheck.returncode == 0
    wait_until(lambda: "bridge is healthy" in pod.boot_log(), "the watchdog's probe answered on that port", RELOAD_S)
    wait_until(lambda: refusal in pod.hub_log(), "the refusal in the Hub log", HUB_BUDGET_S)


def test_the_hub_log_is_published_until_healthy_and_carries_no_secret(pod: RunningPod) -> None:
    header = f"# vllm-pod {POD_ID} · "
    versions = [c.files[HUB_LOG].decode() for c in pod.hub.commits(LOG_REPO) if HUB_LOG in c.files]
    starting = [v for v in versions if v.startswith(header + "not healthy")]
    assert any("vLLM launched" in v and "engine started" in v for v in starting)
    wait_until(lambda: pod.hub_log().startswith(header + "healthy"), "the last word: healthy", HUB_BUDGET_S)
    planted = [pod.env["VL_API_KEYS"], pod.env["MY_SERVICE_PASSWORD"], pod.env["HF_TOKEN"]]
    for request in pod.hub.received:
        assert not any(secret.encode() in request.payload() for secret in planted), request.path


def test_ssh_login_with_the_pod_key_sees_the_pod_environment(pod: RunningPod) -> None:
    command = ssh_argv(
        pod.env["VL_SSH_PORT"], "-i", str(pod.client_key), command='echo "$POD_GREETING|${PUBLIC_KEY-none}"'
    )
    wait_until(lambda: pod.pid("sshd"), "sshd")
    result = wait_until(
        lambda: (r := subprocess.run(command, capture_output=True, text=True, timeout=30)).returncode == 0 and r,
        "an SSH login",
        30,
        every_s=0.5,
    )
    assert result.stdout.strip() == "hello from the pod|none"


@pytest.mark.parametrize("line", ["VL_PORT=9000", "VL_STATE_DIR=/srv/elsewhere"])
def test_a_live_file_with_a_pod_setting_is_refused_and_nothing_restarts(pod: RunningPod, line: str) -> None:
    engine, bridge = pod.pid("engine"), pod.pid("bridge")
    name = line.split("=")[0]
    pod.set_remote_config(f"VL_ALIASES=my-alias\n{line}\n")
    refusal = f": {name} is a pod setting: set it in the pod's environment (the RunPod template); the current"
    wait_until(lambda: refusal in pod.boot_log(), "the refusal", RELOAD_S)
    assert (pod.pid("engine"), pod.pid("bridge")) == (engine, bridge)
    assert pod.serves() and "my-alias" not in pod.model_ids()


def test_a_bridge_only_change_reloads_the_bridge_alone(pod: RunningPod) -> None:
    engine, bridge = pod.pid("engine"), pod.pid("bridge")
    pod.set_remote_config("VL_ALIASES=my-alias\n")
    asked = time.monotonic()
    wait_until(lambda: pod.pid("bridge") not in (None, bridge), "a new bridge", RELOAD_S, every_s=0.2)
    restarted = time.monotonic()
    wait_until(lambda: "my-alias" in ids_or_none(pod), "the alias served", RELOAD_S, every_s=0.2)
    pod.timings["bridge-only change: Hub file → new bridge (s)"] = restarted - asked
    pod.timings["bridge-only change: new bridge → serving (s)"] = time.monotonic() - restarted
    assert pod.pid("engine") == engine
    assert pod.serves()


def ids_or_none(pod: RunningPod) -> list[str]:
    try:
        return pod.model_ids()
    except (httpx.HTTPError, KeyError, ValueError):
        return []


def test_an_invalid_file_is_refused_and_the_old_configuration_keeps_serving(pod: RunningPod) -> None:
    engine, bridge = pod.pid("engine"), pod.pid("bridge")
    pod.set_remote_config("VL_ALIASES=my-alias\nVL_CTX=lots\n")
    line = wait_until(lambda: re.search(r"refused .*VL_CTX='lots'.*", pod.boot_log()), "the refusal", RELOAD_S)
    assert "keeps serving" in line[0]
    wait_until(lambda: "VL_CTX='lots'" in pod.hub_log(), "the refusal in the Hub log", HUB_BUDGET_S)
    assert (pod.pid("engine"), pod.pid("bridge")) == (engine, bridge)
    assert pod.serves() and "my-alias" in pod.model_ids()


def test_an_engine_change_restarts_vllm_with_the_new_settings(pod: RunningPod) -> None:
    engine, bridge = pod.pid("engine"), pod.pid("bridge")
    pod.set_remote_config("VL_ALIASES=my-alias\nVL_CTX=4096\n")
    asked = time.monotonic()
    wait_until(lambda: pod.pid("engine") not in (None, engine), "a new engine", RELOAD_S, every_s=0.2)
    restarted = time.monotonic()
    wait_until(pod.serves, "an answer from the new engine", ENGINE_START_S, every_s=0.5)
    pod.timings["engine change: Hub file → new vLLM (s)"] = restarted - asked
    pod.timings["engine change: new vLLM → serving (s)"] = time.monotonic() - restarted
    assert pod.engine_window() == 4096
    assert "my-alias" in pod.model_ids()
    assert pod.pid("bridge") == bridge, "the bridge learns the new model without a restart"
    # The one drain policy (runtime.pod.engines), as for a swap and a roll: drained, restarted, healthy.
    wait_until(lambda: "engine serves the new settings: drained, restarted, healthy (its settings changed)"
               in pod.boot_log(), "the change's one line", 60.0, every_s=0.2)  # fmt: skip


def test_a_hung_bridge_is_restarted_after_two_failed_checks(pod: RunningPod) -> None:
    engine, hung = pod.pid("engine"), pod.pid("bridge")
    os.kill(hung, signal.SIGSTOP)
    stopped = time.monotonic()
    wait_until(lambda: pod.pid("bridge") not in (None, hung), "a new bridge", RELOAD_S, every_s=0.2)
    wait_until(pod.serves, "an answer through the new bridge", RELOAD_S, every_s=0.2)
    pod.timings["hung bridge: SIGSTOP → serving again (s)"] = time.monotonic() - stopped
    assert "restarting bridge: 2 failed health checks in a row" in pod.boot_log()
    assert list(pod.state.glob("bridge.hung.*.log")), "the hung bridge's log is kept"
    assert pod.pid("engine") == engine


def test_killing_vllm_brings_it_back_and_tells_the_hub(pod: RunningPod) -> None:
    engine = pod.pid("engine")
    os.kill(engine, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: pod.pid("engine") not in (None, engine), "a new engine", RELOAD_S, every_s=0.2)
    wait_until(pod.serves, "an answer from the relaunched engine", ENGINE_START_S, every_s=0.5)
    pod.timings["killed vLLM: SIGKILL → serving again (s)"] = time.monotonic() - killed
    # The log publisher's commit budget (the Hub's rate limit) may hold the crash note back a minute.
    wait_until(lambda: "engine was killed by SIGKILL" in pod.hub_log(), "the crash in the Hub log", HUB_BUDGET_S)


def test_bridge_off_from_the_hub_hands_the_public_port_to_vllm(pod: RunningPod) -> None:
    engine = pod.pid("engine")
    healthy_before = pod.boot_log().count("engine is healthy")
    pod.set_remote_config("VL_ALIASES=my-alias\nVL_CTX=4096\nVL_BRIDGE=off\n")
    wait_until(lambda: pod.pid("engine") not in (None, engine), "a new engine", RELOAD_S, every_s=0.2)
    assert pod.pid("bridge") is None, "the bridge gave the public port up first"
    wait_until(pod.serves, "vLLM's own /v1/messages on the public port", ENGINE_START_S, every_s=0.5)
    assert httpx.get(f"{pod.url}/v1/models", timeout=10).status_code == 401, "vLLM checks VL_API_KEYS itself"
    listing = httpx.get(f"{pod.url}/v1/models", headers={"authorization": f"Bearer {pod.env['VL_API_KEYS']}"},
                        timeout=10).json()  # fmt: skip
    assert {m["owned_by"] for m in listing["data"]} == {"vllm"}
    assert "my-alias" in [m["id"] for m in listing["data"]]  # vLLM serves the aliases itself
    # The supervisor's probe follows vLLM to its new port, with a key: the pod turns healthy again.
    wait_until(lambda: pod.boot_log().count("engine is healthy") > healthy_before, "the new engine's healthy probe",
               ENGINE_START_S, every_s=0.5)  # fmt: skip


def test_sigterm_stops_every_process_of_the_pod(pod: RunningPod) -> None:
    before = pod.processes()
    assert {pod.pid("engine"), pod.pid("sshd")} <= {p.pid for p in before}
    pod.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    assert pod.process.wait(60) == 0
    pod.timings["SIGTERM → exit (s)"] = time.monotonic() - sent
    left = lambda: {p for p in before if alive(p)} | pod.processes()  # noqa: E731
    wait_until(lambda: not left(), "no process of the pod left (a dying one may take a moment)", 10)
