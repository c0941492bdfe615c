"""Prebaked or not: with the image's marker, install nothing; without it, put the pinned engine in VL_VENV.

A prebaked image starts vLLM seconds after the container (the seeds' image: ~15 s, against ~8 min when
the bootstrap installed vLLM at every start). On a stock CUDA image the runtime installs the engine
pinned in docker/versions.toml first, logging pip's progress, and skips it at the next start.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from runtime.packages import EnginePackages, engine_packages
from runtime.settings import Settings

log = logging.getLogger(__name__)

# runtime.gpu's verdict → the kind of image whose engine this world needs (docker/versions.toml).
IMAGE_KIND = {"cuda": "gpu", "cpu": "cpu"}


class InstallError(RuntimeError):
    """The engine could not be installed; `str()` is one line naming the command and its last words."""


def is_prebaked(settings: Settings) -> bool:
    return Path(settings.prebaked_marker).exists()


def ensure_engine(settings: Settings, accelerator: str, packages: EnginePackages | None = None,
                  environ: Mapping[str, str] | None = None) -> None:
    """Installs the pinned engine into VL_VENV unless the image is prebaked or it is already there.

    `packages` defaults to the pins for `accelerator` ("cuda" or "cpu"); pip reads its own PIP_*
    variables from `environ` (an index, a proxy's CA). Raises InstallError.
    """
    if is_prebaked(settings):
        return
    packages = packages or engine_packages(IMAGE_KIND[accelerator])
    requirements = packages.requirements
    venv = Path(settings.venv)
    log.info("no %s: this image is not prebaked, checking the engine in %s", settings.prebaked_marker, venv)
    python = venv / "bin" / "python"
    if not python.exists():
        log.info("creating the virtual environment %s", venv)
        _run([sys.executable, "-m", "venv", str(venv)], environ)
    missing = [r for r in requirements if not _satisfied(python, r)]
    if not missing:
        log.info("engine already installed: %s", " ".join(requirements))
        return
    log.info("installing %s (minutes: the engine weighs gigabytes)", " ".join(missing))
    _run([str(python), "-m", "pip", "install", "--progress-bar", "off", *missing], environ)
    if packages.remove:
        _run([str(python), "-m", "pip", "uninstall", "-y", *packages.remove], environ)
    log.info("engine installed: %s", " ".join(requirements))


def _satisfied(python: Path, requirement: str) -> bool:
    name, _, version = requirement.partition("==")
    probe = "import importlib.metadata as m, sys; sys.exit(m.version(sys.argv[1]) != sys.argv[2])"
    return subprocess.run([str(python), "-c", probe, name, version], capture_output=True).returncode == 0


def _run(argv: list[str], environ: Mapping[str, str] | None) -> None:
    """Runs `argv`, each output line to the log (the boot log republished while the pod starts)."""
    last = ""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=dict(environ) if environ is not None else None) as process:
        assert process.stdout is not None
        for line in process.stdout:
            if line.strip():
                last = line.strip()
                log.info("%s", last)
    if process.returncode:
        raise InstallError(f"{shlex.join(argv)} failed (exit {process.returncode}): {last}")
