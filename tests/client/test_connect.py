"""`python -m runtime connect URL`: the check a user runs against a pod, and the environment it prints,
which must start the real Claude Code on the pod's model as printed, a stray ANTHROPIC_API_KEY included."""

from __future__ import annotations

import json
import shlex
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.client.identity import config_dir, remember_pod
from runtime.engine import tinymodel as tiny
from tests.support.bridge import ROOT, Process, clean_environment, start_bridge
from tests.support.claude_code import (
    CLAUDE,
    TIMEOUT_S,
    parse_result,
    quiet_environment,
    require_claude_code,
    stand_in_claude,
)
from tests.support.net import free_port
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.slow  # `runtime connect` run as a process against bridge processes

KEY = "sk-pod-'$HOME\"x-0123456789"  # quotes and a dollar: the printed scripts must carry it literally


@pytest.fixture(scope="module")
def keyed_bridge(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    log = tmp_path_factory.mktemp("keyed") / "bridge.log"
    with start_bridge(vllm_server.url, log, {"VL_API_KEYS": f"pod:{KEY}"}) as bridge:
        yield bridge


def connect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "connect", *args],
        cwd=ROOT, env=clean_environment({}), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed check prints, once exit code and silence on stdout are checked."""
    assert done.returncode == 1, done
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.startswith("connect: ") and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


def test_the_printed_bash_environment_runs_claude_code(keyed_bridge: Process, tmp_path: Path) -> None:
    require_claude_code()
    done = connect(keyed_bridge.url, "--key", KEY, "--shell", "bash")
    assert done.returncode == 0, done.stderr
    script = done.stdout
    assert "export ANTHROPIC_MODEL=tiny\n" in script  # the bare id: Claude Code honours the window only for it
    assert "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=65536\n" in script
    assert "export CLAUDE_CODE_GATEWAY_HINT_HEADERS=1\n" in script  # request classes, for the per-agent view
    assert script.rstrip().endswith("\nclaude")
    run_claude = f"{CLAUDE} -p 'Say hello {tiny.MARK_TEXT}' --output-format json"
    (tmp_path / "home").mkdir()
    # A key left in the shell would win over the printed token, and the bridge refuses two different keys.
    environment = quiet_environment(tmp_path / "home") | {"ANTHROPIC_API_KEY": "sk-ant-left-over"}
    ran = subprocess.run(
        ["bash", "-c", script.rstrip().removesuffix("claude") + run_claude],
        cwd=tmp_path, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert parse_result(ran)["result"] == tiny.ANSWER


def test_the_powershell_environment_is_literal(keyed_bridge: Process) -> None:
    done = connect(keyed_bridge.url, "--key", KEY, "--shell", "powershell")
    assert done.returncode == 0, done.stderr
    assert "Remove-Item Env:ANTHROPIC_API_KEY" in done.stdout
    assert "$env:ANTHROPIC_MODEL = 'tiny'\n" in done.stdout
    assert "$env:CLAUDE_CODE_MAX_CONTEXT_TOKENS = '65536'\n" in done.stdout
    # Nothing expanded, the quote doubled.
    assert "$env:ANTHROPIC_AUTH_TOKEN = 'sk-pod-''$HOME\"x-0123456789'\n" in done.stdout


def test_a_wrong_key_is_refused_in_one_line(keyed_bridge: Process) -> None:
    assert "refused the key (401)" in refused(connect(keyed_bridge.url, "--key", "sk-wrong"))


def test_a_model_the_pod_does_not_serve(bridge: Process) -> None:
    assert "does not serve 'qwen'" in refused(connect(bridge.url, "--model", "qwen"))


def test_an_unreachable_endpoint() -> None:
    assert "cannot be reached" in refused(connect(f"http://127.0.0.1:{free_port()}"))


def test_a_bridge_whose_engine_still_loads(tmp_path: Path) -> None:
    with start_bridge(f"http://127.0.0.1:{free_port()}", tmp_path / "bridge.log") as bridge:
        assert "the bridge answers but its engine serves no model yet" in refused(connect(bridge.url))


def test_a_wrong_key_is_said_before_a_loading_engine(tmp_path: Path) -> None:
    """/health tells a stranger the pod's condition too: a wrong key must not read as "still loading?"."""
    with start_bridge(f"http://127.0.0.1:{free_port()}", tmp_path / "bridge.log", {"VL_API_KEYS": KEY}) as bridge:
        line = refused(connect(bridge.url, "--key", "sk-wrong"))
    assert line == (
        f"connect: {bridge.url}/v1/models refused the key (401): give one of the pod's VL_API_KEYS (--key, else "
        "$ANTHROPIC_AUTH_TOKEN, else $ANTHROPIC_API_KEY, else the key kept with that pod by `pod up`)\n"
    )


def test_launch_runs_claude_code_on_the_pod_up_brought_up_without_the_paid_api_key(
    keyed_bridge: Process, tmp_path: Path
) -> None:
    require_claude_code()
    home = tmp_path / "home"
    home.mkdir()
    # As a user's shell: Claude Code on PATH, a paid key left over (the bridge refuses two different keys), and
    # the pod's key in Claude Code's own variable.
    environment = quiet_environment(home) | {
        "PATH": f"{CLAUDE.parent}:{quiet_environment(home)['PATH']}", "ANTHROPIC_API_KEY": "sk-ant-left-over",
        "ANTHROPIC_AUTH_TOKEN": KEY, "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    remember_pod(keyed_bridge.url, None, environment)  # what `pod up` does once its pod serves
    ran = subprocess.run(
        [sys.executable, "-m", "runtime", "launch", "--", "-p", f"Say hello {tiny.MARK_TEXT}", "--output-format", "json"],
        cwd=home, env=environment, capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert parse_result(ran)["result"] == tiny.ANSWER
    assert f"launch: Claude Code on 'tiny' at {keyed_bridge.url} (65,536-token window)" in ran.stderr


def test_launch_prints_the_environment_or_says_which_url_it_needs(keyed_bridge: Process, tmp_path: Path) -> None:
    environment = clean_environment({"XDG_CONFIG_HOME": str(tmp_path)})
    launch = [sys.executable, "-m", "runtime", "launch"]
    printed = subprocess.run([*launch, keyed_bridge.url, "--key", KEY, "--print"], cwd=ROOT, env=environment,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert printed.returncode == 0 and "export ANTHROPIC_MODEL=tiny\n" in printed.stdout
    nowhere = subprocess.run(launch, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert nowhere.returncode == 2 and nowhere.stdout == ""
    assert nowhere.stderr == "launch: no URL, and no pod brought up by `pod up` yet: give the pod's URL\n"


def test_launch_takes_the_key_the_readme_exports_and_hands_it_over_as_the_token(
    keyed_bridge: Process, tmp_path: Path
) -> None:
    """The README's journey exports ANTHROPIC_API_KEY before `pod up`; `launch` asks the pod with it, then gives
    Claude Code the key as ANTHROPIC_AUTH_TOKEN, never as the variable that goes to the paid API."""
    folder = stand_in_claude(tmp_path / "bin")
    seen = tmp_path / "claude-environment.json"
    environment = clean_environment(
        {"XDG_CONFIG_HOME": str(tmp_path), "ANTHROPIC_API_KEY": KEY, "CLAUDE_SEEN": str(seen)}
    )
    environment["PATH"] = f"{folder}:{environment['PATH']}"
    ran = subprocess.run([sys.executable, "-m", "runtime", "launch", keyed_bridge.url], cwd=tmp_path, env=environment,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    given = json.loads(seen.read_text())
    assert given["ANTHROPIC_AUTH_TOKEN"] == KEY and "ANTHROPIC_API_KEY" not in given
    assert (given["ANTHROPIC_BASE_URL"], given["ANTHROPIC_MODEL"]) == (keyed_bridge.url, "tiny")


def test_the_key_pod_up_was_given_serves_its_pod_and_no_other(keyed_bridge: Process, tmp_path: Path) -> None:
    """Without --key or a variable (an Anthropic key is none), each command takes the key `pod up` checked its pod
    with, for that pod only: `status`, `check` and `bench` without a URL ask that pod; a key kept for it is never
    sent to another URL."""
    # An Anthropic key left in the shell is the paid API's: skipped, never sent to a pod.
    environment = clean_environment(
        {"XDG_CONFIG_HOME": str(tmp_path), "ANTHROPIC_API_KEY": "sk-ant-api03-paid-0123456"}
    )
    remember_pod(keyed_bridge.url, KEY, environment)
    assert stat.S_IMODE(config_dir(environment).joinpath("last-pod.json").stat().st_mode) == 0o600
    runtime = [sys.executable, "-m", "runtime"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*runtime, *args], cwd=ROOT, env=environment, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    printed = run("launch", "--print")
    assert printed.returncode == 0 and f"export ANTHROPIC_AUTH_TOKEN={shlex.quote(KEY)}\n" in printed.stdout
    assert "tiny" in run("status").stdout
    with start_bridge(
        f"http://127.0.0.1:{free_port()}", tmp_path / "other.log", {"VL_API_KEYS": "sk-other-pod-0123456789"}
    ) as other:
        assert "refused the key (401)" in refused(connect(other.url))  # "x", not the kept key
    remember_pod(keyed_bridge.url, "sk-wrong", environment)  # a wrong key proves which pod they asked, at no cost
    for command in ("check", "bench"):
        done = run(command)
        assert (done.returncode, done.stderr) == (
            2, f"runtime {command}: {keyed_bridge.url}/v1/models refused the key (401): give one of the pod's "
            "VL_API_KEYS (--key, else $ANTHROPIC_AUTH_TOKEN, else $ANTHROPIC_API_KEY, else the key kept with that pod "
            "by `pod up`)\n",
        )  # fmt: skip
