"""`python -m runtime desktop`: a Linux desktop in the browser (VL_DESKTOP=on), the pod's `desktop` child.

At https://<pod>-6080.proxy.runpod.net/ (RunPod's proxy, port 6080 exposed as http), noVNC's page shows an X
desktop: TigerVNC's Xvnc (an X server that is its own VNC server, so one process where the field notes ran
Xvfb and x11vnc, and one that follows the browser's window size: `resize=remote`), the JWM window manager
(a taskbar, a menu) and an xterm. websockify serves the page and carries the VNC stream over a WebSocket.

The port is public, so the password is checked twice, and appears in no command line (`ps` shows those to
everyone in the pod) and no log:
- websockify asks for it in full (HTTP Basic, any user name) before the page, its files or the WebSocket
  (runtime/desktop_auth.py): a browser asks once, then sends it with the WebSocket upgrade itself;
- Xvnc asks for it again (VNC's own check, of which only the first 8 characters count), from a 0600 file.
Xvnc listens on a 0600 Unix socket only, never on a network interface (the notes' x11vnc `-localhost`):
websockify, run by root, is its only way in.

This launcher starts the pieces in order (the X server, then what draws on it) and exits as soon as one
of them dies, so that the supervisor restarts the whole desktop (with its back-off, logged like any
child's death); on SIGTERM it stops them all (the supervisor signals its whole process group anyway).
After a container restart the desktop comes back with the pod, where the notes had to relaunch it by hand.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.settings import Settings, SettingsError, load_settings
from runtime.supervisor import exit_description

log = logging.getLogger("runtime.desktop")

PORT = 6080  # RunPod's template exposes it as 6080/http (space/runpod_template.py; a test compares)
PASSWORD_VARIABLE = "VL_DESKTOP_PASSWORD"
NOVNC_DIR = Path("/usr/share/novnc")  # where the image unpacks noVNC's page (space/targets.py; a test compares)
SYSTEM_PYTHON = "/usr/bin/python3"  # the distribution's python: websockify is its package, not the venv's
RUNTIME_ROOT = Path(__file__).resolve().parents[1]  # on websockify's path: its auth plugin is ours
AUTH_PLUGIN = "runtime.desktop_auth.DesktopPassword"
GEOMETRY = "1280x800"  # until the browser asks for its own window's size (noVNC's resize=remote)
HEARTBEAT_S = 30  # WebSocket pings on an idle desktop: proxies cut a silent connection after ~100 s
DISPLAY_TIMEOUT_S = 30.0  # Xvnc starts in well under a second; this only bounds a broken one
STOP_GRACE_S = 3.0  # the supervisor's own grace is 5 s: each piece gets its TERM before that
TERMINAL = ["xterm", "-fa", "Monospace", "-fs", "11"]  # a scalable font: the default bitmap one is tiny
URL_QUERY = "vnc.html?autoconnect=1&resize=remote"  # the image's index.html sends a browser there too

# The window manager's menu and taskbar, written at each start (Debian's default names programs the image
# lacks). "Log out" ends JWM, hence the desktop: the supervisor brings a fresh one (every window closed).
JWM_CONFIG = f"""<?xml version="1.0"?>
<JWM>
  <RootMenu onroot="123">
    <Program label="Terminal">{" ".join(TERMINAL)}</Program>
    <Separator/>
    <Restart label="Restart the window manager"/>
    <Exit label="Log out (a fresh desktop follows)" confirm="true"/>
  </RootMenu>
  <Tray x="0" y="-1" height="30" autohide="off">
    <TrayButton label="Menu">root:1</TrayButton>
    <TrayButton label="Terminal">exec:{" ".join(TERMINAL)}</TrayButton>
    <Pager labeled="true"/>
    <TaskList maxwidth="256"/>
    <Dock/>
    <Clock format="%H:%M"/>
  </Tray>
  <WindowStyle decorations="flat">
    <Font>Sans-10:bold</Font>
    <Foreground>#FFFFFF</Foreground><Background>#4A5560</Background>
    <Active><Foreground>#FFFFFF</Foreground><Background>#2B6CB0</Background></Active>
  </WindowStyle>
  <TrayStyle decorations="flat"><Font>Sans-10</Font><Foreground>#FFFFFF</Foreground><Background>#1F2933</Background></TrayStyle>
  <MenuStyle decorations="flat"><Font>Sans-10</Font><Foreground>#FFFFFF</Foreground><Background>#1F2933</Background>
    <Active><Foreground>#FFFFFF</Foreground><Background>#2B6CB0</Background></Active></MenuStyle>
  <Desktops width="2" height="1"><Background type="solid">#2E3440</Background></Desktops>
  <FocusModel>click</FocusModel>
  <Key mask="A" key="Tab">nextstacked</Key>
  <Key mask="A" key="F4">close</Key>
</JWM>
"""


@dataclass(frozen=True)
class DesktopLayout:
    """Where the desktop listens and keeps its files: a 0700 folder of the state directory."""

    folder: Path
    listen: str
    port: int = PORT
    web_dir: Path = NOVNC_DIR

    @classmethod
    def from_settings(cls, settings: Settings) -> DesktopLayout:
        return cls(Path(settings.state_dir) / "desktop", settings.listen)

    @property
    def socket(self) -> Path:
        """Xvnc's VNC socket (mode 0600): websockify's target."""
        return self.folder / "vnc.sock"

    @property
    def password_file(self) -> Path:
        return self.folder / "vncpasswd"

    @property
    def window_manager_config(self) -> Path:
        return self.folder / "jwmrc"

    @property
    def listen_address(self) -> str:
        host = f"[{self.listen}]" if ":" in self.listen else self.listen
        return f"{host}:{self.port}"


# --- the pieces' command lines (no secret in any) ----------------------------------------------------------


def xvnc_argv(layout: DesktopLayout, display_fd: int) -> list[str]:
    return [
        "Xvnc",
        "-displayfd",  # the first free display, written here once it accepts clients: our readiness signal,
        str(display_fd),  # and no clash with an X server of a host whose network the container shares
        "-geometry",
        GEOMETRY,
        "-depth",
        "24",
        "-desktop",
        "vllm-pod",  # the name noVNC shows
        "-rfbunixpath",  # VNC on a Unix socket only (mode 0600: root's)...
        str(layout.socket),
        "-rfbport",  # ...and on no TCP port,
        "-1",
        "-localhost",  # nor on anything but loopback should TCP ever be turned on (the notes' -localhost)
        "-nolisten",  # X11 itself: local clients only
        "tcp",
        "-SecurityTypes",  # VNC's own password (8 characters count), behind websockify's full one
        "VncAuth",
        "-PasswordFile",
        str(layout.password_file),
    ]


def window_manager_argv(layout: DesktopLayout) -> list[str]:
    return ["jwm", "-f", str(layout.window_manager_config)]


def websockify_argv(layout: DesktopLayout) -> list[str]:
    return [
        SYSTEM_PYTHON,
        "-m",
        "websockify",
        "--web",  # noVNC's page and files, served by websockify itself
        str(layout.web_dir),
        "--web-auth",  # the password before the page too, not only before the WebSocket
        "--auth-plugin",
        AUTH_PLUGIN,
        "--auth-source",  # the variable's *name*: its value stays out of argv
        PASSWORD_VARIABLE,
        "--unix-target",
        str(layout.socket),
        "--heartbeat",
        str(HEARTBEAT_S),
        layout.listen_address,
    ]


def launcher_argv() -> list[str]:
    """The supervisor's `desktop` child: this module, in the runtime's python."""
    return [sys.executable, "-m", "runtime", "desktop"]


# --- what the image must have --------------------------------------------------------------------------------


def missing_pieces(web_dir: Path = NOVNC_DIR) -> list[str]:
    """The desktop's programs this machine lacks (an image built from a target with `desktop = false` lacks
    them all); empty when the desktop can run."""
    missing = [program for program in ("Xvnc", "vncpasswd", "jwm", "xterm") if shutil.which(program) is None]
    if not has_websockify():
        missing.append("websockify")
    if not (web_dir / "vnc.html").is_file():
        missing.append(f"noVNC ({web_dir})")
    return missing


def has_websockify() -> bool:
    if not Path(SYSTEM_PYTHON).is_file():
        return False
    found = subprocess.run([SYSTEM_PYTHON, "-c", "import websockify"], capture_output=True, check=False)
    return found.returncode == 0


def check_desktop() -> None:
    """SettingsError (VL_DESKTOP) when this image cannot run the desktop."""
    if missing := missing_pieces():
        raise refusal(missing)


def refusal(missing: Sequence[str]) -> SettingsError:
    """`runtime start`'s one line when the image has no desktop."""
    return SettingsError(
        "VL_DESKTOP",
        "on",
        f"off: this image has no desktop (missing {', '.join(missing)}); build it from a target with "
        "desktop = true (docker/targets.toml)",
    )


def desktop_url(environ: Mapping[str, str], listen: str) -> str:
    """Where a user opens the desktop: RunPod's proxy URL on a pod, this machine's address elsewhere."""
    pod = environ.get("RUNPOD_POD_ID", "").strip()
    if pod:
        return f"https://{pod}-{PORT}.proxy.runpod.net/{URL_QUERY}"
    host = "127.0.0.1" if listen in ("0.0.0.0", "::") else listen
    return f"http://{f'[{host}]' if ':' in host else host}:{PORT}/{URL_QUERY}"


# --- the launcher ----------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        f"Reads VL_DESKTOP_PASSWORD, VL_STATE_DIR and VL_LISTEN; serves port {PORT}; exits when a piece dies "
        "(`runtime start` runs it as a child and restarts it); stops on SIGTERM."
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s desktop: %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    try:
        settings = load_settings(os.environ)
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    if not settings.desktop_password:
        print(SettingsError(PASSWORD_VARIABLE, "", "the desktop's password (its port is public)"), file=sys.stderr)
        return 2
    try:
        check_desktop()
    except SettingsError as error:
        print(error, file=sys.stderr)
        return 2
    return Desktop(DesktopLayout.from_settings(settings), os.environ, settings.desktop_password).run()


class Stopped(Exception):
    """SIGTERM or SIGINT: stop every piece and exit 0."""


def stop_on_signal(signum: int, frame: object) -> None:
    raise Stopped


class Desktop:
    """The running pieces; `run` returns once one of them died (1) or a signal asked to stop (0)."""

    def __init__(self, layout: DesktopLayout, environ: Mapping[str, str], password: str) -> None:
        self.layout, self.password = layout, password
        # What the desktop's programs (and the user's shells in it) see: the pod's environment, as SSH
        # sessions get it, but for the desktop's password.
        self.session_env = {name: value for name, value in environ.items() if name != PASSWORD_VARIABLE}
        self.essential: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}  # by pid: one dies, all stop
        self.others: list[subprocess.Popen[bytes]] = []  # the first terminal: the user may close it

    def run(self) -> int:
        signal.signal(signal.SIGTERM, stop_on_signal)
        signal.signal(signal.SIGINT, stop_on_signal)
        try:
            self.prepare()
            display = self.start_display()
            self.session_env["DISPLAY"] = f":{display}"
            self.start("jwm", window_manager_argv(self.layout), self.session_env)
            self.others.append(self.launch(TERMINAL, self.session_env))
            path = os.pathsep.join(filter(None, (str(RUNTIME_ROOT), self.session_env.get("PYTHONPATH"))))
            web_env = {**self.session_env, "PYTHONPATH": path, PASSWORD_VARIABLE: self.password}
            self.start("websockify", websockify_argv(self.layout), web_env)
            log.info("display :%s served on %s (noVNC: /%s)", display, self.layout.listen_address, URL_QUERY)
            return self.until_one_dies()
        except Stopped:
            log.info("stopping")
            return 0
        except (OSError, subprocess.SubprocessError, DisplayError) as error:
            log.error("the desktop could not start: %s", error)
            return 1
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the pieces' own TERMs follow
            self.stop_all()

    def prepare(self) -> None:
        """The 0700 folder with Xvnc's password file and JWM's configuration, rewritten at each start."""
        folder = self.layout.folder
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        self.layout.socket.unlink(missing_ok=True)  # a killed Xvnc leaves it behind
        obfuscated = subprocess.run(
            ["vncpasswd", "-f"], input=f"{self.password}\n".encode(), capture_output=True, check=True
        ).stdout  # from stdin to stdout: the password on no command line
        write_private(self.layout.password_file, obfuscated)
        self.layout.window_manager_config.write_text(JWM_CONFIG)

    def start_display(self) -> str:
        """Xvnc, and the display number it writes once it accepts clients."""
        reading, writing = os.pipe()
        try:
            self.start("Xvnc", xvnc_argv(self.layout, writing), self.session_env, pass_fds=(writing,))
        finally:
            os.close(writing)
        with os.fdopen(reading, "rb") as pipe:
            ready, _, _ = select.select([pipe], [], [], DISPLAY_TIMEOUT_S)
            display = pipe.readline().decode().strip() if ready else ""
        if not display.isdigit():
            raise DisplayError(f"Xvnc gave no display within {DISPLAY_TIMEOUT_S:g} s (its output is above)")
        return display

    def launch(
        self, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = ()
    ) -> subprocess.Popen[bytes]:
        """A piece in the user's home (a terminal opens there); its output goes to the desktop's log."""
        home = Path(env.get("HOME") or "/")
        return subprocess.Popen(list(argv), env=dict(env), cwd=home if home.is_dir() else "/", pass_fds=pass_fds)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = ()) -> None:
        process = self.launch(argv, env, pass_fds)
        self.essential[process.pid] = (name, process)
        log.info("%s started (pid %d)", name, process.pid)

    def until_one_dies(self) -> int:
        """Reaps children (a closed terminal among them) until one the desktop needs exits."""
        while True:
            pid, status = os.wait()
            if pid in self.essential:
                name, process = self.essential.pop(pid)
                process.returncode = status = os.waitstatus_to_exitcode(status)
                log.warning("%s %s: stopping the desktop (the pod restarts it)", name, exit_description(status))
                return 1
            for other in self.others:
                if other.pid == pid:
                    other.returncode = os.waitstatus_to_exitcode(status)

    def stop_all(self) -> None:
        running = [process for _, process in self.essential.values()] + self.others
        for process in running:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class DisplayError(RuntimeError):
    """Xvnc did not come up."""


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to a file only its owner can read, never readable by others even for a moment."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), 0o600)  # an older file of another mode keeps its mode through O_CREAT
        file.write(data)
