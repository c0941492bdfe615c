"""The browser desktop in the cpu image, run as a pod runs it (its own entrypoint, VL_DESKTOP=on, a password):
noVNC's page on 6080 behind the full password, a real Chromium that connects and sees the desktop (its
screenshot kept as an artifact), no password in any command line or log, the desktop back after a piece of it
is killed, SIGTERM stopping it all; and VL_DESKTOP=on refused without a password.

Reuses the session's cpu image (tests/support/images.py). Slow: marked `docker`, run with the image tests.
"""

from __future__ import annotations

import base64
import io
import os
import re
import secrets
import shutil
import socket
import tarfile
import time
from collections.abc import Iterator

import httpx
import pytest
from docker.models.containers import Container
from PIL import Image
from playwright.sync_api import Browser
from websockets.sync.client import connect

from runtime.pod.desktop import PORT
from tests.support.images import Engine, report
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.websocket import refused_upgrade

pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

PASSWORD = f"desk-{secrets.token_hex(12)}"  # random: any trace of it in a log or argv can only be a leak
URL = f"http://127.0.0.1:{PORT}"
PAGE = f"{URL}/vnc.html?autoconnect=1&resize=remote&password={PASSWORD}"  # noVNC's own (VNC) password
STATE_DIR = "/var/lib/vlpod"  # the image's VL_STATE_DIR
VIEWPORT = {"width": 1100, "height": 700}
UP_TIMEOUT_S = 180  # the desktop starts in a second; the container shares two cores with vLLM's start
TYPED = "typed-in-the-browser"
NOVNC_UNCOVERED = """() => !["noVNC_status", "noVNC_control_bar"].some(
    id => document.getElementById(id).classList.contains("noVNC_open")) && document.getAnimations().length === 0"""
NO_PASSWORD_LINE = (
    "VL_DESKTOP='on' is not allowed: expected off while VL_DESKTOP_PASSWORD is empty (the desktop's port is public)"
)

# (pid, command line) of each process in the container, read from /proc (`docker top` cuts lines short).
LIST_PROCESSES = """
import os, pathlib
for entry in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
    if entry.parent.name != str(os.getpid()):
        try:
            print(entry.parent.name, entry.read_bytes().replace(bytes(1), b" ").decode(errors="replace").strip())
        except OSError:
            pass
"""
# (pid, command line) of each process whose environment has a VL_DESKTOP_PASSWORD (no password on any command line).
PASSWORD_HOLDERS = """
import os, pathlib
for entry in pathlib.Path("/proc").glob("[0-9]*/environ"):
    if entry.parent.name == str(os.getpid()):
        continue
    try:
        environ = entry.read_bytes().split(bytes(1))
        line = (entry.parent / "cmdline").read_bytes().replace(bytes(1), b" ").decode(errors="replace").strip()
    except OSError:
        continue
    if any(v.startswith(b"VL_DESKTOP_PASSWORD=") and len(v) > 20 for v in environ):
        print(entry.parent.name, line)
"""
SILENT_CONNECTIONS = 200
# The TCP ports a process listens on: its socket inodes matched against the kernel's LISTEN table.
LISTENING_PORTS = """
import os, sys
pid = sys.argv[1]
inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
          if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for row in open(table).read().splitlines()[1:]:
        fields = row.split()
        if fields[3] == "0A" and fields[9] in inodes:
            print(int(fields[1].rsplit(":", 1)[1], 16))
"""


def auth(user: str = "anyone", password: str = PASSWORD) -> httpx.BasicAuth:
    return httpx.BasicAuth(user, password)


def processes(container: Container) -> list[tuple[int, str]]:
    code, output = container.exec_run(["python", "-c", LIST_PROCESSES])
    assert code == 0, output
    return [(int(pid), line) for pid, _, line in (row.partition(" ") for row in output.decode().splitlines())]


def pids_of(container: Container, program: str) -> list[int]:
    return [pid for pid, line in processes(container) if line.split(" ", 1)[0].endswith(program)]


def state_file(container: Container, name: str) -> str:
    code, output = container.exec_run(["cat", f"{STATE_DIR}/{name}"])
    assert code == 0, output
    return output.decode(errors="replace")


def launcher_pid(container: Container) -> int | None:
    """The desktop child's pid, from the supervisor's pid file (absent between a death and the relaunch)."""
    code, output = container.exec_run(["cat", f"{STATE_DIR}/desktop.pid"])
    return int(output) if code == 0 else None


def state_files(container: Container) -> dict[str, bytes]:
    """Every file of the pod's state directory (its logs among them), read through Docker's archive API."""
    stream, _ = container.get_archive(STATE_DIR)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        return {member.name: archive.extractfile(member).read() for member in archive.getmembers() if member.isfile()}


def page_answers() -> bool:
    try:
        return httpx.get(f"{URL}/vnc.html", timeout=5).status_code == 401
    except httpx.TransportError:
        return False


def wait_for_desktop(container: Container) -> None:
    def up() -> bool:
        container.reload()
        assert container.status == "running", container.logs(tail=40).decode(errors="replace")
        return page_answers()

    wait_until(up, f"the desktop's page on port {PORT}", UP_TIMEOUT_S, every_s=0.5)


@pytest.fixture(scope="module")
def pod(image_engine: Engine, cpu_image: str, request: pytest.FixtureRequest) -> Iterator[Container]:
    """The image with its own entrypoint on the host's network (the private engine has no bridge network)."""
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", PORT)) != 0, f"port {PORT} is taken on this machine: the test needs it"
    environment = {
        "VL_DESKTOP": "on",
        "VL_DESKTOP_PASSWORD": PASSWORD,
        "VL_LISTEN": "127.0.0.1",
        "VL_PORT": str(free_port()),
        "VL_ENGINE_PORT": str(free_port()),
        "RUNPOD_POD_ID": "desktop-pod",
    }
    started = time.monotonic()
    # shm_size: the default 64 MiB kills vLLM's CPU engine, which starts alongside.
    container = image_engine[1].containers.run(
        cpu_image, detach=True, network_mode="host", environment=environment, shm_size="1g"
    )
    try:
        wait_for_desktop(container)
        report(request, f"desktop: container start → noVNC's page answers: {time.monotonic() - started:.0f} s")
        yield container
    finally:
        container.remove(force=True)


def test_the_page_and_the_websocket_need_the_full_password(pod: Container) -> None:
    refused = httpx.get(f"{URL}/vnc.html")
    assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic realm=")
    assert httpx.get(f"{URL}/vnc.html", auth=auth(password=PASSWORD[:8])).status_code == 401  # VNC's 8 are not enough
    assert httpx.get(f"{URL}/core/rfb.js").status_code == 401  # the page's files too
    page = httpx.get(f"{URL}/vnc.html", auth=auth())
    assert page.status_code == 200 and "noVNC" in page.text
    index = httpx.get(f"{URL}/", auth=auth("someone-else"))  # any user name
    assert index.status_code == 200 and "vnc.html?autoconnect=1&amp;resize=remote" in index.text
    assert refused_upgrade(URL, "/websockify").status_code == 401
    headers = {"Authorization": "Basic " + base64.b64encode(f"anyone:{PASSWORD}".encode()).decode()}
    with connect(f"ws://127.0.0.1:{PORT}/websockify", additional_headers=headers, proxy=None) as vnc:
        assert vnc.recv(timeout=30) == b"RFB 003.008\n"  # Xvnc's greeting, through websockify


def test_chromium_connects_and_sees_the_desktop(
    pod: Container, browser: Browser, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    """As a user: the browser is given the password once (its Basic dialog) and sends it with the WebSocket
    upgrade by itself; the desktop takes the window's size (resize=remote); the screenshot is kept."""
    context = browser.new_context(viewport=VIEWPORT, http_credentials={"username": "me", "password": PASSWORD})
    page = context.new_page()
    sockets: list[str] = []
    page.on("websocket", lambda websocket: sockets.append(websocket.url))
    try:
        assert page.goto(PAGE).status == 200
        status = page.locator("#noVNC_status")
        wait_until(lambda: "Connected" in (status.text_content() or ""), "noVNC to connect", 60, every_s=0.5)
        canvas = page.locator("#noVNC_container canvas")
        size = {"width": VIEWPORT["width"], "height": VIEWPORT["height"]}
        wait_until(
            lambda: canvas.evaluate("c => ({width: c.width, height: c.height})") == size,
            "the desktop to take the browser window's size",
            30,
            every_s=0.5,
        )
        # Work in it: a click into the terminal the desktop opens with, a command typed on the page's keyboard.
        page.mouse.click(VIEWPORT["width"] // 3, VIEWPORT["height"] // 3)
        page.keyboard.type(f"echo {TYPED} > /tmp/desktop-typed; ls /opt\n")
        wait_until(
            lambda: pod.exec_run(["cat", "/tmp/desktop-typed"]).output == f"{TYPED}\n".encode(),
            "the command typed in the browser to run in the pod",
            60,
            every_s=0.5,
        )
        wait_until(  # noVNC's connection banner and side bar fold away by themselves: a clean screenshot
            lambda: page.evaluate(NOVNC_UNCOVERED), "noVNC's banner and side bar to fold away", 30, every_s=0.5
        )
        artifacts = tmp_path_factory.mktemp("desktop")
        shot = artifacts / "desktop.png"

        def drawn() -> bool:  # the taskbar, a terminal and its text: far more than a blank screen's colours
            page.screenshot(path=shot)
            with Image.open(shot) as image:
                return len(image.convert("RGB").getcolors(maxcolors=1 << 16) or ()) > 40

        wait_until(drawn, "the desktop drawn in the page", 60, every_s=1.0)
        if target := os.environ.get("DESKTOP_SCREENSHOT"):
            shutil.copy(shot, target)
        report(request, f"desktop screenshot: {shot}")
        assert sockets == [f"ws://127.0.0.1:{PORT}/websockify"]
    finally:
        context.close()


def test_the_password_is_in_no_command_line_log_or_printout(pod: Container) -> None:
    lines = [line for _, line in processes(pod)]
    assert any("-m runtime desktop" in line for line in lines) and any("websockify" in line for line in lines)
    assert not [line for line in lines if PASSWORD in line]
    assert PASSWORD not in pod.logs().decode(errors="replace")
    files = state_files(pod)
    assert any(name.endswith("desktop.log") for name in files)
    assert [name for name, content in files.items() if PASSWORD.encode() in content] == []
    code, output = pod.exec_run(["python", "-m", "runtime", "settings"])
    assert code == 0 and "VL_DESKTOP_PASSWORD='***'" in output.decode() and PASSWORD not in output.decode()
    for program in ("Xvnc", "jwm", "xterm"):  # the desktop's programs, and the user's shells, do not see it
        environ = live_environment(pod, program)
        assert b"VL_DESKTOP_PASSWORD" not in environ and b"HOME=" in environ, program


def live_environment(container: Container, program: str) -> bytes:
    """The environment of the one running `program`: a process on its way out reads as empty (once, in CI, the
    terminal), so it is read again until one lives; the desktop's log says why if none does."""
    environs: list[bytes] = []

    def read() -> bool:
        environs[:] = [
            container.exec_run(["cat", f"/proc/{pid}/environ"]).output  # type: ignore[misc]  # not streamed: bytes
            for pid in pids_of(container, program)
        ]
        return len(environs) == 1 and environs[0] != b""

    try:
        wait_until(read, f"one running {program}", 30, every_s=0.5)
    except AssertionError as error:
        log = state_files(container).get("vlpod/desktop.log", b"").decode(errors="replace")
        raise AssertionError(f"{error}; {len(environs)} found; the desktop's log ends:\n{log[-2000:]}") from None
    return environs[0]


def test_vnc_listens_on_a_private_socket_only(pod: Container) -> None:
    (xvnc,) = pids_of(pod, "Xvnc")
    code, output = pod.exec_run(["python", "-c", LISTENING_PORTS, str(xvnc)])
    assert code == 0 and output.decode().split() == [], f"Xvnc listens on TCP ports {output.decode().split()}"
    code, output = pod.exec_run(["stat", "-c", "%a %F %n", f"{STATE_DIR}/desktop", *(
        f"{STATE_DIR}/desktop/{name}" for name in ("vnc.sock", "vncpasswd"))])  # fmt: skip
    assert code == 0 and output.decode().splitlines() == [
        f"700 directory {STATE_DIR}/desktop",
        f"600 socket {STATE_DIR}/desktop/vnc.sock",
        f"600 regular file {STATE_DIR}/desktop/vncpasswd",
    ]


def test_no_process_but_the_pod_and_the_desktops_launcher_holds_the_password(pod: Container) -> None:
    """websockify, vLLM, the bridge, sshd, the desktop's programs: none has it in its environment (the gate
    gives websockify a token of its own; the pod gives its other children an environment without it)."""
    code, output = pod.exec_run(["python", "-c", PASSWORD_HOLDERS])
    # Docker's HEALTHCHECK runs in the container's environment, as this listing does (which leaves itself out).
    holders = sorted(line.split(" ", 1)[1] for line in output.decode().splitlines() if "runtime.health" not in line)
    assert code == 0 and holders == [
        "/opt/venv/bin/python -m runtime desktop",
        "/opt/venv/bin/python -m runtime start",
        "/usr/bin/tini -- /opt/venv/bin/python -m runtime start",
    ], holders


def test_silent_connections_fork_nothing_and_never_keep_the_owner_out(
    pod: Container, request: pytest.FixtureRequest
) -> None:
    """websockify forked a process for each connection and waited for its head for ever (200 silent ones:
    200 processes, 479 MB); then the gate's cap on them turned the owner away too (503). The gate holds them itself,
    the oldest closed for a newcomer, and hands on none: the owner still gets in."""
    silent = [socket.create_connection(("127.0.0.1", PORT)) for _ in range(SILENT_CONNECTIONS)]
    try:
        assert httpx.get(f"{URL}/vnc.html", auth=auth()).status_code == 200
        forks = [line for _, line in processes(pod) if "-m websockify" in line]
        report(request, f"desktop: {SILENT_CONNECTIONS} silent connections → {len(forks)} websockify process(es)")
        assert len(forks) == 1, forks  # its listener alone
    finally:
        for connection in silent:
            connection.close()


def test_repeated_wrong_passwords_are_slowed_and_the_right_one_never_is(pod: Container) -> None:
    """82 guesses a second went through; then 5 from an address, then one every 3 s (20 in all, then one a
    second), and while slowed not even the right password was checked: behind RunPod's proxy, where every user has
    the proxy's address, 8 wrong guesses locked the owner out. The right password is checked first and never
    slowed. Last but for the tests that restart the desktop (a fresh gate forgets): the page still asks a browser
    for the password meanwhile."""
    answers = [httpx.get(f"{URL}/vnc.html", auth=auth(password=f"guess-{n}")).status_code for n in range(6)]
    assert answers[-1] == 429 and set(answers[:-1]) <= {401, 429}, answers  # 1 wrong one before this test
    assert httpx.get(f"{URL}/vnc.html", auth=auth()).status_code == 200
    slowed = httpx.get(f"{URL}/vnc.html", auth=auth(password="guess-6"))
    assert slowed.status_code == 429 and 1 <= int(slowed.headers["retry-after"]) <= 3
    assert page_answers()  # no password: the browser's first request, answered 401 as ever


@pytest.mark.parametrize("victim", ["Xvnc", "launcher"])
def test_the_desktop_comes_back_when_a_piece_of_it_dies(pod: Container, victim: str) -> None:
    launcher = launcher_pid(pod)
    pid = launcher if victim == "launcher" else pids_of(pod, "Xvnc")[0]
    assert pod.exec_run(["kill", "-KILL", str(pid)]).exit_code == 0
    wait_until(
        lambda: launcher_pid(pod) not in (None, launcher),
        "the supervisor to launch the desktop again",
        60,
        every_s=0.5,
    )
    wait_for_desktop(pod)
    assert len(pids_of(pod, "Xvnc")) == 1 and len(pids_of(pod, "jwm")) == 1  # the old group went with it
    log = pod.logs().decode(errors="replace")
    assert re.search(r"desktop (was killed by SIGKILL|exited with code 1).*; restarting in \d+ s", log), log[-2000:]


def test_sigterm_stops_the_whole_desktop(pod: Container) -> None:
    started = time.monotonic()
    pod.stop(timeout=20)
    assert time.monotonic() - started < 15, "a child ignored SIGTERM until Docker's kill"
    last_launch = state_files(pod)["vlpod/desktop.log"].decode(errors="replace").rsplit("\n--- ", 1)[-1]
    assert "desktop: stopping" in last_launch, last_launch[-1500:]


def test_on_without_a_password_refuses_to_start(image_engine: Engine, cpu_image: str) -> None:
    container = image_engine[1].containers.run(
        cpu_image, detach=True, network_mode="host", environment={"VL_DESKTOP": "on"}
    )
    try:
        assert container.wait(timeout=120)["StatusCode"] == 2
        assert container.logs().decode().splitlines() == [NO_PASSWORD_LINE]
    finally:
        container.remove(force=True)
