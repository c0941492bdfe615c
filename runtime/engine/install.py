"""Prebaked or not: with the image's marker, install nothing; without it, put the pinned runtime and
engine in VL_VENV.

A prebaked image starts vLLM seconds after the container (the seeds' image: ~15 s, against ~8 min when
the bootstrap installed vLLM at every start). On a stock image (a plain Python or CUDA base with the
checkout copied in) `runtime start` installs the runtime's own dependencies with the base's python and
re-executes itself in VL_VENV, which installs the engine; both from docker/versions.toml (the image's
own layers), logging pip's progress; the next start finds them and installs nothing.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from runtime.packages import ImagePackages, PackagesError, image_packages, runtime_pins
from runtime.settings import Settings

log = logging.getLogger(__name__)

# runtime.gpu's verdict → the kind of image whose engine this world needs (docker/versions.toml).
IMAGE_KIND = {"cuda": "gpu", "cpu": "cpu"}
# Run by the venv's python with the pins as arguments: prints those it lacks or has at another version.
MISSING_PINS = """
import importlib.metadata as metadata, sys
for pin in sys.argv[1:]:
    name, _, version = pin.partition("==")
    try:
        found = metadata.version(name)
    except metadata.PackageNotFoundError:
        found = None
    if found != version:
        print(pin)
"""
T = TypeVar("T")


class InstallError(RuntimeError):
    """The runtime or the engine could not be installed; `str()` is one line saying why."""


def is_prebaked(settings: Settings) -> bool:
    return Path(settings.prebaked_marker).exists()


def runs_in_venv(settings: Settings) -> bool:
    """Whether this process is VL_VENV's python (a stock image's first process is the base's)."""
    return Path(sys.prefix).resolve() == Path(settings.venv).resolve()


def ensure_runtime(
    settings: Settings, environ: Mapping[str, str] | None = None, pins: Sequence[str] | None = None
) -> None:
    """Creates VL_VENV and installs the runtime's pinned dependencies it lacks (a stock image's python has
    none of them). `pins` defaults to docker/versions.toml's `[runtime]`. Raises InstallError."""
    pins = tuple(pins or _from_table(runtime_pins))
    python = _venv_python(settings, environ)
    missing = _missing_pins(python, pins, environ)
    if not missing:
        log.info("runtime already installed: %s", " ".join(pins))
        return
    log.info("installing the runtime's dependencies into %s: %s", settings.venv, " ".join(missing))
    _pip_install(python, missing, environ)
    log.info("runtime installed: %s", " ".join(pins))


def ensure_engine(
    settings: Settings,
    accelerator: str,
    packages: ImagePackages | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Installs the pinned engine into VL_VENV unless the image is prebaked or it is already there.

    `packages` defaults to the pins for `accelerator` ("cuda" or "cpu"): torch from the torch index
    (TORCH_INDEX_URL overrides it, like the image's build argument), then the engine, then the removals;
    pip reads its own PIP_* variables from `environ` (find-links, a proxy's CA). Raises InstallError.
    """
    if is_prebaked(settings):
        return
    packages = packages or _from_table(image_packages, IMAGE_KIND[accelerator])
    pins = (*packages.torch, *packages.engine)
    log.info("no %s: this image is not prebaked, checking the engine in %s", settings.prebaked_marker, settings.venv)
    python = _venv_python(settings, environ)
    missing = _missing_pins(python, pins, environ)
    if not missing:
        log.info("engine already installed: %s", " ".join(pins))
        return
    log.info("installing %s (minutes: the engine weighs gigabytes)", " ".join(missing))
    if torch := [pin for pin in packages.torch if pin in missing]:
        index = (os.environ if environ is None else environ).get("TORCH_INDEX_URL") or packages.torch_index
        _pip_install(python, torch, environ, index)
    if engine := [pin for pin in packages.engine if pin in missing]:
        _pip_install(python, engine, environ)
    if packages.remove:
        _run([str(python), "-m", "pip", "uninstall", "-y", *packages.remove], environ)
    log.info("engine installed: %s", " ".join(pins))


def _from_table(read: Callable[..., T], *args: str) -> T:
    """`read(*args)` from docker/versions.toml, its failure as a refusal's one line (InstallError)."""
    try:
        return read(*args)
    except PackagesError as error:
        raise InstallError(str(error)) from None


def _venv_python(settings: Settings, environ: Mapping[str, str] | None) -> Path:
    """VL_VENV's python, the environment created first when there is none (pip included: ensurepip)."""
    python = Path(settings.venv) / "bin" / "python"
    if not python.exists():
        log.info("creating the virtual environment %s", settings.venv)
        _run([sys.executable, "-m", "venv", settings.venv], environ)
    return python


def _missing_pins(python: Path, pins: Sequence[str], environ: Mapping[str, str] | None) -> list[str]:
    """The pins `python` lacks, in their order; one process checks them all (a start pays for it)."""
    argv = [str(python), "-c", MISSING_PINS, *pins]
    result = subprocess.run(argv, capture_output=True, text=True, env=None if environ is None else dict(environ))
    if result.returncode:
        last = (result.stderr.strip().splitlines() or [""])[-1]
        raise InstallError(f"{python} could not list its packages (exit {result.returncode}): {last}")
    found = set(result.stdout.split())
    return [pin for pin in pins if pin in found]


def _pip_install(
    python: Path, pins: Sequence[str], environ: Mapping[str, str] | None, index: str | None = None
) -> None:
    """`pip install` of exact pins into `python`'s environment, from `index` instead of pip's own when given."""
    options = ["--index-url", index] if index else []
    _run([str(python), "-m", "pip", "install", "--progress-bar", "off", *options, *pins], environ)


def _run(argv: list[str], environ: Mapping[str, str] | None) -> None:
    """Runs `argv`, each output line to the log (the boot log republished while the pod starts)."""
    last = ""
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(environ) if environ is not None else None,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if line.strip():
                last = line.strip()
                log.info("%s", last)
    if process.returncode:
        raise InstallError(f"{shlex.join(argv)} failed (exit {process.returncode}): {last}")
