"""`python build.py --arch cpu --push` end to end: a real builder builds what was uploaded and a real registry serves it.

The test Hub's builder builds exactly the Space's committed files with the Docker engine of the image
tests (whose cache the cold cpu build filled) and pushes to Debian's `docker-registry` on loopback. Then
a second, empty engine pulls the image from that registry and runs it the way the Hub runs a Space: as
uid 1000 with SPACE_ID set, where it must serve its status page on 7860. Also: the no-op second push,
a build that fails (its log's tail, exit 1), and `--registry` straight to the registry.
Slow: marked `docker`, run in .ci/run's image step.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from space.docker_build import wheel_sources
from tests.support.docker_engine import HostPip, private_engine, remove_container
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.images import Engine, report, run_build_py, wait_for_status_page
from tests.support.net import free_port
from tests.support.registry import LocalRegistry
from tests.support.repo_copy import ROOT, copy_repo
from tests.support.runpod_server import RunPodServer
from tests.support.space_builder import SpaceBuilder

pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]

SPACE = f"{HubServer.owner}/vllm-pod-cpu"
IMAGE_NAME = "pod-owner-vllm-pod-cpu"  # the Hub's name for the Space's image: <owner>-<name>, lowercased


@pytest.fixture(scope="module")
def hub(image_engine: Engine, image_base: str, cpu_image: str, registry: LocalRegistry) -> Iterator[HubServer]:
    """A test Hub whose Docker Spaces are built by a real builder with this machine's pip sources.

    `cpu_image` first: the cold build fills the engine's cache, so the Space's build reuses its layers.
    """
    pip = HostPip.from_environ()
    with HubServer() as server, wheel_sources(pip.find_links) as sources:
        args = {"BASE_IMAGE": image_base, **sources.build_args}
        args |= {"TORCH_INDEX_URL": pip.torch_index} if pip.torch_index else {}
        server.builder = SpaceBuilder(
            image_engine[1], registry.host, build_args=args, network_mode="host", extra_hosts=sources.extra_hosts
        )
        yield server


def push(
    repo: Path, hub: HubServer, registry: LocalRegistry, *extra: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    pip = HostPip.from_environ()
    ca = ["--ca-cert", pip.ca_cert] if pip.ca_cert else []
    env = {**os.environ, **hub.env(), "HF_HOME": str(repo / ".hf-home"), **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "build.py", "--arch", "cpu", "--push", "--space-registry", registry.host, *ca, *extra],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=3000,
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree the pushes upload: a copy, so that an edit to the checkout meanwhile cannot change a push."""
    return copy_repo(tmp_path_factory.mktemp("published") / "repo")


@pytest.fixture(scope="module")
def published(
    hub: HubServer, registry: LocalRegistry, repo: Path, request: pytest.FixtureRequest
) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = push(repo, hub, registry)
    report(request, f"build.py --arch cpu --push: {time.monotonic() - started:.0f} s in all")
    for line in result.stdout.splitlines():
        if line.startswith("build.py: ") and "| " not in line:
            report(request, f"  {line}")
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    return result


def test_push_prints_the_image_the_credential_and_the_template(
    published: subprocess.CompletedProcess[str], registry: LocalRegistry
) -> None:
    out = published.stdout
    assert f"build.py: {SPACE} built and running in " in out
    assert f'"image": "{registry.host}/{IMAGE_NAME}:latest"' in out
    assert f"registry credential (user: {HubServer.owner}, password: a read token" in out
    assert f'"VL_LOG_REPO": "datasets/{HubServer.owner}/vllm-pod-logs"' in out
    assert any(line.startswith("build.py: uploaded ") and " kB, removed 0," in line for line in out.splitlines())


def test_the_space_built_the_uploaded_files_into_the_registry(
    published: subprocess.CompletedProcess[str], hub: HubServer, registry: LocalRegistry
) -> None:
    assert hub.space_stage(SPACE) == "RUNNING"
    assert "latest" in registry.tags(IMAGE_NAME)
    log = hub.space_build_log(SPACE)
    assert "Step 1/" in log and "COPY runtime/ /opt/app/runtime/" in log


def test_a_second_push_of_the_same_tree_rebuilds_nothing(
    published: subprocess.CompletedProcess[str], hub: HubServer, registry: LocalRegistry, repo: Path
) -> None:
    builds = hub.builder.builds
    again = push(repo, hub, registry)

    assert again.returncode == 0, again.stderr
    assert f"build.py: {SPACE}: unchanged, nothing pushed" in again.stdout
    assert hub.builder.builds == builds


def test_the_published_image_runs_from_the_registry_as_the_hub_runs_a_space(
    published: subprocess.CompletedProcess[str], registry: LocalRegistry, request: pytest.FixtureRequest
) -> None:
    with private_engine() as (_, client):  # empty: every layer comes from the registry
        started = time.monotonic()
        image = client.images.pull(f"{registry.host}/{IMAGE_NAME}", tag="latest")
        report(request, f"pull into an empty engine: {time.monotonic() - started:.0f} s")
        # As the Hub runs a Space: uid 1000, not root. The page answering proves the image works so
        # (a `docker exec id -u` added nothing and lost its output under load, failing one CI run).
        container = client.containers.run(
            image.id, detach=True, user="1000", network_mode="none", environment={"SPACE_ID": SPACE}
        )
        try:
            facts = wait_for_status_page(container)
            assert facts["space_id"] == SPACE and facts["prebaked"] is True
            assert facts["facts"]["target"] == "cpu"
        finally:
            remove_container(container)


def test_a_failed_build_shows_its_log_and_exits_non_zero(
    published: subprocess.CompletedProcess[str], hub: HubServer, registry: LocalRegistry, tmp_path: Path
) -> None:
    repo = copy_repo(tmp_path / "repo")
    facts = repo / "docker" / "image_facts.py"
    facts.write_text(
        facts.read_text().replace("def main(", "raise SystemExit('image facts: a forced failure')\n\n\ndef main(", 1)
    )

    result = push(repo, hub, registry, "--space", f"{HubServer.owner}/vllm-pod-broken")

    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[-1] == (
        f"build.py: {HubServer.owner}/vllm-pod-broken ended in BUILD_ERROR: the build log's tail "
        f"is above ({hub.endpoint}/spaces/{HubServer.owner}/vllm-pod-broken)"
    )
    assert any(line.startswith("  | ") and "a forced failure" in line for line in lines)
    assert "Traceback (most recent call last)" not in "\n".join(line for line in lines if not line.startswith("  | "))

    again = push(repo, hub, registry, "--space", f"{HubServer.owner}/vllm-pod-broken")  # nothing changed
    assert again.returncode == 1 and '"image"' not in again.stdout, "no template for an image never built"
    assert again.stderr.splitlines()[-1].startswith(
        f"build.py: {HubServer.owner}/vllm-pod-broken's last build ended in BUILD_ERROR and nothing changed since"
    )


def test_registry_builds_locally_and_pushes_every_layer(
    published: subprocess.CompletedProcess[str],
    image_engine: Engine,
    image_base: str,
    registry: LocalRegistry,
    repo: Path,
) -> None:
    reference = f"{registry.host}/acme/vllm-pod"
    result, _ = run_build_py(repo, image_engine[0], image_base, "--push", "--registry", reference, timeout_s=3000)

    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert f"build.py: pushed {reference}:cpu" in result.stdout
    layers = [line for line in result.stdout.splitlines() if line.startswith("  layer ")]
    assert len({line.split(":")[0] for line in layers}) >= 8  # one line per layer state, for every layer
    assert "cpu" in registry.tags("acme/vllm-pod")
    digest = registry.manifest("acme/vllm-pod", "cpu")["_digest"]
    assert digest and f'"image": "{reference}:cpu@{digest}"' in result.stdout, "the template pins what was built"
    assert f"RunPod template 'vllm-pod cpu {reference}'" in result.stdout


def test_the_whole_journey_push_runpod_template_pod_up_and_down(
    published: subprocess.CompletedProcess[str],
    hub: HubServer,
    registry: LocalRegistry,
    repo: Path,
    image_engine: Engine,
    runpod_server: RunPodServer,
    request: pytest.FixtureRequest,
) -> None:
    """What a user runs, against the stand-ins: `--push --runpod` (the image is built: it saves the template),
    then `runtime pod up`, whose pod RunPod's machine plays by running that template's image from the registry
    (its environment, RunPod's secrets substituted), then `pod down`."""
    api_key, port = f"sk-journey-{secrets.token_hex(12)}", free_port()
    containers: dict[str, Any] = {}

    def machine(pod_id: str, status: str) -> None:
        pod = runpod_server.state.pods.get(pod_id)
        if status == "PROVISIONING" and pod is not None:
            account = {"HF_TOKEN": hub.write_token, "VL_API_KEYS": api_key}  # the RunPod secrets it names
            environment = (
                {name: account.get(name, value) for name, value in pod["env"].items()}
                | hub.env(hub.write_token)
                | {
                    "RUNPOD_POD_ID": pod_id,
                    "VL_MODEL": "tiny",
                    "VL_LISTEN": "127.0.0.1",
                    "VL_PORT": str(port),
                    "VL_ENGINE_PORT": str(free_port()),
                }
            )
            # As in test_image_pod: the host's network (the test Hub is on loopback), 1 GiB of shm for vLLM.
            containers[pod_id] = image_engine[1].containers.run(
                pod["image"], detach=True, network_mode="host", environment=environment, shm_size="1g"
            )  # fmt: skip
        elif status in ("EXITED", "TERMINATED") and pod_id in containers:
            remove_container(containers.pop(pod_id))  # RunPod answers the delete; the machine goes in its time

    runpod_server.state.on_pod = machine
    env = {"RUNPOD_API_KEY": runpod_server.api_key, "RUNPOD_API_URL": runpod_server.url,
           "HF_READ_TOKEN": hub.read_token}  # fmt: skip
    started = time.monotonic()
    saved = push(repo, hub, registry, "--runpod", extra_env=env)
    report(request, f"build.py --push --runpod (built already): {time.monotonic() - started:.0f} s")
    assert saved.returncode == 0, saved.stderr[-3000:]
    (template,) = runpod_server.templates
    assert template["env"]["VL_LOG_REPO"] == f"datasets/{HubServer.owner}/vllm-pod-logs"

    pod_env = outer_environ("RUNPOD_", "ANTHROPIC_") | hub.env(hub.read_token) | env | {
        "RUNPOD_PROXY_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": api_key,
    }  # fmt: skip
    try:
        started = time.monotonic()
        up = subprocess.run(
            [sys.executable, "-m", "runtime", "pod", "up", "--template", template["name"], "--gpu", "NVIDIA L40S"],
            cwd=ROOT, env=pod_env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        report(request, f"runtime pod up → serving, the connect block printed: {time.monotonic() - started:.0f} s")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        assert any(line.startswith("  | ") and "vLLM launched" in line for line in up.stdout.splitlines())
        assert f"export ANTHROPIC_BASE_URL=http://127.0.0.1:{port}" in up.stdout
        (pod,) = runpod_server.pods
        assert pod["image"] == f"{registry.host}/{IMAGE_NAME}:latest"
        down = subprocess.run([sys.executable, "-m", "runtime", "pod", "down", pod["id"], "--yes"], cwd=ROOT,
                              env=pod_env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert down.returncode == 0, down.stderr
        assert runpod_server.pods == [] and not containers
    finally:
        for container in containers.values():
            remove_container(container)
