"""Warm restarts: `python -m runtime start` twice on one volume, as a RunPod pod stopped and started again
(a new container disk, the same volume). Real vLLM serves the tiny model, which the test Hub serves as a
real model repo: the first start downloads it through huggingface_hub, with progress in the boot log; the
second asks the Hub nothing at all, and vLLM runs offline with every cache on the volume.

The measured times are printed (`-s`): the report's numbers, never asserted on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runtime.engine.tinymodel import ANSWER, MARK_TEXT, write_tiny_model
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.sdk import anthropic

pytestmark = pytest.mark.vllm  # `runtime start` twice, each with its vLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
REPO = f"{HubServer.owner}/tiny-weights"
ENGINE_START_S = 600.0  # ~30 s alone; far more while other tests share the two cores
API_KEY = "sk-volume-test-0123456789"


@dataclass
class Pod:
    process: subprocess.Popen
    port: int
    start_s: float  # from launch to the engine's first healthy probe


def start_pod(hub: HubServer, volume: Path, disk: Path) -> Pod:
    """A pod on `volume` with a fresh container disk (`disk`), once healthy."""
    disk.mkdir()
    (disk / "image_prebaked").write_text('{"target": "cpu"}\n')
    outer = outer_environ("PUBLIC_KEY")
    env = outer | hub.env(hub.read_token) | {
        "VL_MODEL": "tiny", "VL_REPO": REPO, "VL_VOLUME": str(volume), "VL_CACHE_DIR": str(volume / "vllm-pod-cache"),
        "VL_STATE_DIR": str(disk / "state"), "VL_VENV": sys.prefix, "VL_PREBAKED_MARKER": str(disk / "image_prebaked"),
        "VL_LISTEN": "127.0.0.1", "VL_PORT": str(free_port()), "VL_ENGINE_PORT": str(free_port()), "VL_SSH": "off",
        "VL_API_KEYS": API_KEY,
    }  # fmt: skip
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    wait_until(lambda: "engine is healthy" in boot_log(disk) or process.poll() is not None, "the engine's first healthy probe",
               ENGINE_START_S, every_s=0.5)  # fmt: skip
    assert process.poll() is None, boot_log(disk)
    return Pod(process, int(env["VL_PORT"]), time.monotonic() - started)


def boot_log(disk: Path) -> str:
    path = disk / "state" / "boot.log"
    return path.read_text() if path.exists() else ""


def engine_environ(disk: Path) -> dict[str, str]:
    pid = (disk / "state" / "engine.pid").read_text().strip()
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(pair.decode().split("=", 1) for pair in pairs if b"=" in pair)


def answers(pod: Pod) -> str:
    client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{pod.port}", api_key=API_KEY, max_retries=0, timeout=60)
    message = client.messages.create(
        model="claude-tiny", max_tokens=64, messages=[{"role": "user", "content": MARK_TEXT}]
    )
    return "".join(block.text for block in message.content if block.type == "text")


def stop(pod: Pod) -> None:
    pod.process.send_signal(signal.SIGTERM)
    try:
        assert pod.process.wait(60) == 0
    finally:
        if pod.process.poll() is None:
            pod.process.kill()


@pytest.fixture()
def hub(tmp_path: Path) -> Iterator[HubServer]:
    write_tiny_model(tmp_path / "model")
    with HubServer() as server:
        server.create_repo(REPO)
        server.put_folder(REPO, tmp_path / "model")
        yield server


def test_a_restart_on_the_same_volume_downloads_nothing_and_asks_the_hub_nothing(
    hub: HubServer, tmp_path: Path
) -> None:
    volume = tmp_path / "workspace"
    first = start_pod(hub, volume, tmp_path / "disk1")
    try:
        log = boot_log(tmp_path / "disk1")
        assert f"downloading {REPO} (revision " in log and f"downloaded {REPO}: 1.9 MB" in log, log
        assert any(r.path.startswith("/lfs-objects/") for r in hub.received)
        engine = engine_environ(tmp_path / "disk1")
        assert engine["HF_HUB_OFFLINE"] == "1"
        for name in ("HF_HUB_CACHE", "HF_XET_CACHE", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR",
                     "FLASHINFER_WORKSPACE_BASE"):  # fmt: skip
            assert engine[name].startswith(str(volume / "vllm-pod-cache") + "/"), (name, engine[name])
        assert answers(first) == ANSWER
    finally:
        stop(first)
    asked = len(hub.received)
    second = start_pod(hub, volume, tmp_path / "disk2")  # a stopped pod: new container disk, same volume
    try:
        assert f"weights of {REPO}: complete in" in boot_log(tmp_path / "disk2")
        assert "downloading" not in boot_log(tmp_path / "disk2")
        assert answers(second) == ANSWER
        assert hub.received[asked:] == [], [r.path for r in hub.received[asked:]]  # not one request to the Hub
    finally:
        stop(second)
    print(
        f"\nstart → healthy: first start (downloads) {first.start_s:.1f} s; restart on the same volume {second.start_s:.1f} s"
    )
