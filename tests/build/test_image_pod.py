"""The cpu image run the way a RunPod pod runs it: its own ENTRYPOINT and CMD (tini → `python -m runtime
start`) with a pod's environment, one container shared by every check a user makes of it.

Health, SSH with the pod's key, an unmodified Claude Code session through the bridge, the Hub log,
live reconfiguration from the Hub, then stop and start; and the same image run as a Hugging Face
Space runs it. Slow (the cpu image build, vLLM's start): marked `docker`, run as its own step of .ci/run.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from docker.models.containers import Container

from runtime.engine import tinymodel as tiny
from tests.support.claude_code import CLAUDE, TIMEOUT_S, parse_result, quiet_environment, require_claude_code
from tests.support.hub_server import POD_CONFIG_REPO, POD_LOG_REPO, HubServer
from tests.support.images import Engine, report, wait_for_status_page
from tests.support.net import free_port
from tests.support.polling import wait_for_log_line, wait_until
from tests.support.repo_copy import ROOT
from tests.support.sse_client import stream_events, text_of

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]
require_claude_code()

POD_ID = "pod-under-test"
LOG_REPO, CONFIG_REPO = POD_LOG_REPO, POD_CONFIG_REPO  # the `hub` fixture (tests/support/hub_server.py) makes them
KEY_NAME = "tester"
HEALTHY_TIMEOUT_S = 600  # ~40 s on two idle cores; the machine is shared
HUB_HEALTHY_WAIT_S = 180  # the publisher's turn, behind the Hub commit rate (72 s a commit once 10 are spent)
STATE_DIR = "/var/lib/vlpod"  # the image's VL_STATE_DIR
ENGINE_COMMAND = "runtime.engine.vllm_cli serve"


@dataclass
class Pod:
    """The running pod container, what it was given, and how a user reaches it."""

    container: Container
    url: str
    ssh_port: int
    key_file: Path
    api_key: str
    planted: dict[str, str]  # secrets given to the pod, by where they were put
    started_s: float  # container start → healthy

    def ssh(self, command: str, key_file: Path | None = None) -> subprocess.CompletedProcess[str]:
        """`ssh root@127.0.0.1 COMMAND` with the real OpenSSH client, as a user logs in to a pod."""
        known_hosts = self.key_file.parent / "known_hosts"
        argv = [
            "ssh",
            "-p",
            str(self.ssh_port),
            "-i",
            str(key_file or self.key_file),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            "ConnectTimeout=30",
            "root@127.0.0.1",
            command,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.container.logs().decode(errors="replace")

    def state_file(self, name: str) -> str:
        code, output = self.container.exec_run(["cat", f"{STATE_DIR}/{name}"])
        assert code == 0, output
        return output.decode(errors="replace")

    def engine_pid(self) -> int:
        """The PID of the vLLM server the supervisor runs (its child, `runtime.engine.vllm_cli serve`)."""
        engines = [pid for pid, command in processes(self.container) if ENGINE_COMMAND in command]
        assert len(engines) == 1, processes(self.container)
        return engines[0]


# Every process's full command line, read from /proc inside the container (`docker top` cuts them short).
LIST_PROCESSES = """
import os, pathlib
for entry in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
    if entry.parent.name == str(os.getpid()):
        continue
    try:
        print(entry.parent.name, entry.read_bytes().replace(bytes(1), b" ").replace(b"\\n", b" ").decode(errors="replace"))
    except OSError:
        pass
"""


def processes(container: Container) -> list[tuple[int, str]]:
    """(pid, command line) of every process in the container but this listing itself."""
    code, output = container.exec_run(["python", "-c", LIST_PROCESSES])
    assert code == 0, output
    return [(int(pid), command) for pid, command in (line.split(" ", 1) for line in output.decode().splitlines())]


def make_key(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pod-test", "-f", str(path)], check=True)
    return path


def wait_healthy(container: Container, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
    """Until Docker runs the image's own HEALTHCHECK to `healthy`; fails with the log if the container dies."""

    def healthy() -> bool:
        container.reload()
        state = container.attrs["State"]
        assert state["Status"] == "running", container.logs(tail=60).decode(errors="replace")
        return state["Health"]["Status"] == "healthy"

    try:
        wait_until(healthy, "the container's HEALTHCHECK to pass", timeout_s, every_s=1.0)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{container.logs(tail=60).decode(errors='replace')}") from None


@pytest.fixture(scope="module")
def pod(
    image_engine: Engine,
    cpu_image: str,
    hub: HubServer,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Pod]:
    """The image with its own entrypoint, on the host's network (ports on loopback: the test Hub is there)."""
    keys = tmp_path_factory.mktemp("ssh")
    key_file = make_key(keys / "id_ed25519")
    api_key = f"sk-pod-{secrets.token_hex(20)}"
    planted = {"HF_TOKEN": hub.write_token, "VL_API_KEYS": api_key, "VL_EXTRA_ARGS": f"hf_{secrets.token_hex(17)}"}
    port, engine_port, ssh_port = free_port(), free_port(), free_port()
    environment = {
        **hub.env(),
        "PUBLIC_KEY": (keys / "id_ed25519.pub").read_text().strip(),
        "RUNPOD_POD_ID": POD_ID,
        "VL_API_KEYS": f"{KEY_NAME}:{api_key}",
        "VL_EXTRA_ARGS": f"--hf-token {planted['VL_EXTRA_ARGS']}",  # vLLM logs its non-default arguments
        "VL_LOG_REPO": LOG_REPO,
        "VL_LOG_INTERVAL_S": "5",
        "VL_CONFIG_REPO": CONFIG_REPO,
        "VL_CONFIG_POLL_S": "5",
        "VL_LISTEN": "127.0.0.1",
        "VL_PORT": str(port),
        "VL_ENGINE_PORT": str(engine_port),
        "VL_SSH_PORT": str(ssh_port),
        "VL_SWAP": "tiny:tiny tiny2:tiny2",  # the cpu image's two demo models: a request for tiny2 swaps it in
        "VL_SWAP_MIN_S": "0",
    }
    client = image_engine[1]
    started = time.monotonic()
    # shm_size: the default 64 MiB kills vLLM's CPU engine.
    container = client.containers.run(
        cpu_image, detach=True, network_mode="host", environment=environment, shm_size="1g"
    )
    try:
        wait_healthy(container)
        seconds = time.monotonic() - started
        report(request, f"pod container start → healthy: {seconds:.0f} s")
        yield Pod(container, f"http://127.0.0.1:{port}", ssh_port, key_file, api_key, planted, seconds)
    finally:
        container.remove(force=True)


def test_the_images_healthcheck_turns_the_pod_healthy_once_it_serves_the_model(pod: Pod) -> None:
    health = pod.container.attrs["State"]["Health"]
    assert health["Status"] == "healthy" and health["Log"][-1]["ExitCode"] == 0
    assert httpx.get(f"{pod.url}/health").json() == {"status": "ok"}  # anyone: the condition alone
    assert httpx.get(f"{pod.url}/health", headers={"x-api-key": pod.api_key}).json()["model"] == tiny.SERVED_NAME
    assert "vLLM launched" in pod.log() and "Traceback" not in pod.log()


def test_ssh_logs_in_with_the_pods_key_into_the_pods_environment(pod: Pod) -> None:
    session = pod.ssh("echo model=$VL_MODEL pod=$RUNPOD_POD_ID; python -m runtime settings")
    assert session.returncode == 0, session.stderr
    lines = session.stdout.splitlines()
    assert lines[0] == f"model=tiny pod={POD_ID}"
    assert any(line.startswith("VL_MODEL='tiny'") for line in lines), session.stdout
    assert pod.api_key not in session.stdout  # the settings printout masks secrets


def test_ssh_refuses_any_other_key(pod: Pod, tmp_path: Path) -> None:
    stranger = make_key(tmp_path / "stranger")
    session = pod.ssh("true", key_file=stranger)
    assert session.returncode == 255 and "Permission denied (publickey)" in session.stderr


def claude(script: str, prompt: str, work: Path, home: Path, *options: str) -> dict:
    """The environment `runtime connect` printed, then `claude -p PROMPT` in `work` (a user's project)."""
    command = f"{script.rstrip().removesuffix('claude')}{CLAUDE} -p {prompt!r} --output-format json {' '.join(options)}"
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=work,
        env=quiet_environment(home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S * 4,
    )
    return parse_result(done)


def whole_prompts(bridge_log: str) -> list[dict[str, str]]:
    """The bridge's trace lines (as fields: `in`, `cached`, `ttft_ms`…) of the test key's Messages requests
    that carried Claude Code's whole prompt (not its short side requests)."""
    found = []
    for line in bridge_log.splitlines():
        if re.search(r"\btrace id=", line) and f"key={KEY_NAME}" in line and "POST /v1/messages" in line:
            fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
            if int(fields["in"]) + int(fields["cached"]) > 10_000:
                found.append(fields)
    return found


def test_claude_code_runs_a_session_through_the_pod(pod: Pod, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Unmodified Claude Code (full system prompt and tools), in the environment `runtime connect` prints:
    turn 1 runs a tool, turn 2 (`--continue`) is served from vLLM's prefix cache."""
    connect = subprocess.run(
        [sys.executable, "-m", "runtime", "connect", pod.url, "--key", pod.api_key],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert connect.returncode == 0, connect.stderr
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()

    first = claude(connect.stdout, f"Run the command {tiny.MARK_TOOL}", work, home, "--allowedTools", "Bash,Write")
    assert (work / "proof.txt").read_text().strip() == "tiny-model-was-here"
    assert first["result"] == tiny.AFTER_TOOL and first["num_turns"] == 2
    one = whole_prompts(pod.state_file("bridge.log"))
    second = claude(connect.stdout, f"Say hello {tiny.MARK_TEXT}", work, home, "--continue")
    assert second["result"] == tiny.ANSWER

    two = whole_prompts(pod.state_file("bridge.log"))[len(one) :]
    assert len(one) == 2 and len(two) == 1, (one, two)  # the tool call and its result; the reply
    prompt, cached = int(two[0]["in"]) + int(two[0]["cached"]), int(two[0]["cached"])
    for name, turn, result in (("turn 1", one, first), ("turn 2", two, second)):
        report(
            request,
            f"Claude Code {name}: {result['duration_ms'] / 1000:.1f} s; "
            + "; ".join(
                f"{int(t['in']) + int(t['cached'])} prompt tokens, {t['cached']} cached, TTFT {t['ttft_ms']} ms"
                for t in turn
            ),
        )
    assert cached > prompt * 0.9, two  # all but turn 2's new messages came from the prefix cache


def test_the_hub_log_shows_the_start_and_never_a_secret(pod: Pod, hub: HubServer) -> None:
    def said_healthy() -> str | None:
        published = hub.file(LOG_REPO, f"etat/{POD_ID}.log", repo_type="model")
        text = published.decode() if published is not None else ""
        return text if re.match(rf"# vllm-pod {POD_ID} · healthy since ", text) else None

    # Docker's healthcheck can say healthy before the publisher's next turn, and a boot that committed
    # its log often waits for the commit rate (one every 72 s once 10 are spent): wait for the Hub.
    text = wait_until(said_healthy, "the Hub log to say the pod is healthy", HUB_HEALTHY_WAIT_S, every_s=1.0)
    assert "vLLM launched" in text
    for received in hub.received:
        payload = received.payload()
        for where, secret in pod.planted.items():
            assert secret.encode() not in payload, f"the {where} secret reached the Hub in {received.path}"


def test_a_bridge_setting_from_the_hub_applies_in_seconds_and_a_bad_one_is_refused(pod: Pod, hub: HubServer) -> None:
    engine = pod.engine_pid()
    headers = {"authorization": f"Bearer {pod.api_key}", "anthropic-version": "2023-06-01"}
    too_big = (
        b'{"model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "' + b"x" * 1_200_000 + b'"}]}'
    )

    def status_of_a_1_mib_body() -> int:
        try:
            return httpx.post(f"{pod.url}/v1/messages", content=too_big, headers=headers, timeout=60).status_code
        except httpx.TransportError:
            return 0  # the bridge restarting

    assert status_of_a_1_mib_body() != 413
    hub.put_file(CONFIG_REPO, "pod.env", "VL_MAX_BODY_MB=1\n")
    wait_until(lambda: status_of_a_1_mib_body() == 413, "the new body limit to apply", 120, every_s=0.5)
    assert pod.engine_pid() == engine  # a bridge setting never restarts vLLM

    hub.put_file(CONFIG_REPO, "pod.env", "VL_MAX_BODY_MB=lots\n")
    wait_for_log_line(pod.log, r"refused .*VL_MAX_BODY_MB='lots'", 120)
    assert status_of_a_1_mib_body() == 413  # the previous configuration keeps serving
    small = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": f"Hi {tiny.MARK_TEXT}"}]}
    reply = httpx.post(f"{pod.url}/v1/messages", json=small, headers=headers, timeout=120)
    assert reply.status_code == 200 and reply.json()["content"][0]["text"] == tiny.ANSWER
    assert pod.engine_pid() == engine


def test_a_request_for_the_other_model_swaps_it_in_with_pings_and_is_answered_by_it(
    pod: Pod, request: pytest.FixtureRequest
) -> None:
    """VL_SWAP in the image as users run it: the swap's timeline (request → first ping → first token) reported."""
    seen: dict[str, float] = {}
    body = {"model": "tiny2", "max_tokens": 32, "messages": [{"role": "user", "content": f"Hi {tiny.MARK_TEXT}"}]}
    events = stream_events(pod.url, pod.api_key, body, HEALTHY_TIMEOUT_S, seen)
    assert text_of(events) == tiny.OTHER_ANSWER
    assert [name for name, _ in events].index("ping") < [name for name, _ in events].index("content_block_delta")
    swap = httpx.get(f"{pod.url}/health", headers={"x-api-key": pod.api_key}, timeout=10).json()["swap"]
    assert (swap["loaded"], swap["phase"], swap["last"]["from"]) == ("tiny2", "serving", "tiny")
    report(request, f"swap tiny -> tiny2 in the image: first ping {seen['ping']:.1f} s, first token "
                    f"{seen['content_block_delta']:.1f} s after the request (the pod: {swap['last']['seconds']:.0f} s)")  # fmt: skip


def host_key(pod: Pod) -> str:
    scan = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", "-p", str(pod.ssh_port), "127.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return scan.stdout.split()[-1]


def test_docker_stop_ends_every_child_cleanly_and_start_brings_the_pod_back(
    pod: Pod, request: pytest.FixtureRequest
) -> None:
    """SIGTERM from `docker stop` reaches the runtime through tini; it stops its children and exits 0,
    before Docker's 10 s would SIGKILL. `docker start` serves again, with the host keys it had."""
    key_before = host_key(pod)
    started = time.monotonic()
    pod.container.stop(timeout=10)
    stop_s = time.monotonic() - started
    pod.container.reload()
    state = pod.container.attrs["State"]
    assert (state["Status"], state["ExitCode"], state["OOMKilled"]) == ("exited", 0, False)
    assert pod.log().rstrip().endswith("stopped")  # the runtime's last word, after every child ended

    started = time.monotonic()
    pod.container.start()
    wait_healthy(pod.container)
    report(request, f"docker stop: {stop_s:.1f} s (exit 0); docker start → healthy: {time.monotonic() - started:.0f} s")
    assert host_key(pod) == key_before  # kept with the container's disk; a new container makes new ones
    assert pod.ssh("true").returncode == 0


def test_as_a_space_the_image_serves_its_status_page_as_uid_1000_and_no_engine(
    image_engine: Engine, cpu_image: str
) -> None:
    container = image_engine[1].containers.run(
        cpu_image, detach=True, user="1000", network_mode="none", environment={"SPACE_ID": "pod-owner/vllm-pod-cpu"}
    )
    try:
        facts = wait_for_status_page(container)
        assert facts["space_id"] == "pod-owner/vllm-pod-cpu" and facts["prebaked"] is True
        running = [command for _, command in processes(container)]
        assert any("runtime start" in command for command in running), running  # the listing works
        assert not [c for c in running if "vllm" in c or "runtime bridge" in c or "sshd" in c], running
        assert container.exec_run(["id", "-u"]).output.decode().strip() == "1000"
    finally:
        container.remove(force=True)
