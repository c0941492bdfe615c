"""sshd for the pod: key login only, fresh host keys, and the pod's environment in every session.

Like RunPod's start.sh: the key comes from `PUBLIC_KEY` or `SSH_PUBLIC_KEY`, host keys are made at
start (the image ships none), and the environment is written to a file that login shells source.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.settings import ENVIRONMENT_FILE_HEADER
from runtime.state.statefile import write_private

KEY_VARIABLES = ("PUBLIC_KEY", "SSH_PUBLIC_KEY")  # RunPod documents both
HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")  # DSA is gone from current OpenSSH
# Set per session by sshd or the login shell: copying the pod's values would be wrong.
SESSION_VARIABLES = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "MAIL", "PWD", "OLDPWD", "SHLVL", "TERM", "_"})
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PRIVSEP_DIR = Path("/run/sshd")  # compiled into Debian's sshd; it refuses to start as root without it

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SshdLayout:
    """Where sshd's files go: the image's paths in a pod, a temp dir in tests."""

    config_file: Path  # the sshd_config we generate
    host_key_dir: Path
    authorized_keys: Path
    environment_file: Path  # `export` lines for login shells: in /etc/profile.d/ (RunPod: /etc/rp_environment)
    port: int
    listen: str = "0.0.0.0"
    strict_modes: bool = True  # off only where the key file lives under a world-writable dir (tests)


def authorized_keys_from(environ: Mapping[str, str]) -> list[str]:
    """The public keys given to the pod, one per line, without duplicates."""
    keys = (line.strip() for name in KEY_VARIABLES for line in environ.get(name, "").splitlines())
    return list(dict.fromkeys(key for key in keys if key))


def session_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The pod's environment as SSH sessions should see it: minus the keys and per-session names."""
    return {
        name: value
        for name, value in environ.items()
        if NAME.fullmatch(name)
        and name not in KEY_VARIABLES
        and name not in SESSION_VARIABLES
        and not name.startswith("SSH_")
    }


def sshd_binary() -> str:
    """sshd's absolute path (it refuses to re-exec itself otherwise); /usr/sbin is often off PATH."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    found = shutil.which("sshd", path=search)
    if found is None:
        raise FileNotFoundError("sshd is not installed (Debian: apt-get install openssh-server)")
    return found


def prepare_sshd(layout: SshdLayout, environ: Mapping[str, str]) -> list[str] | None:
    """Write keys, environment and config; return sshd's argv, or None when no public key was given."""
    keys = authorized_keys_from(environ)
    if not keys:
        log.warning("sshd not started: set PUBLIC_KEY or SSH_PUBLIC_KEY to log in over SSH")
        return None
    binary = sshd_binary()
    host_keys = [generate_host_key(layout.host_key_dir, kind) for kind in HOST_KEY_TYPES]
    add_authorized_keys(layout.authorized_keys, keys)
    environment = session_environment(environ)
    write_private(layout.environment_file, environment_script(environment).encode())
    write_private(layout.config_file, sshd_config(layout, host_keys, environment).encode())
    if os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    return [binary, "-D", "-e", "-f", str(layout.config_file)]


def generate_host_key(directory: Path, kind: str) -> Path:
    """The host key of this type, made now if missing (kept across container restarts, so is its fingerprint)."""
    path = directory / f"ssh_host_{kind}_key"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        command = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(path)]
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL, capture_output=True)
    return path


def add_authorized_keys(path: Path, keys: list[str]) -> None:
    """Append the keys not yet authorized: keys added by hand on a previous run are kept."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    present = set(path.read_text().splitlines()) if path.exists() else set()
    missing = [key for key in keys if key not in present]
    with open(path, "a") as file:
        file.writelines(f"{key}\n" for key in missing)
    path.chmod(0o600)


def environment_script(environment: Mapping[str, str]) -> str:
    """`export NAME='value'` lines; login shells source this after /etc/profile has reset PATH."""
    lines = (f"export {name}={shlex.quote(value)}\n" for name, value in sorted(environment.items()))
    return ENVIRONMENT_FILE_HEADER + "".join(lines)


def sshd_config(layout: SshdLayout, host_keys: list[Path], environment: Mapping[str, str]) -> str:
    """Key login only; every session gets the pod's environment from sshd itself, whatever its shell."""
    lines = [
        f"Port {layout.port}",
        f"ListenAddress {layout.listen}",
        *(f"HostKey {key}" for key in host_keys),
        f"AuthorizedKeysFile {layout.authorized_keys}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        f"StrictModes {'yes' if layout.strict_modes else 'no'}",
        "PidFile none",
        "PrintMotd no",
        "Subsystem sftp internal-sftp",
    ]
    settable = [f"{name}={value}" for name, value in sorted(environment.items()) if "\n" not in value]
    if settable:  # one line: sshd keeps only the first SetEnv it reads
        lines.append("SetEnv " + " ".join(map(quote_for_sshd, settable)))
    return "\n".join(lines) + "\n"


def quote_for_sshd(argument: str) -> str:
    """One double-quoted sshd_config argument (its parser unescapes backslash and quotes)."""
    return '"' + re.sub(r"([\\\"'])", r"\\\1", argument) + '"'
