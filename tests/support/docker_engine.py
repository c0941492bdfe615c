"""A Docker engine and a base image for the image test and `scripts/demo`, on any machine with apt.

Either the machine's engine (DOCKER_HOST or the default socket) or a private `dockerd` whose data
root, exec root, pidfile and socket live under one temporary folder. Where no registry can be
reached, the Debian base image is made with debootstrap and `docker import` (DESIGN §8), from the
mirror this machine's apt uses for that release.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.models.containers import Container

from space.pip_index import configured_index
from tests.support.repo_copy import ROOT

DEFAULT_BRIDGE = Path("/sys/class/net/docker0")
CACHE_DIR = ROOT / ".cache" / "docker-base"  # gitignored: the debootstrap tarball survives between runs
DEBIAN_SUITE = "bookworm"
APT_SOURCES = Path("/etc/apt")  # sources.list and sources.list.d/*.list, *.sources (deb822)
ONE_LINE_SOURCE = re.compile(r"^deb\s+(?:\[[^\]]*\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)", re.MULTILINE)
IMPORTED_BASE = f"vllm-pod-base/debian:{DEBIAN_SUITE}"
START_TIMEOUT_S = 90
STOP_TIMEOUT_S = 60


class EngineError(RuntimeError):
    """The engine or the base image could not be had; the message says why, with the log's tail."""


def answering_client(timeout: int = 10) -> docker.DockerClient | None:
    """A client of the machine's engine (DOCKER_HOST or the default socket) if one answers."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except DockerException:
        return None


class PrivateEngine:
    """A `dockerd` of our own, everything under one temporary folder, stopped and removed by `stop()`.

    bridge=False runs without a network bridge or iptables rules (nothing to collide with another
    engine; builds then use the host's network); bridge=True adds one, for `docker run -p`.
    """

    def __init__(self, bridge: bool = False) -> None:
        # Short: unix socket paths (containerd's live under the exec root) are limited to 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="vllm-pod-dockerd-"))
        self.socket = self.root / "docker.sock"
        self.log_path = self.root / "dockerd.log"
        self.bridge = bridge
        self.creates_bridge = bridge and not DEFAULT_BRIDGE.exists()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def build_options(self) -> list[str]:
        """build.py options for this engine: it sets no iptables rules, hence no NAT for a build's network."""
        return ["--network", "host"]

    def command(self) -> list[str]:
        # Never a system containerd's namespace; containerd allows letters and digits joined by single . _ -
        namespace = "vllm-pod-" + re.sub(r"[^A-Za-z0-9]", "", self.root.name)
        network = [] if self.bridge else ["--bridge=none"]
        return [
            system_tool("dockerd", "docker.io"),
            "--data-root",
            str(self.root / "data"),
            "--exec-root",
            str(self.root / "exec"),
            "--pidfile",
            str(self.root / "dockerd.pid"),
            "--host",
            self.docker_host,
            "--containerd-namespace",
            namespace,
            "--containerd-plugins-namespace",
            f"{namespace}-plugins",
            "--iptables=false",
            "--ip6tables=false",
            *network,
        ]

    def start(self) -> docker.DockerClient:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EngineError(f"dockerd exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.socket.exists():
                try:
                    client = docker.DockerClient(base_url=self.docker_host, version="auto", timeout=600)
                    client.ping()
                    return client
                except DockerException:
                    pass
            time.sleep(0.2)  # polling the socket: dockerd offers no readiness signal
        raise EngineError(f"dockerd did not answer within {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop dockerd (and the containerd it started), then remove its folder."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_TIMEOUT_S)
        if self.process:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)  # the group we started: dockerd's containerd
            self.process.wait()
        unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.creates_bridge:  # dockerd leaves the docker0 it made behind
            subprocess.run(["ip", "link", "delete", DEFAULT_BRIDGE.name], check=False, capture_output=True)


def stop_left_engine(root: Path) -> None:
    """Stop a private dockerd that was left running (`scripts/demo --keep`) by its pidfile, then remove
    its folder: what `PrivateEngine.stop` does for an engine this process still holds."""
    pidfile = root / "dockerd.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)  # polling: not our child, nothing to wait on
            os.killpg(pid, signal.SIGKILL)  # its session: dockerd's containerd
    unmount_under(root)
    shutil.rmtree(root, ignore_errors=True)


def system_tool(name: str, package: str) -> str:
    """The path of an administrator's tool, also where root's PATH would find it (/usr/sbin)."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if not path:
        raise EngineError(f"{name} is not installed: apt-get install {package} (scripts/setup does)")
    return path


def unmount_under(root: Path) -> None:
    """Detach what a killed dockerd left mounted under root (overlay layers, netns), deepest first."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)


@contextmanager
def private_engine(bridge: bool = False) -> Iterator[tuple[PrivateEngine, docker.DockerClient]]:
    engine = PrivateEngine(bridge=bridge)
    try:
        client = engine.start()
        try:
            yield engine, client
        finally:
            client.close()
    finally:
        engine.stop()


# --- the base image -----------------------------------------------------------------------------


def debootstrap_tarball(cache_dir: Path = CACHE_DIR) -> Path:
    """A minimal Debian root filesystem as a tar, made once with debootstrap (~25 s) and cached."""
    tarball = cache_dir / f"debian-{DEBIAN_SUITE}-minbase.tar"
    if tarball.exists():
        return tarball
    debootstrap = system_tool("debootstrap", "debootstrap")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-pod-rootfs-") as work:
        rootfs = Path(work) / "rootfs"
        run([debootstrap, "--variant=minbase", DEBIAN_SUITE, str(rootfs), debian_mirror()])
        # Like Debian's official images: no package lists or downloaded packages in the base.
        for leftover in ("var/lib/apt/lists", "var/cache/apt"):
            for path in (rootfs / leftover).glob("*"):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        partial = tarball.with_suffix(".partial")
        run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."])
        partial.rename(tarball)
    return tarball


def debian_mirror(apt: Path = APT_SOURCES, suite: str = DEBIAN_SUITE) -> str:
    """The first mirror this machine's apt fetches `suite` from (one-line and deb822 sources alike)."""
    for path in [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]:
        for source in ONE_LINE_SOURCE.finditer(path.read_text() if path.is_file() else ""):
            if source["suite"] == suite:
                return source["uri"]
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(deb822_fields(stanza))
            if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
                return fields["uris"].split()[0]
    raise EngineError(f"no apt source for Debian {suite} under {apt}: debootstrap needs one to make the base image")


def deb822_fields(stanza: str) -> Iterator[tuple[str, str]]:
    """The fields of a deb822 stanza (Types, URIs, Suites...) on their first line, names lowercased."""
    for line in stanza.splitlines():
        name, colon, value = line.partition(":")
        if colon and not line.startswith(("#", " ", "\t")):
            yield name.strip().lower(), value.strip()


def import_debian_base(client: docker.DockerClient, cache_dir: Path = CACHE_DIR) -> str:
    """The debootstrap base imported into the engine (once per engine); returns its tag."""
    if not client.images.list(name=IMPORTED_BASE):
        repository, tag = IMPORTED_BASE.rsplit(":", 1)
        client.api.import_image_from_file(str(debootstrap_tarball(cache_dir)), repository=repository, tag=tag)
    return IMPORTED_BASE


def pulled(client: docker.DockerClient, image: str) -> bool:
    """Whether the registry's image could be pulled (no registry answers on some machines)."""
    repository, tag = image.rsplit(":", 1)
    try:
        client.images.pull(repository, tag=tag)
        return True
    except DockerException:
        return False


def run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise EngineError(f"{command[0]} failed ({result.returncode}):\n{tail}")


# --- what the build needs from this machine ------------------------------------------------------


@dataclass(frozen=True)
class HostPip:
    """The sources this machine's pip uses: wheel locations no index serves here (torch's +cpu build),
    the index torch then comes from (pip's configured one), and a TLS-intercepting proxy's CA (PIP_CERT)."""

    find_links: tuple[str, ...]
    torch_index: str | None
    ca_cert: str | None

    @classmethod
    def from_environ(cls) -> HostPip:
        """From this process's environment, the one pip reads its configured index in too."""
        links = tuple(link.removeprefix("file://") for link in os.environ.get("PIP_FIND_LINKS", "").split())
        # With find-links, torch comes from the machine's index plus those locations instead of PyTorch's
        # index, which such a machine may not reach.
        index = configured_index() if links else None
        return cls(links, index, os.environ.get("PIP_CERT") or None)


def host_pip_build_options() -> list[str]:
    """build.py options that give the build the sources this machine's pip uses (HostPip)."""
    pip = HostPip.from_environ()
    options = [option for link in pip.find_links for option in ("--find-links", link)]
    if pip.torch_index:
        options += ["--build-arg", f"TORCH_INDEX_URL={pip.torch_index}"]
    if pip.ca_cert:
        options += ["--ca-cert", pip.ca_cert]
    return options


def remove_container(container: Container, tries: int = 5) -> None:
    """Force-remove `container`. A loaded Docker engine may answer "Could not kill running container …, tried to kill
    container, but did not receive an exit event" (its kill went out; the exit came later than it waited for): wait
    for that exit, then ask again."""
    for attempt in range(tries):
        try:
            container.remove(force=True)
            return
        except NotFound:
            return
        except APIError:
            if attempt == tries - 1:
                raise
            with suppress(DockerException, OSError):
                container.wait(timeout=30)
