"""`python -m runtime logs POD_ID [--follow]`, run the way a user runs it, against the test Hub."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from runtime.hub import logtail
from space import runpod_template
from tests.support.hub_server import HubServer
from tests.support.polling import wait_until
from tests.support.signals import ctrl_c_as_at_a_terminal

pytestmark = pytest.mark.slow  # `runtime logs` run as a process against the test Hub

ROOT = Path(__file__).resolve().parents[2]
REPO = "pod-owner/pod-logs"
FIRST = "# vllm-pod pod-1 · not healthy since 2026-08-23T10:00:00Z\nboot   | runtime: starting\nengine | INFO line 1\n"


def user_env(hub: HubServer, tmp_path: Path, token: str | None = None, **extra: str) -> dict[str, str]:
    """A developer's shell: the Hub endpoint, maybe a token, a clean HF_HOME (no stored login)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "VL_"))}
    env |= {
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "VL_LOG_REPO": REPO,
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    if token:
        env["HF_TOKEN"] = token
    return env


def logs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "logs", *args], cwd=ROOT, env=env, text=True, capture_output=True, timeout=120
    )


@pytest.fixture
def hub(hub_server: HubServer) -> HubServer:
    hub_server.create_repo(REPO)
    return hub_server


def test_prints_the_log_anonymously_from_a_public_repo(hub: HubServer, tmp_path: Path) -> None:
    hub.put_file(REPO, "etat/pod-1.log", FIRST)
    done = logs(user_env(hub, tmp_path), "pod-1")
    assert (done.returncode, done.stdout, done.stderr) == (0, FIRST, "")
    assert all("authorization" not in r.headers for r in hub.received)


def test_a_private_repo_needs_the_token(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.create_repo(REPO, private=True)
    hub_server.put_file(REPO, "etat/pod-1.log", FIRST)
    refused = logs(user_env(hub_server, tmp_path), "pod-1")
    assert refused.returncode == 1
    assert refused.stderr == (
        f"runtime logs: repo {REPO} not found on {hub_server.endpoint} (if it is private, set "
        "HF_TOKEN; a pod creates it on its first publish)\n"
    )
    done = logs(user_env(hub_server, tmp_path, hub_server.read_token), "pod-1")
    assert (done.returncode, done.stdout) == (0, FIRST)


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("no such pod", 1, "runtime logs: no log etat/pod-9.log in pod-owner/pod-logs yet (pods with a log: pod-1)\n"),
        (
            "no repo",
            2,
            "runtime logs: no log repo: pass --repo OWNER/NAME or set VL_LOG_REPO (with HF_TOKEN set, "
            "the default is build.py's datasets/<your user>/vllm-pod-logs)\n",
        ),
        (
            "no repo, bad token",
            2,
            "runtime logs: no log repo: pass --repo OWNER/NAME or set VL_LOG_REPO (the Hub did "
            "not say whose HF_TOKEN this is: it answered 401)\n",
        ),
        ("bad repo", 2, "runtime logs: 'not a repo' is not a Hub repo id: owner/name, datasets/owner/name or spaces/"),
        ("bad token", 1, "runtime logs: the Hub refused the token (HF_TOKEN): "),
    ],
)
def test_clear_one_line_errors(hub: HubServer, tmp_path: Path, case: str, code: int, message: str) -> None:
    hub.put_file(REPO, "etat/pod-1.log", FIRST)
    env, args = user_env(hub, tmp_path), ["pod-1"]
    if case == "no such pod":
        args = ["pod-9"]
    elif case.startswith("no repo"):
        del env["VL_LOG_REPO"]
        if case.endswith("bad token"):
            env["HF_TOKEN"] = "hf_" + "n" * 34
    elif case == "bad repo":
        args += ["--repo", "not a repo"]
    else:
        env["HF_TOKEN"] = "hf_" + "n" * 34
    done = logs(env, *args)
    assert done.returncode == code
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


def test_without_a_repo_it_reads_the_one_build_py_made_for_the_token_s_user(hub_server: HubServer, tmp_path: Path):
    """build.py's templates publish to datasets/<user>/vllm-pod-logs: `logs POD` alone must find them there."""
    default = f"{hub_server.owner}/vllm-pod-logs"
    hub_server.create_repo(default, "dataset", private=True)
    hub_server.put_file(default, "etat/pod-1.log", FIRST, "dataset")
    env = user_env(hub_server, tmp_path, hub_server.read_token)
    del env["VL_LOG_REPO"]
    done = logs(env, "pod-1")
    assert (done.returncode, done.stdout, done.stderr) == (0, FIRST, "")
    assert logtail.DEFAULT_LOG_REPO == runpod_template.DEFAULT_LOG_REPO  # the pod side's copy of build.py's rule


def test_an_unreachable_hub_is_said_plainly(hub: HubServer, tmp_path: Path) -> None:
    with hub.outage("refuse"):
        done = logs(user_env(hub, tmp_path), "pod-1")
    assert done.returncode == 1
    assert done.stderr.startswith(f"runtime logs: cannot reach the Hub at {hub.endpoint}: ")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


class Following:
    """`runtime logs --follow` in the background, its output collected line by line."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "runtime", "logs", *args],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=ctrl_c_as_at_a_terminal,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        for stream, lines in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr)):
            threading.Thread(target=lambda s=stream, o=lines: o.extend(s), daemon=True).start()

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)  # Ctrl-C
        return self.process.wait(60)


def test_follow_waits_for_the_log_then_prints_only_what_is_new(hub: HubServer, tmp_path: Path) -> None:
    following = Following(user_env(hub, tmp_path), "pod-1", "--follow", "--interval", "0.1")
    try:
        wait_until(lambda: following.stderr, "the waiting message")
        waiting = f"runtime logs: no log etat/pod-1.log in {REPO} yet; still trying (Ctrl-C to stop)\n"
        assert following.stderr == [waiting]

        hub.put_file(REPO, "etat/pod-1.log", FIRST)
        wait_until(lambda: len(following.stdout) == 3, "the whole log")
        assert "".join(following.stdout) == FIRST

        hub.put_file(REPO, "README.md", "another pod's commit: the log itself did not change")
        second = FIRST.replace("boot   | runtime: starting\n", "") + "engine | INFO line 2\nnote   | engine exited\n"
        hub.put_file(REPO, "etat/pod-1.log", second)
        wait_until(lambda: len(following.stdout) == 5, "the two new lines")
        assert following.stdout[3:] == ["engine | INFO line 2\n", "note   | engine exited\n"]
    finally:
        code = following.interrupt()
    assert code == 0
    assert len(following.stderr) == 1  # no traceback on Ctrl-C
