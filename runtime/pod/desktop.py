"""`python -m runtime desktop`: a Linux desktop in the browser (VL_DESKTOP=on), the pod's `desktop` child.

At https://<pod>-6080.proxy.runpod.net/ (RunPod's proxy, port 6080 exposed as http), noVNC's page shows an X
desktop: TigerVNC's Xvnc (an X server that is its own VNC server, so one process where the field notes ran
Xvfb and x11vnc, and one that follows the browser's window size: `resize=remote`), the JWM window manager
(a taskbar, a menu) and an xterm. websockify serves the page and carries the VNC stream over a WebSocket.

The port is public, so the password is checked twice, and appears in no command line (`ps` shows those to
everyone in the pod), no log and no other process's environment:
- this launcher's gate (runtime/pod/desktop_gate.py) holds port 6080: it asks for the password in full (HTTP
  Basic, any user name) before the page, its files or the WebSocket (a browser asks once, then sends it with
  the WebSocket upgrade itself), bounds each head's time and size and the connections open, and slows
  repeated wrong passwords; only then does websockify see the request, on a loopback port, with a token
  drawn at each start in place of the password (websockify forks a process per connection: none is forked
  for a client the gate has not let in);
- Xvnc asks for it again (VNC's own check, of which only the first 8 characters count), from a 0600 file
  in a 0700 folder. That file is VNC's: the password obfuscated with a key every VNC program knows, so
  readable by root alone, as everything in the pod that root can read.
Xvnc listens on a 0600 Unix socket only, never on a network interface (the notes' x11vnc `-localhost`):
websockify, run by root, is its only way in.

This launcher starts the pieces in order (the X server, then what draws on it) and exits as soon as one
of them dies, so that the supervisor restarts the whole desktop (with its back-off, logged like any
child's death); on SIGTERM it stops them all (the supervisor signals its whole process group anyway).
After a container restart the desktop comes back with the pod, where the notes had to relaunch it by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.pod.desktop_gate import MAX_HEAD_BYTES, Gate
from runtime.pod.supervisor import exit_description
from runtime.runpod.proxy import DESKTOP_PORT, proxy_url
from runtime.settings import Settings, SettingsError, load_settings
from runtime.state.statefile import write_private

log = logging.getLogger("runtime.pod.desktop")

PORT = DESKTOP_PORT  # RunPod's template exposes it as 6080/http (space/runpod_template.py)
PASSWORD_VARIABLE = "VL_DESKTOP_PASSWORD"
GATE_TOKEN_VARIABLE = "VL_DESKTOP_GATE_TOKEN"  # websockify's secret: drawn at each start, never the password
NOVNC_DIR = Path("/usr/share/novnc")  # where the image unpacks noVNC's page (space/targets.py; a test compares)
SYSTEM_PYTHON = "/usr/bin/python3"  # the distribution's python: websockify is its package, not the venv's
RUNTIME_ROOT = Path(__file__).resolve().parents[1]  # on websockify's path: its auth plugin is ours
AUTH_PLUGIN = "runtime.pod.desktop_auth.DesktopPassword"
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
        "--inetd",  # its listening socket from the launcher, on its stdin: loopback, behind the gate
        "--web",  # noVNC's page and files, served by websockify itself
        str(layout.web_dir),
        "--web-auth",  # the gate's token before the page too, not only before the WebSocket
        "--auth-plugin",
        AUTH_PLUGIN,
        "--auth-source",  # the variable's *name*: its value stays out of argv
        GATE_TOKEN_VARIABLE,
        "--unix-target",
        str(layout.socket),
        "--heartbeat",
        str(HEARTBEAT_S),
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
        return f"{proxy_url(pod, PORT, environ)}/{URL_QUERY}"
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


class Desktop:
    """The running pieces behind the gate; `run` returns once one of them died (1) or a signal asked to stop (0)."""

    def __init__(self, layout: DesktopLayout, environ: Mapping[str, str], password: str) -> None:
        self.layout, self.password = layout, password
        # What the desktop's programs (and the user's shells in it) see: the pod's environment, as SSH
        # sessions get it, but for the desktop's password.
        self.session_env = {name: value for name, value in environ.items() if name != PASSWORD_VARIABLE}
        self.essential: dict[str, asyncio.subprocess.Process] = {}  # one dies, all stop
        self.others: list[asyncio.subprocess.Process] = []  # the first terminal: the user may close it

    def run(self) -> int:
        return asyncio.run(self.serve())

    async def serve(self) -> int:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        try:
            # The public port first: taken by another program, the desktop says so before starting anything.
            v6 = ":" in self.layout.listen  # `::` takes IPv4 clients too, as everywhere in the pod
            family, both = (socket.AF_INET6, socket.has_dualstack_ipv6()) if v6 else (socket.AF_INET, False)
            public = socket.create_server((self.layout.listen, self.layout.port), family=family, dualstack_ipv6=both)
            gate = Gate(self.password, *await self.start_pieces())
            door = await asyncio.start_server(gate.serve_client, sock=public, limit=MAX_HEAD_BYTES)
        except (OSError, subprocess.SubprocessError, DisplayError) as error:
            log.error("the desktop could not start: %s", error)
            await self.stop_all()
            return 1
        log.info("served on %s behind its gate (noVNC: /%s)", self.layout.listen_address, URL_QUERY)
        try:
            return await self.until_one_dies(stopping)
        finally:
            door.close()
            await self.stop_all()

    async def start_pieces(self) -> tuple[tuple[str, int], str]:
        """Xvnc, the window manager, a terminal and websockify, on a loopback port of the kernel's choosing
        (its listening socket handed to it): that address, and the token websockify takes."""
        self.prepare()
        display = await self.start_display()
        self.session_env["DISPLAY"] = f":{display}"
        await self.start("jwm", window_manager_argv(self.layout), self.session_env)
        self.others.append(await self.launch(TERMINAL, self.session_env))
        token = secrets.token_urlsafe(32)
        path = os.pathsep.join(filter(None, (str(RUNTIME_ROOT), self.session_env.get("PYTHONPATH"))))
        web_env = {**self.session_env, "PYTHONPATH": path, GATE_TOKEN_VARIABLE: token}
        with socket.create_server(("127.0.0.1", 0)) as listening:
            await self.start("websockify", websockify_argv(self.layout), web_env, stdin=listening.fileno())
            return ("127.0.0.1", listening.getsockname()[1]), token

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

    async def start_display(self) -> str:
        """Xvnc, and the display number it writes once it accepts clients."""
        reading, writing = os.pipe()
        try:
            await self.start("Xvnc", xvnc_argv(self.layout, writing), self.session_env, pass_fds=(writing,))
        finally:
            os.close(writing)
        with os.fdopen(reading, "rb") as pipe:
            readable, _, _ = await asyncio.to_thread(select.select, [pipe], [], [], DISPLAY_TIMEOUT_S)
            display = pipe.readline().decode().strip() if readable else ""
        if not display.isdigit():
            raise DisplayError(f"Xvnc gave no display within {DISPLAY_TIMEOUT_S:g} s (its output is above)")
        return display

    async def launch(
        self, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = (), stdin: int | None = None
    ) -> asyncio.subprocess.Process:
        """A piece in the user's home (a terminal opens there); its output goes to the desktop's log."""
        home = Path(env.get("HOME") or "/")
        return await asyncio.create_subprocess_exec(
            *argv, env=dict(env), cwd=home if home.is_dir() else "/", pass_fds=pass_fds, stdin=stdin
        )

    async def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        pass_fds: Sequence[int] = (),
        stdin: int | None = None,
    ) -> None:
        process = await self.launch(argv, env, pass_fds, stdin)
        self.essential[name] = process
        log.info("%s started (pid %d)", name, process.pid)

    async def until_one_dies(self, stopping: asyncio.Event) -> int:
        """0 once a signal asks to stop; 1 once a piece the desktop needs exits (a closed terminal is not one)."""
        waits = {asyncio.ensure_future(process.wait()): name for name, process in self.essential.items()}
        asked = asyncio.ensure_future(stopping.wait())
        done, _ = await asyncio.wait([asked, *waits], return_when=asyncio.FIRST_COMPLETED)
        for task in [asked, *waits]:
            task.cancel()
        if asked in done:
            log.info("stopping")
            return 0
        name = next(waits[task] for task in done if task in waits)
        status = self.essential[name].returncode
        log.warning("%s %s: stopping the desktop (the pod restarts it)", name, exit_description(status or 0))
        return 1

    async def stop_all(self) -> None:
        running = [process for process in (*self.essential.values(), *self.others) if process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        try:
            await asyncio.wait_for(asyncio.gather(*(process.wait() for process in running)), STOP_GRACE_S)
        except TimeoutError:
            for process in running:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            await asyncio.gather(*(process.wait() for process in running))


class DisplayError(RuntimeError):
    """Xvnc did not come up."""
