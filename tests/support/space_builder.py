"""A real builder for the test Hub's Docker Spaces: a Docker engine builds exactly a commit's files and pushes
the image to a registry, as the Hub builds a Space and serves it from registry.hf.space.

The build context is a tar of the commit's files (the Space's root, its `Dockerfile` at the top), made as
build.py makes its own (space.context: the same files give the same cache keys), sent to the engine's
classic build API; every output line goes to the Space's build log as it comes, then the push's.
The image is `<registry>/<owner>-<name>:latest`, lowercased, as the Hub names it. Builds run one at a time,
in commit order, on one worker thread. A newer commit supersedes a build: a queued one is skipped, a running
one is not interrupted but pushes nothing and no longer decides the stage (the newer commit builds next).
All that the build environment needs comes through the constructor: nothing is read from the machine.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import docker

from space.context import context_tar
from tests.support.hub_spaces import Build

BUILD_TIMEOUT_S = 3600


class LineBuffer:
    """Cuts streamed text into whole lines for the log (the engine's chunks may split or join lines)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.pending = say, ""

    def feed(self, text: str) -> None:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.say(line + "\n")

    def flush(self) -> None:
        if self.pending:
            self.say(self.pending + "\n")
            self.pending = ""


def build_output(chunk: dict) -> str:
    """The text of one chunk of the classic builder's output (`stream`, or `status` while pulling)."""
    if "stream" in chunk:
        return chunk["stream"]
    return f"{chunk['status']}\n" if "status" in chunk else ""


def push_output(chunk: dict) -> str:
    """One push event as a line; byte-count progress updates are left out (a layer says Pushing, then Pushed)."""
    if "status" not in chunk or "progress" in chunk:
        return ""
    return f"{chunk['id']}: {chunk['status']}\n" if chunk.get("id") else f"{chunk['status']}\n"


class SpaceBuilder:
    """Builds the test Hub's Docker Spaces with a real engine into a real registry: `hub.builder = SpaceBuilder(...)`.

    `client`: a docker.DockerClient; `registry`: `host:port` to push to; `build_args`: what this machine's
    builds need (they override the Space's variables, which the Hub passes as build args); `network_mode` and
    `extra_hosts`: for the build's RUN steps. `builds` counts the builds started.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        registry: str,
        build_args: Mapping[str, str] | None = None,
        network_mode: str | None = None,
        extra_hosts: Mapping[str, str] | None = None,
        timeout_s: float = BUILD_TIMEOUT_S,
    ) -> None:
        self.client, self.registry = client, registry
        self.build_args, self.network_mode, self.extra_hosts = dict(build_args or {}), network_mode, extra_hosts
        self.timeout_s = timeout_s
        self.builds = 0
        self._queue: queue.Queue[Build | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="space-builder", daemon=True)
        self._worker.start()

    def submit(self, build: Build) -> None:
        """Queue a commit's build (the test Hub calls this as the commit lands); it runs after those before it."""
        self._queue.put(build)

    def close(self) -> None:
        """Stop after the queued builds (the worker is a daemon: a builder never closed dies with the tests)."""
        self._queue.put(None)
        self._worker.join(self.timeout_s)

    def __enter__(self) -> SpaceBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _work(self) -> None:
        while (build := self._queue.get()) is not None:
            if build.current():
                self.builds += 1
                self.run(build)

    def run(self, build: Build) -> None:
        """Build, then push; whatever fails (the Dockerfile, the engine, the registry) is the build's error."""
        reference = f"{self.registry}/{build.image}"
        started = time.monotonic()
        try:
            if self.build_image(build, reference) and build.current() and self.push_image(build, reference):
                build.say(f"Pushed {reference}:latest in {time.monotonic() - started:.0f} s")
                build.succeeded()
        except Exception as error:
            build.failed(f"{type(error).__name__}: {error}")

    def build_image(self, build: Build, reference: str) -> bool:
        build.say(f"Building {reference}:latest from commit {build.revision[:7]} ({len(build.files)} files)")
        output = self.client.api.build(
            fileobj=context_tar(build.files),
            custom_context=True,
            tag=f"{reference}:latest",
            buildargs={**build.variables, **self.build_args},
            network_mode=self.network_mode,
            extra_hosts=dict(self.extra_hosts) if self.extra_hosts else None,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
            use_config_proxy=False,
            timeout=self.timeout_s,
        )
        return relay(build, output, build_output)

    def push_image(self, build: Build, reference: str) -> bool:
        build.say(f"Pushing {reference}:latest")
        # An explicit (empty) credential: the client's own config file is not consulted.
        output = self.client.api.push(reference, tag="latest", stream=True, decode=True, auth_config={})
        return relay(build, output, push_output)


def relay(build: Build, chunks: Iterable[dict], text: Callable[[dict], str]) -> bool:
    """Streams the engine's answer into the build log; at its first error, the build fails (False)."""
    lines = LineBuffer(build.say)
    for chunk in chunks:
        if "error" in chunk:
            lines.flush()
            build.failed(chunk["error"].strip())
            return False
        lines.feed(text(chunk))
    lines.flush()
    return True
