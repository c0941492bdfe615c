"""Building and pushing an image with a Docker daemon, through the Docker SDK's classic build API.

`build` sends the context tar and streams the daemon's output; a local `--find-links` directory is
served to the build on loopback. `push` sends the image to any OCI registry with a line per layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import os
import random
import subprocess
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from space import BuildError
from space.context import DOCKERFILE, context_tar
from space.targets import ROOT

WHEELS_PORT = 8765  # of a --find-links directory served to the build (see served_directory)


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How to build (--build-arg, --find-links, --network), whatever the image is tagged."""

    build_args: dict[str, str]
    find_links: tuple[str, ...]
    network: str | None


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class WheelServer:
    """A local wheel directory served to the build: pip reads `url`, the build resolves `name` to `address`."""

    name: str
    address: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.name}:{self.port}/"


@contextlib.contextmanager
def served_directory(directory: Path, name: str) -> Iterator[WheelServer]:
    """Serve a wheel directory on a loopback address while the build runs.

    The URL (a fixed name and port) is the same on every run, so PIP_FIND_LINKS and every cached layer
    above it stay valid; the name resolves (the build's extra hosts) to a random address of 127/8.
    """
    handler = functools.partial(QuietHandler, directory=str(directory))
    for _ in range(8):
        address = f"127.{random.randrange(1, 255)}.{random.randrange(256)}.{random.randrange(1, 255)}"
        with contextlib.suppress(OSError):
            server = http.server.ThreadingHTTPServer((address, WHEELS_PORT), handler)
            break
    else:  # no 127/8 beyond 127.0.0.1 (not Linux): any port, at the cost of the layer cache
        address = "127.0.0.1"
        server = http.server.ThreadingHTTPServer((address, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield WheelServer(name, address, server.server_port)
    finally:
        server.shutdown()
        server.server_close()


@dataclasses.dataclass(frozen=True)
class WheelSources:
    """What pip in the build needs for `--find-links` locations: build arguments and host names."""

    build_args: dict[str, str]
    extra_hosts: dict[str, str]


@contextlib.contextmanager
def wheel_sources(find_links: tuple[str, ...]) -> Iterator[WheelSources]:
    """Serve the local directories among `find_links` while the block runs; URLs pass through as they are."""
    local = [location for location in find_links if Path(location).is_dir()]
    with contextlib.ExitStack() as stack:
        served = {
            location: stack.enter_context(served_directory(Path(location), f"vllm-pod-wheels-{index}"))
            for index, location in enumerate(local)
        }
        links = [served[location].url if location in served else location for location in find_links]
        hosts = {server.name: server.address for server in served.values()}
        args = {"PIP_FIND_LINKS": " ".join(links)} if links else {}
        args |= {"PIP_TRUSTED_HOST": " ".join(hosts)} if hosts else {}  # plain http on loopback: no TLS to check
        yield WheelSources(args, hosts)


def git_revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        revision = git("rev-parse", "HEAD")
        return revision + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def default_build_args() -> dict[str, str]:
    return {"GIT_REVISION": git_revision(), "BUILD_DATE": datetime.now(UTC).isoformat(timespec="seconds")}


def docker_client() -> Any:
    import docker
    from docker.errors import DockerException

    try:
        return docker.from_env(timeout=600)
    except DockerException:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise BuildError(f"no Docker engine answers at {host}: start one (dockerd) or set DOCKER_HOST") from None


def stream_build(
    client: Any, files: Mapping[str, bytes], tag: str, options: BuildOptions, sources: WheelSources
) -> str:
    """Run the build through the classic build API, printing its progress; returns the image id."""
    from docker.errors import APIError

    image_id = ""
    try:
        for chunk in client.api.build(
            fileobj=context_tar(files),
            custom_context=True,
            dockerfile=DOCKERFILE,
            tag=tag,
            buildargs=default_build_args() | sources.build_args | options.build_args,
            network_mode=options.network,
            extra_hosts=sources.extra_hosts or None,
            rm=True,
            forcerm=True,
            decode=True,
        ):
            if "stream" in chunk:
                print(chunk["stream"], end="", flush=True)
            elif "status" in chunk:
                print(chunk["status"], flush=True)
            elif "error" in chunk:
                raise BuildError(f"the build of {tag} failed: {chunk['error'].strip()}")
            image_id = chunk.get("aux", {}).get("ID", image_id)
    except APIError as error:
        raise BuildError(f"the Docker engine refused the build: {error.explanation}") from None
    return image_id


def build(files: Mapping[str, bytes], tag: str, options: BuildOptions) -> str:
    """Build the context `files` into `tag` with the local Docker daemon; returns the image id."""
    if any(Path(location).is_dir() for location in options.find_links):
        if options.network not in (None, "host"):
            raise BuildError(
                f"--find-links directories are served on loopback, which --network {options.network} hides"
            )
        options = dataclasses.replace(options, network="host")  # loopback is reachable only on the host's network
    client = docker_client()
    with wheel_sources(options.find_links) as sources:
        image_id = stream_build(client, files, tag, options, sources)
    size = client.api.inspect_image(image_id)["Size"]
    print(f"build.py: built {tag} ({image_id.removeprefix('sha256:')[:12]}, {size / 1e9:.2f} GB)")
    return image_id


def push(reference: str) -> str | None:
    """Push a local image to its registry, printing a line per layer as each one changes state; returns
    the digest the registry gave the manifest (what an immutable reference pins)."""
    from docker.errors import APIError
    from docker.utils import parse_repository_tag

    repository, tag = parse_repository_tag(reference)
    client = docker_client()
    layers: dict[str, str] = {}
    digest = None
    try:
        for chunk in client.api.push(repository, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise BuildError(f"the push of {reference} failed: {chunk['error'].strip()}")
            digest = (chunk.get("aux") or {}).get("Digest") or digest  # the push's last word: Tag, Digest, Size
            if print_layer_progress(chunk, layers):
                continue
            if "status" in chunk and "id" not in chunk:
                print(f"build.py: {chunk['status']}", flush=True)
    except APIError as error:
        raise BuildError(f"the Docker engine refused the push of {reference}: {error.explanation}") from None
    return digest


def print_layer_progress(chunk: Mapping[str, Any], layers: dict[str, str]) -> bool:
    """One line when a layer's state changes (Preparing, Pushing 40%, Pushed, Layer already exists)."""
    layer, status = chunk.get("id"), chunk.get("status", "")
    if not layer or not status:
        return False
    detail = chunk.get("progressDetail") or {}
    if detail.get("total"):
        status = f"{status} {int(100 * detail.get('current', 0) / detail['total']) // 20 * 20}%"
    if layers.get(layer) != status:
        layers[layer] = status
        print(f"  layer {layer}: {status}", flush=True)
    return True
