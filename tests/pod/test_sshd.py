"""A real OpenSSH server, configured by runtime.pod.sshd, and a real `ssh` client with a generated key."""

from __future__ import annotations

import logging
import socket
import subprocess
from pathlib import Path

import pytest

from runtime.pod import sshd
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.ssh import ssh_argv

pytestmark = pytest.mark.slow  # a real sshd and ssh client


def greets(port: int) -> bool:
    """sshd listens and greets with its SSH-2.0 banner (RFC 4253 §4.2): ready for a client."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection, connection.makefile("rb") as hello:
            return hello.read(8) == b"SSH-2.0-"
    except OSError:
        return False


def make_key_pair(directory: Path, name: str = "client_key") -> Path:
    key = directory / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def layout_in(directory: Path) -> sshd.SshdLayout:
    return sshd.SshdLayout(
        config_file=directory / "state" / "sshd_config",
        host_key_dir=directory / "hostkeys",
        authorized_keys=directory / "home" / ".ssh" / "authorized_keys",
        environment_file=directory / "profile.d" / "pod-environment.sh",
        port=free_port(),
        listen="127.0.0.1",
        strict_modes=False,  # the temp dir sits under the world-writable /tmp
    )


def ssh(port: int, *options: str, command: str = "true") -> subprocess.CompletedProcess[str]:
    return subprocess.run(ssh_argv(port, *options, command=command), capture_output=True, text=True, timeout=30)


@pytest.fixture
def running_sshd(tmp_path: Path):
    key = make_key_pair(tmp_path)
    layout = layout_in(tmp_path)
    environ = {
        "PUBLIC_KEY": key.with_suffix(".pub").read_text(),
        "POD_GREETING": 'it\'s a "pod" with spaces',
        "PATH": "/opt/venv/bin:/usr/local/bin:/usr/bin:/bin",
    }
    argv = sshd.prepare_sshd(layout, environ)
    assert argv is not None
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: greets(layout.port), "sshd's greeting")
        yield layout, key, environ
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_key_login_sees_the_pod_environment(running_sshd) -> None:
    layout, key, environ = running_sshd
    result = ssh(layout.port, "-i", str(key), command='printf "%s|%s|%s" "$POD_GREETING" "$PATH" "${PUBLIC_KEY-unset}"')
    assert result.returncode == 0, result.stderr
    greeting, path, public_key = result.stdout.split("|")
    assert greeting == environ["POD_GREETING"]
    assert environ["PATH"] in path  # the user's ~/.bashrc may prepend to it
    assert public_key == "unset"


def test_login_shells_can_source_the_environment_file(running_sshd) -> None:
    layout, key, environ = running_sshd
    result = ssh(
        layout.port, "-i", str(key), command=f"env -i bash -c '. {layout.environment_file}; echo \"$POD_GREETING\"'"
    )
    assert result.stdout.strip() == environ["POD_GREETING"]
    assert "PUBLIC_KEY" not in layout.environment_file.read_text()


def test_password_and_keyboard_interactive_are_refused(running_sshd) -> None:
    layout, _, _ = running_sshd
    result = ssh(
        layout.port, "-o", "PubkeyAuthentication=no", "-o", "PreferredAuthentications=password,keyboard-interactive"
    )
    assert result.returncode == 255
    # The parenthesised list is what the server offers: public keys and nothing else.
    assert "Permission denied (publickey)" in result.stderr


def test_an_unknown_key_is_refused(running_sshd, tmp_path: Path) -> None:
    layout, _, _ = running_sshd
    stranger = make_key_pair(tmp_path, "stranger_key")
    result = ssh(layout.port, "-i", str(stranger), "-o", "IdentitiesOnly=yes")
    assert result.returncode == 255
    assert "Permission denied (publickey)" in result.stderr


def test_host_keys_are_made_once_for_each_current_type(running_sshd) -> None:
    layout, _, environ = running_sshd
    keys = sorted(p.name for p in layout.host_key_dir.glob("ssh_host_*_key"))
    assert keys == ["ssh_host_ecdsa_key", "ssh_host_ed25519_key", "ssh_host_rsa_key"]
    before = {p: p.read_bytes() for p in layout.host_key_dir.iterdir()}
    sshd.prepare_sshd(layout, environ)  # a container restart keeps its disk: same keys, same fingerprint
    assert {p: p.read_bytes() for p in layout.host_key_dir.iterdir()} == before
    assert layout.authorized_keys.read_text().count("ssh-ed25519") == 1


def test_ssh_public_key_is_accepted_too(tmp_path: Path) -> None:
    layout = layout_in(tmp_path)
    assert sshd.prepare_sshd(layout, {"SSH_PUBLIC_KEY": "ssh-ed25519 AAAA pod"}) is not None
    assert layout.authorized_keys.read_text() == "ssh-ed25519 AAAA pod\n"


def test_no_key_means_no_sshd_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    layout = layout_in(tmp_path)
    with caplog.at_level(logging.INFO):
        assert sshd.prepare_sshd(layout, {"PATH": "/usr/bin"}) is None
    assert [r.getMessage() for r in caplog.records] == [
        "sshd not started: set PUBLIC_KEY or SSH_PUBLIC_KEY to log in over SSH"
    ]
    assert not layout.config_file.exists() and not layout.host_key_dir.exists()
