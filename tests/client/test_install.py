"""`pip install .` gives a user the commands and what they import, nothing more: the checkout is installed (not
editable, no extras) into a bare virtual environment, and its `vllm-pod` script runs from a folder outside the
checkout, against a real bridge for `launch`. A module that a command imports but pyproject's `dependencies` do
not name fails here (there is nothing else in that environment to find it in).

pip reads this machine's own configuration for its index, as a user's pip does. The build is isolated: the bare
environment has no setuptools to build with (pyproject's `license` needs setuptools 77, newer than what `venv`
bundles with some Pythons), so pip fetches the build backend, as it does on a user's machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.bridge import Process, start_bridge
from tests.support.environ import outer_environ
from tests.support.repo_copy import copy_repo
from tests.support.vllm_server import VllmServer

pytestmark = pytest.mark.slow  # pip, then the installed commands, as processes (the launch test: vllm too)

KEY = "sk-install-0123456789abcdef"
PIP_TIMEOUT_S = 300  # seconds here from the machine's own index; a network index can take longer
CLIENT_COMMANDS = ("plan", "pod", "connect", "launch", "check", "bench", "status", "logs")
HEAVY = ("vllm", "torch", "docker", "jinja2")  # the engine, the image's and build.py's: never the client's


@dataclass(frozen=True)
class Installed:
    """The bare environment `pip install` filled, and a user's folder outside the checkout to run it from."""

    venv: Path
    home: Path
    pip_s: float

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """`vllm-pod ARGV…` as a user runs it: from their folder, with none of this checkout on the path."""
        return subprocess.run(
            [str(self.venv / "bin" / "vllm-pod"), *argv], cwd=self.home, env=self.environment(),
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def environment(self) -> dict[str, str]:
        # No RUNPOD_API_KEY (`plan` would ask RunPod's prices) nor a key a command could take instead of --key.
        outer = outer_environ("PYTHON", "VIRTUAL_ENV", "RUNPOD_", "ANTHROPIC_", "XDG_")
        return outer | {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """One install for the module: a copy of the checkout (pip builds in the source folder: its build/ and
    egg-info stay out of the working tree), `python -m venv` without system site packages, then this test
    environment's pip installs the copy into it (`--python`: the bare environment needs no pip of its own)."""
    folder = tmp_path_factory.mktemp("install")
    source = copy_repo(folder / "checkout")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    started = time.monotonic()
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-input", str(source)],
        cwd=folder, env=outer_environ("PYTHON", "VIRTUAL_ENV"), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=PIP_TIMEOUT_S,
    )  # fmt: skip
    if pip.returncode != 0:
        pytest.fail(f"pip install {source} failed ({pip.returncode}):\n{pip.stdout[-3000:]}\n{pip.stderr[-3000:]}")
    home = folder / "home"
    home.mkdir()
    return Installed(venv, home, time.monotonic() - started)


def succeeded(done: subprocess.CompletedProcess[str]) -> str:
    assert (done.returncode, "Traceback" in done.stderr) == (0, False), f"{done.args}:\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_install_holds_the_client_and_not_the_engine(installed: Installed) -> None:
    found = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c",
         "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m)))", *HEAVY],
        cwd=installed.home, env=installed.environment(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (found.returncode, found.stdout.strip()) == (0, "")
    print(f"pip install: {installed.pip_s:.1f} s")  # what a user waits (pytest -s, or -rP, shows it)


def test_plan_runs_from_the_installed_script(installed: Installed) -> None:
    """The recipes (TOML next to their module) are installed too: without them `plan` knows no model."""
    lines = succeeded(installed.run("plan")).splitlines()
    assert lines[0].startswith("nemotron at ") and "smallest card that fits" in lines[0], lines[:2]
    assert any(line.startswith("L40S ") for line in lines)


def test_every_command_of_the_users_machine_imports_and_names_the_script_that_was_run(installed: Installed) -> None:
    """`--help` imports the command's module and what it imports at its top (`logs`: huggingface_hub)."""
    assert succeeded(installed.run("--help")).startswith("usage: vllm-pod <command> [options]\n")
    for command in CLIENT_COMMANDS:
        assert succeeded(installed.run(command, "--help")).startswith(f"usage: vllm-pod {command} ")
    assert "\n    up " in succeeded(installed.run("pod", "--help"))
    module = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-m", "runtime", "--help"],
        cwd=installed.home, env=installed.environment(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert succeeded(module).startswith("usage: python -m runtime <command> [options]\n")


@pytest.fixture(scope="module")
def keyed_bridge(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    """A pod's public port as a user reaches it: the bridge with a key, in front of the session's vLLM."""
    log = tmp_path_factory.mktemp("install-bridge") / "bridge.log"
    with start_bridge(vllm_server.url, log, {"VL_API_KEYS": f"me:{KEY}"}) as bridge:
        yield bridge


def test_launch_prints_claude_codes_environment_for_a_real_pod(installed: Installed, keyed_bridge: Process) -> None:
    printed = succeeded(installed.run("launch", "--print", keyed_bridge.url, "--key", KEY))
    assert f"export ANTHROPIC_BASE_URL={keyed_bridge.url}\n" in printed
    assert f"export ANTHROPIC_AUTH_TOKEN={KEY}\n" in printed and "export ANTHROPIC_MODEL=tiny\n" in printed
    assert printed.rstrip().endswith("\nclaude")
    assert "tiny" in succeeded(installed.run("status", keyed_bridge.url, "--key", KEY))
    refused = installed.run("launch", "--print", keyed_bridge.url, "--key", "sk-wrong")
    assert (refused.returncode, refused.stdout, "refused the key (401)" in refused.stderr) == (1, "", True), refused
