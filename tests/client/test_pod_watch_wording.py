"""`python -m runtime pod up` that gives up watching says how long it watched as it was (it said "not serving after
1 min" after 36 s), and one whose engine is left stopped says so at once. Against the schema-checking RunPod
stand-in, with no machine behind it (the pod never serves)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.state.enginehealth import write_engine_stopped
from runtime.units import human_seconds
from space import runpod
from tests.support.bridge import start_bridge
from tests.support.environ import outer_environ
from tests.support.net import free_port
from tests.support.runpod_server import RunPodServer

pytestmark = pytest.mark.slow  # `runtime pod up` run as a process

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "vllm-pod sm89 pod-owner/vllm-pod-sm89"


def pod_up(runpod_server: RunPodServer, proxy_url: str, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m runtime pod up` from the template, against the stand-in, its proxy at `proxy_url`."""
    env = outer_environ("RUNPOD_", "ANTHROPIC_") | {
        "RUNPOD_API_KEY": runpod_server.api_key, "RUNPOD_API_URL": runpod_server.url,
        "RUNPOD_PROXY_URL": proxy_url, "XDG_CONFIG_HOME": str(config),
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "runtime", "pod", "up", "--template", TEMPLATE, *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_a_watch_that_gives_up_says_the_seconds_it_watched(runpod_server: RunPodServer, tmp_path: Path) -> None:
    runpod_server.add_template(runpod.template_body(TEMPLATE, "registry.hf.space/pod-owner-vllm-pod-sm89:latest"))
    nowhere = f"http://127.0.0.1:{free_port()}/{{pod_id}}-{{port}}"  # nothing answers there
    result = pod_up(runpod_server, nowhere, tmp_path, "--timeout", "0")
    assert result.returncode == 1, result.stderr
    (pod,) = runpod_server.pods
    last = result.stderr.splitlines()[-1]
    assert re.fullmatch(
        rf"pod: {pod['id']} is not serving after \d+ s; it keeps running: python -m runtime pod watch {pod['id']}", last
    ), last


def test_a_pod_whose_engine_is_left_stopped_ends_the_watch_with_what_to_do(
    runpod_server: RunPodServer, tmp_path: Path
) -> None:
    """A sick host (or a setting vLLM refuses): the pod's bridge says "stopped", and `pod up` stops waiting for a
    model that will not come. The pod's own bridge answers through the proxy, with the supervisor's file."""
    runpod_server.add_template(runpod.template_body(TEMPLATE, "registry.hf.space/pod-owner-vllm-pod-sm89:latest"))
    write_engine_stopped(tmp_path / "state", "engine", "exited with code 1; not restarted: this host is sick")
    settings = {"VL_STATE_DIR": str(tmp_path / "state")}
    with start_bridge(f"http://127.0.0.1:{free_port()}", tmp_path / "bridge.log", settings) as bridge:
        result = pod_up(runpod_server, bridge.url, tmp_path, "--timeout", "5")  # the proxy: to that bridge
    (pod,) = runpod_server.pods
    assert result.returncode == 1 and result.stderr.splitlines()[-1] == (
        f"pod: {pod['id']}'s engine is left stopped: its log above says why (a sick host: python -m runtime pod "
        f"replace {pod['id']}; a setting: change it, then pod start)"
    ), result.stderr


@pytest.mark.parametrize(
    ("seconds", "said"),
    [(0.4, "0 s"), (36.9, "36 s"), (59.99, "59 s"), (60, "1 min 00 s"), (245, "4 min 05 s"), (7380, "2 h 03 min")],
)
def test_elapsed_times_are_cut_down_never_rounded_up(seconds: float, said: str) -> None:
    assert human_seconds(seconds) == said
