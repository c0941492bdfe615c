"""`GET /console`: the pod's console, one self-contained page (console.html) that polls `GET /v1/pod/status`.

The page carries no data (it asks for a key, keeps it in the browser and sends it as a Bearer token),
so it is served without a key; its Content-Security-Policy admits only its own inline script and style.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

PAGE_FILE = Path(__file__).with_name("console.html")
MEDIA_TYPE = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Page:
    """The page's bytes and the headers it is always served with."""

    body: bytes
    headers: dict[str, str]


def inline_hashes(html: str, tag: str) -> str:
    """CSP sources (`'sha256-…'`) of every inline `<tag>` element's text, hashed as the browser does:
    admitting these, not `'unsafe-inline'`, means no injected script or style could run."""
    texts = re.findall(rf"<{tag}(?:\s[^>]*)?>(.*?)</{tag}>", html, re.DOTALL)
    digests = (base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() for text in texts)
    return " ".join(f"'sha256-{digest}'" for digest in digests) or "'none'"


def security_headers(html: str) -> dict[str, str]:
    """Only this page's own script and style run, it fetches from its own origin only, no site frames it,
    and no URL it opens learns where it came from."""
    policy = [
        "default-src 'none'",
        f"script-src {inline_hashes(html, 'script')}",
        f"style-src {inline_hashes(html, 'style')}",
        "connect-src 'self'",  # GET /v1/pod/status, on the pod's own origin
        "img-src data:",  # the empty favicon (no request for /favicon.ico)
        "base-uri 'none'",
        "form-action 'none'",  # the key form never submits: the key cannot end up in a URL
        "frame-ancestors 'none'",
    ]
    return {
        "content-security-policy": "; ".join(policy),
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
        "x-content-type-options": "nosniff",
        "cross-origin-opener-policy": "same-origin",
        "cache-control": "no-cache",  # a new image's page replaces the old one at once
    }


@cache
def page() -> Page:
    """console.html, read once (it ships inside the package, next to this module)."""
    html = PAGE_FILE.read_text(encoding="utf-8")
    return Page(html.encode(), security_headers(html))


async def console(request: Request) -> Response:
    served = page()
    return Response(served.body, media_type=MEDIA_TYPE, headers=served.headers)
