"""One Docker engine, base image and cold cpu build for every image test of a session (a pytest plugin).

The image build test, the publishing tests and the Space builder share them, so the layer cache of
the first cpu build serves every later one (a cold build takes minutes; a cached one seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from tests.support.docker_engine import PrivateEngine, host_pip_build_options, import_debian_base, private_engine
from tests.support.repo_copy import ROOT

CPU_TAG = "vllm-pod-test:cpu"
STATUS_TIMEOUT_S = 120
Engine = tuple[PrivateEngine, docker.DockerClient]


def report(request: pytest.FixtureRequest, line: str) -> None:
    """A measurement on the terminal, even without -s: the closing notes quote them."""
    plugins = request.config.pluginmanager
    with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
        plugins.get_plugin("terminalreporter").write_line(f"[image] {line}")


def build_cpu(repo: Path, engine: PrivateEngine, base: str, tag: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`build.py --arch cpu --build` as a user on this machine runs it; returns its result and duration."""
    return run_build_py(repo, engine, base, "--build", "--tag", tag)


def run_build_py(
    repo: Path, engine: PrivateEngine, base: str, *action: str, timeout_s: float = 1800
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`build.py --arch cpu ACTION…` on `engine`, from the base image `base`; its result and duration."""
    options = ["--build-arg", f"BASE_IMAGE={base}", *engine.build_options, *host_pip_build_options()]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "build.py", "--arch", "cpu", *action, *options],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "DOCKER_HOST": engine.docker_host},
    )
    return result, time.monotonic() - started


def expect_built(result: subprocess.CompletedProcess[str]) -> None:
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
    assert result.returncode == 0, tail


@pytest.fixture(scope="session")
def image_engine() -> Iterator[Engine]:
    with private_engine() as running:
        yield running


@pytest.fixture(scope="session")
def image_base(image_engine: Engine, request: pytest.FixtureRequest) -> str:
    started = time.monotonic()
    tag = import_debian_base(image_engine[1])
    report(request, f"base image {tag} ready in {time.monotonic() - started:.0f} s (debootstrap, cached between runs)")
    return tag


@pytest.fixture(scope="session")
def cold_build(
    image_engine: Engine, image_base: str, request: pytest.FixtureRequest
) -> subprocess.CompletedProcess[str]:
    result, seconds = build_cpu(ROOT, image_engine[0], image_base, CPU_TAG)
    expect_built(result)
    size = image_engine[1].images.get(CPU_TAG).attrs["Size"]
    report(request, f"cold build of {CPU_TAG}: {seconds:.0f} s, image {size / 1e9:.2f} GB")
    for entry in image_engine[1].api.history(CPU_TAG):
        if entry["Size"]:
            report(request, f"  {entry['Size'] / 1e6:10.3f} MB  {entry['CreatedBy'][:110]}")
    return result


@pytest.fixture(scope="session")
def cpu_image(cold_build: subprocess.CompletedProcess[str]) -> str:
    return CPU_TAG


def wait_for_status_page(container: Container) -> dict:
    """The Space status page's facts once it answers on 7860 (read from inside: the container may have no network)."""
    probe = [
        "python",
        "-c",
        "import urllib.request as r; print(r.urlopen('http://127.0.0.1:7860/facts', timeout=5).read().decode())",
    ]
    deadline = time.monotonic() + STATUS_TIMEOUT_S
    while time.monotonic() < deadline:
        container.reload()
        assert container.status == "running", container.logs(tail=30).decode(errors="replace")
        code, output = container.exec_run(probe)
        if code == 0:
            assert (
                container.exec_run(
                    ["python", "-c", "import urllib.request as r; r.urlopen('http://127.0.0.1:7860/', timeout=5)"]
                ).exit_code
                == 0
            )
            return json.loads(output.decode())
        time.sleep(0.5)  # polling: the status page offers nothing else to wait on from outside
    pytest.fail(f"no status page after {STATUS_TIMEOUT_S} s:\n{container.logs(tail=30).decode(errors='replace')}")
