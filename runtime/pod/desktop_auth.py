"""The browser desktop's HTTP Basic check: the gate's (runtime.pod.desktop_gate) of the user's password, and
websockify's of the gate's token, as its auth plugin (`--auth-plugin runtime.pod.desktop_auth.DesktopPassword
--auth-source VARIABLE`).

websockify's own BasicHTTPAuth takes `user:password` on its command line, where `ps` shows it to anyone in
the pod; this plugin reads the secret from the environment variable named by `--auth-source`. Any user name
is accepted (browsers ask for one; the password is the secret), and the whole secret counts (VNC's own
check keeps only its first 8 characters), compared in constant time.

Standard library only, and websockify imported inside the check: websockify runs it under the
distribution's python3 (Debian's python3-websockify), not the runtime's virtual environment.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from collections.abc import Mapping

REALM = "desktop"  # what the browser's password dialog names


class DesktopPassword:
    """HTTP Basic authentication of the page, its files and the WebSocket upgrade (with `--web-auth`)."""

    def __init__(self, source: str | None = None) -> None:
        if not source or not os.environ.get(source):
            raise SystemExit(f"desktop_auth: --auth-source must name a set environment variable, not {source!r}")
        self.password = os.environ[source].encode()

    def authenticate(self, headers: Mapping[str, str], target_host: object, target_port: object) -> None:
        """Returns when the request carries the password; raises websockify's AuthenticationError otherwise
        (a 401 that makes the browser ask, and send the cached credentials with the WebSocket upgrade)."""
        if not self.accepts(headers.get("Authorization")):
            # The distribution's websockify, in its own python (not installed where the runtime is checked).
            from websockify.auth_plugins import AuthenticationError  # type: ignore[import-not-found]

            raise AuthenticationError(
                log_msg="desktop: no or wrong password",
                response_code=401,
                response_headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
            )

    def accepts(self, header: str | None) -> bool:
        return basic_password_matches(header, self.password)


def basic_password_matches(header: str | None, password: bytes) -> bool:
    """Whether an `Authorization` header is HTTP Basic with `password` (any user name), in constant time."""
    scheme, _, encoded = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        credentials = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    _user, colon, given = credentials.partition(b":")
    return bool(colon) and hmac.compare_digest(given, password)
