"""The OpenSSH client as the tests use it: this machine's user on loopback, in batch mode, with no host
key remembered and no user configuration read."""

from __future__ import annotations

import getpass


def ssh_argv(port: int | str, *options: str, command: str = "true") -> list[str]:
    """`ssh` to this user at 127.0.0.1:`port` running `command`; `options` go before the destination."""
    return [
        "ssh", "-p", str(port), "-F", "/dev/null",
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "ConnectTimeout=10",
        *options, f"{getpass.getuser()}@127.0.0.1", command,
    ]  # fmt: skip
