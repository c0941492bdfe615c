"""docker/image_facts.py, the build step that checks the pins and writes /opt/.image_prebaked.

It runs here with this venv's Python, exactly as the Dockerfile runs it with the image's.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.repo_copy import ROOT

SCRIPT = ROOT / "docker" / "image_facts.py"
PYTEST = importlib.metadata.version("pytest")


def run_facts(output: Path, *pins: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        str(SCRIPT),
        "--output",
        str(output),
        "--target",
        "cpu",
        "--cuda-arch",
        "",
        "--base-image",
        "debian:bookworm-slim",
        "--revision",
        "abc123",
        "--date",
        "2026-01-02T03:04:05+00:00",
    ]
    command += [arg for pin in pins for arg in ("--pin", pin)]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.mark.slow  # starts a Python process
def test_it_writes_the_facts_when_every_pin_is_installed(tmp_path: Path) -> None:
    output = tmp_path / "prebaked"
    result = run_facts(output, f"pytest=={PYTEST}", env={"CUDA_VERSION": "13.0.2"})
    assert result.returncode == 0, result.stderr
    facts = json.loads(output.read_text())
    assert facts == {
        "target": "cpu",
        "cuda_arch": None,
        "base_image": "debian:bookworm-slim",
        "revision": "abc123",
        "date": "2026-01-02T03:04:05+00:00",
        "python": facts["python"],
        "cuda": "13.0.2",
        "versions": {"pytest": PYTEST},
    }
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))


@pytest.mark.slow  # starts a Python process
def test_a_version_other_than_the_pin_fails_the_build(tmp_path: Path) -> None:
    output = tmp_path / "prebaked"
    result = run_facts(output, "pytest==0.0.1", "no-such-distribution==1.0")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"image_facts: pytest: pinned 0.0.1, installed {PYTEST}",
        "image_facts: no-such-distribution: pinned 1.0, installed nothing",
    ]
    assert not output.exists()


@pytest.mark.slow  # starts a Python process
def test_a_cuda_compat_directory_on_the_loader_path_fails_the_build(tmp_path: Path) -> None:
    result = run_facts(tmp_path / "prebaked", env={"LD_LIBRARY_PATH": "/usr/local/cuda/compat:/usr/lib"})
    assert result.returncode == 1
    assert "LD_LIBRARY_PATH=/usr/local/cuda/compat" in result.stderr
