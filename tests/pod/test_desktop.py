"""The browser desktop (VL_DESKTOP=on, runtime/pod/desktop.py) without an image: its refusals in one line, the
command lines of its pieces (no password in any: `ps` shows them to everyone in the pod), the supervised
child `runtime start` adds, and the password check websockify runs (runtime/pod/desktop_auth.py).

The desktop itself (Xvnc, JWM, websockify and noVNC in the cpu image, a real Chromium in front) is
tests/build/test_desktop_image.py.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from runtime import cli
from runtime.pod import desktop, desktop_auth
from runtime.pod.hubside import PodHub
from runtime.pod.start import Pod
from runtime.pod.supervisor import ChildSpec
from runtime.settings import SettingsError, load_settings
from runtime.state.statefile import write_private
from space import runpod_template, targets
from tests.support.environ import outer_environ

PASSWORD = "s3cret-Desktop-Passw0rd"
NO_PASSWORD_LINE = (
    "VL_DESKTOP='on' is not allowed: expected off while VL_DESKTOP_PASSWORD is empty (the desktop's port is public)"
)
REPO_ROOT = Path(__file__).resolve().parents[2]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# --- VL_DESKTOP=on without a password: one line, from both commands ----------------------------------------


@pytest.mark.parametrize("command", ["settings", "start"])
def test_on_without_a_password_is_refused_in_one_line(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [name for name in os.environ if name.startswith("VL_")]:
        monkeypatch.delenv(name)  # a developer's own settings stay out
    monkeypatch.setenv("VL_DESKTOP", "on")
    monkeypatch.setenv("VL_STATE_DIR", str(tmp_path / "state"))
    status = cli.main([command])
    output = capsys.readouterr()
    assert status != 0
    assert (output.out, output.err.splitlines()) == ("", [NO_PASSWORD_LINE])
    assert not (tmp_path / "state").exists(), "nothing was started or written"


@pytest.mark.slow  # two processes, as a user runs them
def test_both_commands_refuse_it_as_processes(tmp_path: Path) -> None:
    env = outer_environ() | {"VL_DESKTOP": "on", "VL_STATE_DIR": str(tmp_path / "state")}
    for command in ("settings", "start"):
        result = subprocess.run(
            [sys.executable, "-m", "runtime", command], cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
        assert (result.returncode, result.stdout, result.stderr) == (2, "", NO_PASSWORD_LINE + "\n"), command
    assert not (tmp_path / "state").exists()


def test_a_password_too_short_is_refused_without_being_shown() -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings({"VL_DESKTOP": "on", "VL_DESKTOP_PASSWORD": "short"})
    assert "short" not in str(refused.value) and "\n" not in str(refused.value)


# --- the pieces' command lines -------------------------------------------------------------------------


def layout(tmp_path: Path, listen: str = "0.0.0.0") -> desktop.DesktopLayout:
    return desktop.DesktopLayout(tmp_path / "desktop", listen)


def test_no_command_line_holds_the_password(tmp_path: Path) -> None:
    place = layout(tmp_path)
    argvs = [
        desktop.launcher_argv(),
        desktop.xvnc_argv(place, 7),
        desktop.window_manager_argv(place),
        desktop.websockify_argv(place),
        desktop.TERMINAL,
    ]
    assert not any(PASSWORD in word for argv in argvs for word in argv)
    web = desktop.websockify_argv(place)
    assert web[web.index("--auth-source") + 1] == "VL_DESKTOP_GATE_TOKEN"  # the variable's name, not its value
    assert web[web.index("--auth-plugin") + 1] == "runtime.pod.desktop_auth.DesktopPassword"


def test_vnc_is_on_a_private_socket_and_behind_the_full_password_too(tmp_path: Path) -> None:
    place = layout(tmp_path)
    xvnc, web = desktop.xvnc_argv(place, 7), desktop.websockify_argv(place)
    assert xvnc[xvnc.index("-rfbunixpath") + 1] == web[web.index("--unix-target") + 1] == str(place.socket)
    assert xvnc[xvnc.index("-rfbport") + 1] == "-1" and "-localhost" in xvnc  # no TCP port for VNC
    assert xvnc[xvnc.index("-SecurityTypes") + 1] == "VncAuth"
    assert xvnc[xvnc.index("-PasswordFile") + 1] == str(place.password_file)
    assert "--web-auth" in web  # the page and its files ask for the gate's token too, not only the WebSocket
    # websockify listens on no address of its own: the gate hands it a loopback socket (`--inetd`).
    assert "--inetd" in web and not [word for word in web if word.endswith(":6080")]


def test_the_password_file_is_private_from_its_first_byte(tmp_path: Path) -> None:
    path = tmp_path / "vncpasswd"
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_private(path, b"\x01\x02")
    assert path.read_bytes() == b"\x01\x02" and path.stat().st_mode & 0o777 == 0o600


def test_the_desktops_programs_do_not_see_its_password(tmp_path: Path) -> None:
    running = desktop.Desktop(layout(tmp_path), {"HOME": "/root", "VL_DESKTOP_PASSWORD": PASSWORD}, PASSWORD)
    assert "VL_DESKTOP_PASSWORD" not in running.session_env and running.session_env["HOME"] == "/root"


def test_the_url_is_runpods_proxy_on_a_pod() -> None:
    assert desktop.desktop_url({"RUNPOD_POD_ID": "abc123"}, "0.0.0.0") == (
        "https://abc123-6080.proxy.runpod.net/vnc.html?autoconnect=1&resize=remote"
    )
    assert desktop.desktop_url({}, "0.0.0.0").startswith("http://127.0.0.1:6080/")


# --- the supervised child ------------------------------------------------------------------------------


def pod(tmp_path: Path, **variables: str) -> Pod:
    environ = {"VL_STATE_DIR": str(tmp_path), "VL_DESKTOP": "on", "VL_DESKTOP_PASSWORD": PASSWORD, **variables}
    return Pod(load_settings(environ), environ, PodHub())


def test_start_supervises_the_launcher_as_the_desktop_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(desktop, "missing_pieces", lambda: [])
    started: list[ChildSpec] = []
    running = pod(tmp_path)
    monkeypatch.setattr(running.supervisor, "start", started.append)
    running.children.start_desktop()
    (spec,) = started
    assert (spec.name, list(spec.argv)) == ("desktop", desktop.launcher_argv())
    assert spec.env is not None and spec.env["VL_DESKTOP_PASSWORD"] == PASSWORD  # the launcher reads it there
    # No other child sees it (nor the desktop's switch, which needs it): here a gateway's bridge, and the rest.
    gateway = pod(tmp_path, VL_ROLE="gateway", VL_WORKERS="http://10.0.0.2:8080", VL_WORKER_KEY="sk-gateway-0123456789")
    bridge = gateway.children.bridge_spec().env or {}
    assert bridge["VL_STATE_DIR"] == str(tmp_path) and not {"VL_DESKTOP", "VL_DESKTOP_PASSWORD"} & set(bridge)
    assert PASSWORD not in str(gateway.children.children_environ)


def test_an_image_without_the_desktop_refuses_it_in_one_line_before_vllm_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(desktop, "missing_pieces", lambda: ["Xvnc", "jwm"])
    running = pod(tmp_path)
    with pytest.raises(SettingsError) as refused:
        running.prepare()  # the first of `runtime start`'s steps: nothing launched yet
    assert str(refused.value) == (
        "VL_DESKTOP='on' is not allowed: expected off: this image has no desktop (missing Xvnc, jwm); build it "
        "from a target with desktop = true (docker/targets.toml)"
    )
    assert not running.supervisor.children


def test_off_starts_nothing(tmp_path: Path) -> None:
    running = pod(tmp_path, VL_DESKTOP="off")
    running.children.start_desktop()
    assert not running.supervisor.children


def test_the_refusal_names_every_piece_an_image_without_the_desktop_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda program: None)
    monkeypatch.setattr(desktop, "has_websockify", lambda: False)
    assert desktop.missing_pieces(Path("/nonexistent/novnc")) == [
        "Xvnc",
        "vncpasswd",
        "jwm",
        "xterm",
        "websockify",
        "noVNC (/nonexistent/novnc)",
    ]


# --- the password check websockify runs ----------------------------------------------------------------


@pytest.fixture
def check(monkeypatch: pytest.MonkeyPatch) -> desktop_auth.DesktopPassword:
    monkeypatch.setenv("THE_PASSWORD", PASSWORD)
    return desktop_auth.DesktopPassword("THE_PASSWORD")


def test_any_user_name_with_the_full_password_passes(check: desktop_auth.DesktopPassword) -> None:
    assert check.accepts(basic("anyone", PASSWORD)) and check.accepts(basic("", PASSWORD))
    assert check.accepts("basic " + basic("x", PASSWORD).split()[1])  # the scheme is case-insensitive


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        basic("anyone", PASSWORD[:8]),  # VNC's own check stops at 8 characters; this one does not
        basic("anyone", PASSWORD + "x"),
        basic("anyone", "wrong"),
        "Bearer " + PASSWORD,
        "Basic not-base64!",
        "Basic " + base64.b64encode(PASSWORD.encode()).decode(),  # no colon
    ],
)
def test_anything_else_fails(check: desktop_auth.DesktopPassword, header: str | None) -> None:
    assert not check.accepts(header)


def test_a_failure_is_websockifys_401_that_makes_a_browser_ask(
    check: desktop_auth.DesktopPassword, monkeypatch: pytest.MonkeyPatch
) -> None:
    """websockify (the distribution's, absent here) turns the error into the response: a stand-in of its class."""

    class AuthenticationError(Exception):
        def __init__(self, log_msg: str, response_code: int, response_headers: dict[str, str]) -> None:
            super().__init__(log_msg)
            self.code, self.headers = response_code, response_headers

    plugins = types.ModuleType("websockify.auth_plugins")
    plugins.AuthenticationError = AuthenticationError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "websockify", types.ModuleType("websockify"))
    monkeypatch.setitem(sys.modules, "websockify.auth_plugins", plugins)
    check.authenticate({"Authorization": basic("me", PASSWORD)}, None, None)
    with pytest.raises(AuthenticationError) as refused:
        check.authenticate({}, None, None)
    assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"].startswith("Basic realm=")
    assert PASSWORD not in str(refused.value)


def test_the_plugin_needs_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THE_PASSWORD", raising=False)
    with pytest.raises(SystemExit):
        desktop_auth.DesktopPassword("THE_PASSWORD")


# --- what the build side says of the same things ---------------------------------------------------------


def test_the_build_side_names_the_runtimes_port_and_page() -> None:
    """space/ may not import the runtime's modules: its copies of the two facts are compared here."""
    assert f"{desktop.PORT}/http" == runpod_template.DESKTOP_PORT
    assert str(desktop.NOVNC_DIR) == targets.NOVNC_DIR
