"""A real OCI registry on loopback: Debian's `docker-registry` (the reference `distribution` registry).

Its config and storage live in one temporary folder, removed when it stops. It listens on 127.0.0.1 and a
free port over plain HTTP, without auth: Docker engines allow insecure registries on 127.0.0.0/8, so they
push to and pull from `registry.host` as they would from any registry. The `registry` fixture (one per
session, registered in tests/conftest.py) is where Space builds push (space_builder.py).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.docker_engine import system_tool
from tests.support.net import free_port

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json"
)


class RegistryError(RuntimeError):
    """The registry did not start or answered an error; the message has its log's tail."""


class LocalRegistry:
    """One `docker-registry serve` with its own folder (config, storage, log); `start()` then `stop()`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="vllm-pod-registry-"))
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """`127.0.0.1:PORT`: what image references start with (`<host>/<name>:<tag>`)."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def config(self) -> str:
        """The registry's YAML config: filesystem storage in our folder, deletes allowed, no auth."""
        return (
            f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            f"  delete:\n    enabled: true\nhttp:\n  addr: {self.host}\n"
        )

    def start(self) -> LocalRegistry:
        config = self.root / "config.yml"
        config.write_text(self.config())
        with (self.root / "registry.log").open("wb") as log:
            self.process = subprocess.Popen(
                [system_tool("docker-registry", "docker-registry"), "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.wait_until_answering()
        return self

    def wait_until_answering(self) -> None:
        """Until `GET /v2/` answers 200; polling: the registry offers no readiness signal."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RegistryError(f"docker-registry exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/v2/", timeout=2, trust_env=False).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RegistryError(f"docker-registry did not answer within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join((self.root / "registry.log").read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the registry we started, then remove its folder (storage included)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    # --- reading it through the registry HTTP API ---

    def get(self, path: str, **headers: str) -> httpx.Response:
        answer = httpx.get(f"{self.url}/v2/{path}", headers=headers, timeout=30, trust_env=False)
        if answer.status_code != 200:
            raise RegistryError(f"GET /v2/{path}: HTTP {answer.status_code}: {answer.text[:500]}")
        return answer

    def catalog(self) -> list[str]:
        """The repositories it holds (`/v2/_catalog`)."""
        return self.get("_catalog?n=1000").json().get("repositories") or []

    def tags(self, name: str) -> list[str]:
        """A repository's tags (`/v2/<name>/tags/list`); [] when it has none or does not exist."""
        if name not in self.catalog():
            return []
        return self.get(f"{name}/tags/list").json().get("tags") or []

    def manifest(self, name: str, reference: str = "latest") -> dict:
        """A manifest (by tag or digest) as stored, OCI or Docker v2, with its digest under `_digest`."""
        answer = self.get(f"{name}/manifests/{reference}", accept=MANIFEST_TYPES)
        return {**answer.json(), "_digest": answer.headers.get("docker-content-digest")}


@contextmanager
def local_registry() -> Iterator[LocalRegistry]:
    registry = LocalRegistry()
    try:
        yield registry.start()
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def registry() -> Iterator[LocalRegistry]:
    """A real OCI registry for the session, at `registry.host` (127.0.0.1:PORT, plain HTTP, no auth)."""
    with local_registry() as running:
        yield running
