"""`scripts/demo`, the README's first command, run as the README writes it on the session's Docker engine once its
cpu image is built (the demo's own build then comes from the layer cache): the pod starts with its own entrypoint and
a key, serves its model, and one real Claude Code turn runs a tool through it."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.support.images import Engine, report
from tests.support.repo_copy import ROOT

pytestmark = pytest.mark.docker

TAG = "vllm-pod:cpu"  # the demo's own tag


def test_the_readme_s_first_command_runs_claude_code_on_the_pod_it_starts(
    image_engine: Engine, cpu_image: str, request: pytest.FixtureRequest
) -> None:
    engine, client = image_engine
    started = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "scripts" / "demo")], cwd=ROOT, env={**os.environ, "DOCKER_HOST": engine.docker_host},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    report(request, f"scripts/demo on the session's engine, its image cached: {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == f"demo: using the Docker engine at {engine.docker_host}"
    assert any(line.startswith(f"demo: build.py: built {TAG} (") for line in lines), done.stdout[-3000:]
    assert any(line.startswith("demo: the pod serves its model ") for line in lines)
    assert "The command ran." in lines  # the tiny model's reply to the tool's result, as Claude Code printed it
    assert any(line.endswith("the Bash tool wrote proof.txt: tiny-model-was-here") for line in lines)
    assert "export ANTHROPIC_MODEL=tiny" in lines and "claude" in lines  # `runtime connect`'s environment
    assert lines[-1].startswith("demo: stopping container ")
    assert len(lines) < 60, done.stdout  # a newcomer reads it: the build's own output stays in its log
    assert client.containers.list(all=True, filters={"ancestor": TAG}) == []
