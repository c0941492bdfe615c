"""`python -m runtime pod up` that gives up watching says how long it watched as it was: it said "not serving after
1 min" after 36 s. Against the schema-checking RunPod stand-in, with no machine behind it (the pod never serves)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.units import human_seconds
from space import runpod
from tests.support.environ import outer_environ
from tests.support.net import free_port
from tests.support.runpod_server import RunPodServer

pytestmark = pytest.mark.slow  # `runtime pod up` run as a process

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "vllm-pod sm89 pod-owner/vllm-pod-sm89"


def test_a_watch_that_gives_up_says_the_seconds_it_watched(runpod_server: RunPodServer, tmp_path: Path) -> None:
    runpod_server.add_template(runpod.template_body(TEMPLATE, "registry.hf.space/pod-owner-vllm-pod-sm89:latest"))
    env = outer_environ("RUNPOD_", "ANTHROPIC_") | {
        "RUNPOD_API_KEY": runpod_server.api_key, "RUNPOD_API_URL": runpod_server.url,
        "RUNPOD_PROXY_URL": f"http://127.0.0.1:{free_port()}/{{pod_id}}-{{port}}",  # nothing answers there
        "XDG_CONFIG_HOME": str(tmp_path),
    }  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "pod", "up", "--template", TEMPLATE, "--timeout", "0"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    (pod,) = runpod_server.pods
    last = result.stderr.splitlines()[-1]
    assert re.fullmatch(
        rf"pod: {pod['id']} is not serving after \d+ s; it keeps running: python -m runtime pod watch {pod['id']}", last
    ), last


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.4, "0 s"), (36.9, "36 s"), (59.99, "59 s"), (60, "1 min 00 s"), (245, "4 min 05 s"), (7380, "2 h 03 min")],
)
def test_elapsed_times_are_cut_down_never_rounded_up(seconds: float, said: str) -> None:
    assert human_seconds(seconds) == said
