"""`runtime start`'s contracts that need no engine: a light path to vLLM's launch, and what it hands
the bridge (its own settings, as text the bridge reads back unchanged)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.health import pod_health_url
from runtime.pod.changes import SettingsChanges
from runtime.pod.children import bridge_argv
from runtime.pod.hubside import PodHub, starting_settings
from runtime.pod.start import Pod
from runtime.settings import VARIABLES, Scope, load_settings
from runtime.settingsfile import SettingsFile
from tests.support.hub_server import HubServer

ROOT = Path(__file__).resolve().parents[2]
CONFIG, LOGS = "pod-owner/pod-config", "pod-owner/pod-logs"


READ_BY_THE_BRIDGE = (Scope.BRIDGE, Scope.POD)  # its own, and the pod's state folder and image facts


def test_the_bridge_reads_back_exactly_the_effective_bridge_and_pod_settings() -> None:
    remote = {"VL_ALIASES": "claude-x, my-alias", "VL_BRIDGE_PING_S": "7.5", "VL_LOG_PROMPTS": "on"}
    effective = load_settings(
        {"VL_API_KEYS": "key-one-0123456789,ci:key-two-0123456789", "VL_MAX_BODY_MB": "8", "VL_STATE_DIR": "/srv/pod"},
        remote,
    )
    read_back = load_settings(effective.environ(*READ_BY_THE_BRIDGE))
    for variable in VARIABLES:
        if variable.scope in READ_BY_THE_BRIDGE:
            assert getattr(read_back, variable.attr) == getattr(effective, variable.attr), variable.env


def test_engine_settings_stay_out_of_the_bridge_command() -> None:
    assert set(load_settings({"VL_CTX": "4096"}).environ(*READ_BY_THE_BRIDGE)) == {
        v.env for v in VARIABLES if v.scope in READ_BY_THE_BRIDGE
    }


def test_the_bridge_reads_no_engine_setting() -> None:
    """What the bridge is given is all it reads: no engine setting (which would be stale after an engine change)."""
    bridge_module = (ROOT / "runtime" / "bridge" / "state.py").read_text()
    read = set(re.findall(r"settings\.([a-z_]+)", bridge_module))
    assert read, "the bridge reads its settings in runtime/bridge/state.py"
    allowed = {v.attr for v in VARIABLES if v.scope in READ_BY_THE_BRIDGE}
    assert read <= allowed, read - allowed


@pytest.mark.slow  # starts a Python process
def test_the_path_to_the_engine_launch_imports_nothing_heavy() -> None:
    heavy = ("httpx", "huggingface_hub", "torch", "vllm", "starlette", "uvicorn", "tokenizers", "runtime.bridge")
    code = f"import sys, runtime.pod.start; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.stdout.strip() == "[]"


# --- the Hub file at start and live, in process (the real Hub client against the test Hub) ---------


def pod_environ(hub: HubServer, tmp_path: Path, **settings: str) -> dict[str, str]:
    return hub.env() | {
        "VL_CONFIG_REPO": CONFIG, "VL_LOG_REPO": LOGS, "RUNPOD_POD_ID": "pod-7", "VL_STATE_DIR": str(tmp_path),
        "VL_LISTEN": "127.0.0.1", "VL_PORT": "8123", **settings,
    }  # fmt: skip


@pytest.fixture
def config_repo(hub_server: HubServer) -> HubServer:
    hub_server.create_repo(CONFIG, private=True)
    hub_server.create_repo(LOGS, private=True)
    return hub_server


def test_the_pod_is_built_on_its_environment_s_port_whatever_the_hub_file_says(
    config_repo: HubServer, tmp_path: Path
) -> None:
    """The bug of a Hub file's VL_PORT at start: the bridge on 9000, the watchdog on 8080, restarted for ever.
    The file is refused; the bridge's port, its watchdog's and the HEALTHCHECK's are one, by construction."""
    config_repo.put_file(CONFIG, "pod.env", "VL_PORT=9000\nVL_STATE_DIR=/srv/elsewhere\nVL_ALIASES=claude-x\n")
    environ = pod_environ(config_repo, tmp_path)
    settings = load_settings(environ)
    hub = PodHub.connect(settings, environ)
    pod = Pod(starting_settings(settings, environ, hub), environ, hub)
    assert (pod.settings.port, pod.settings.state_dir, pod.settings.aliases) == (8123, str(tmp_path), ())
    assert pod.children.bridge_probe.url == pod_health_url(environ) == "http://127.0.0.1:8123/health"
    argv = bridge_argv("http://127.0.0.1:18081", pod.settings.listen, pod.settings.port)
    assert argv[argv.index("--port") + 1] == "8123"
    assert pod.state_dir == tmp_path and pod.supervisor.state_dir == tmp_path
    hub.close(timeout_s=60)
    published = (config_repo.file(LOGS, "etat/pod-7.log") or b"").decode()
    assert (
        f"refused {CONFIG}/pod.env: VL_PORT, VL_STATE_DIR are pod settings: set them in the pod's environment "
        "(the RunPod template); the current configuration keeps serving"
    ) in published


def test_a_refusal_at_start_is_published_and_masks_the_file_s_secrets(config_repo: HubServer, tmp_path: Path) -> None:
    secret = "team-secret-key-0123456789"
    config_repo.put_file(CONFIG, "pod.env", f"VL_CTX=4096\nVL_API_KEYS={secret}\nVL_CXT=1\n")
    (tmp_path / "boot.log").write_text("runtime: starting\n")
    environ = pod_environ(config_repo, tmp_path)
    hub = PodHub.connect(load_settings(environ), environ)
    settings = starting_settings(load_settings(environ), environ, hub)
    assert settings.ctx is None and settings.api_keys == ()  # the whole file is refused, not half of it
    hub.close(timeout_s=60)
    log = (config_repo.file(LOGS, "etat/pod-7.log") or b"").decode()
    assert "VL_CXT is not a setting (did you mean VL_CTX?)" in log and "boot   | runtime: starting" in log
    assert not [r for r in config_repo.received if r.carries(secret)]


def test_a_live_file_that_would_open_a_keyed_pod_changes_nothing(
    config_repo: HubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config_repo.put_file(CONFIG, "pod.env", "VL_API_KEYS=team:key-0123456789abcdef\n")
    environ = pod_environ(config_repo, tmp_path)
    hub = PodHub.connect(load_settings(environ), environ)
    pod = Pod(starting_settings(load_settings(environ), environ, hub), environ, hub)
    keyed = pod.settings
    assert [key.name for key in keyed.api_keys] == ["team"]  # from a private repo: taken
    changes = SettingsChanges(pod.engines, pod.children, hub, environ)
    asyncio.run(changes.apply(SettingsFile("VL_ALIASES=x\n", f"{CONFIG}/pod.env", private=True)))
    assert pod.settings is keyed
    assert "the pod has keys, and this file would leave VL_API_KEYS empty" in caplog.text
