"""Redaction: what must never leave the pod is replaced by a marker before anything is published.

Three nets, applied in order: the values of the pod's secrets (`HF_TOKEN`, each `VL_API_KEYS` key, any
variable whose *name* looks secret), then well-known token shapes (`hf_…`, `sk-…`, PEM private keys,
JWTs, …), then the places a secret sits in (`Authorization:`, `?token=`, `"password": …`, `user:pass@`,
`OTHER_API_KEY=…`), which also catch a secret that reached a log by a path no variable announced.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO
from urllib.parse import quote, quote_plus

from runtime.settings import is_secret, key_entries
from runtime.tokenshapes import PLACES, SECRET_FIELD, TOKEN_SHAPES, URL_PASSWORD

MARKER = "[redacted]"

# Shorter values are not credible secrets, and masking `1` or `on` everywhere would wreck the log.
MIN_SECRET_LENGTH = 6
MIN_BASE64_CHARS = 8  # of a secret's base64 form: shorter pieces would mask ordinary words
HARMLESS_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off"})

# Not a value to mask again (a rule further down meets earlier markers), nor an unset one (`api_key=None`).
NOT_A_SECRET_YET = rf"(?!{re.escape(MARKER)}|(?:none|null)\b)"
# Names of URL parameters that hold secrets, with any prefix (fields': tokenshapes.SECRET_FIELD).
SECRET_PARAMETER = (
    r"(?:[A-Za-z0-9]+[_.-])*(?:token|api[_-]?key|apikey|key|secret|password|passwd|sig|signature"
    r"|credential|auth)"
)


def after(head: str, value: str = r"[^\s\"',;&#\]]+") -> tuple[re.Pattern[str], str]:
    """A secret recognised by what precedes it (`head`, kept): its `value` is masked, whatever it looks like."""
    return re.compile(rf"(?i)({head}){NOT_A_SECRET_YET}{value}"), rf"\1{MARKER}"


def quoted_field(quote: str) -> tuple[re.Pattern[str], str]:
    """`"password": "…"` (JSON) or `'password': '…'` (a Python dict): the string, escapes included."""
    string = rf"(?:[^{quote}\\]|\\.)[^{quote}\\]*(?:\\.[^{quote}\\]*)*"  # not empty; unrolled: linear
    return after(rf"{quote}{SECRET_FIELD}{quote}\s*:\s*{quote}", string)


SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    *((shape, MARKER) for _, shape in TOKEN_SHAPES),  # tokens recognised by their own shape: masked whole
    (URL_PASSWORD, f"{MARKER}@"),  # credentials inside a URL (`user:password@host`)
    after(rf"[?&]{SECRET_PARAMETER}=", r"[^&#\s\"'<>]+"),  # `?token=…`, `&api_key=…`, `X-Amz-Signature=…`
    after(rf"(?:^|(?<=[\s;]))(?i:{SECRET_FIELD})=", r"[^&#\s\"'<>]{6,}"),  # a form body's first `password=…`
    *(after(head, value) for _, head, value in PLACES),  # .npmrc, Docker's config, YAML and INI fields, variables
    after(r"\b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]{0,200}?\s-p", r"[^\s\"']+"),  # `mysql -pPASSWORD`
    (re.compile(r"(?<=://)[A-Za-z0-9_-]{20,}@"), f"{MARKER}@"),  # a key as a URL's user (a Sentry DSN's)
    after(r"hooks\.slack\.com/(?:services|workflows|triggers)/", r"[A-Za-z0-9/_-]+"),  # a webhook's path is its key
    after(r"discord(?:app)?\.com/api/webhooks/", r"[A-Za-z0-9/_-]+"),
    after(r"\b(?:Account|SharedAccess)Key=", r"[^;\s\"']+"),  # Azure connection strings
    after(r"(?:^|(?<=\s))(?:-u|--user)[ \t]+[^\s:]+:", r"\S+"),  # `curl -u user:password`
    after(r"--(?:password|passwd|token|secret)(?:[ \t]+|=)"),  # `--password …` on a command line
    quoted_field('"'),
    quoted_field("'"),
    after(r"\b(?:set-)?cookie[\"']?\s*[:=]\s*[\"']?", r"[^\r\n\"']+"),  # every cookie of the header
    after(r"\bbearer\s+", r"[A-Za-z0-9._~+/=-]{8,}"),  # `Bearer …` anywhere, if token-long (not `a bearer of news`)
    # A header as a Python tuple (`('x-api-key', '…')`, `(b'authorization', b'Bearer …')`), however short.
    after(
        r"\(\s*b?[\"'](?:proxy-)?(?:authorization|(?:x-)?api-key|x-goog-api-key|x-(?:auth|access)-token|cookie"
        r"|set-cookie)[\"']\s*,\s*b?[\"'](?:[A-Za-z]+\s+)?+",
        r"[^\"']+",
    ),
    after(r"\bx-(?:auth|access)-token[\"']?\s*[:=]\s*[\"']?"),  # `X-Auth-Token: …`, however short
    # Any `Authorization:` header value (Basic, Token, …), however short; a scheme, once read, stays one.
    after(r"\bauthorization[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z]+\s+)?+"),
    # `x-api-key: …`, `api_key=…` (`['…']` in vLLM's logged args), `--api-key …`, however short.
    after(r"(?:(?<![A-Za-z0-9])(?:x-)?api[_-]?keys?[\"']?\s*[:=]\s*(?:\[?[\"'])?|--api-key[\s=]+)"),
)
# `NAME=value` of any variable whose name looks secret, this pod's or another service's (`MISTRAL_API_KEY=…`).
ASSIGNMENT = re.compile(r"\b([A-Z][A-Z0-9_]*)=([\"']?)([^\s\"']+)")


def value_looks_secret(value: str) -> bool:
    """Whether a value under a secret-looking name is worth masking (not `1`, `on`, or a marker)."""
    return len(value) >= MIN_SECRET_LENGTH and value.lower() not in HARMLESS_VALUES and MARKER not in value


def secret_values(variables: Mapping[str, str]) -> set[str]:
    """The values in `variables` (an environment, or the Hub settings file) that must be masked.
    A `VL_API_KEYS` entry `name:key` is accepted by its key alone: both are masked (the name is not)."""
    found: set[str] = set()
    for name, value in variables.items():
        if not is_secret(name):
            continue
        found.add(value.strip())
        if name == "VL_API_KEYS":
            found.update(item for entry in key_entries(value) for item in (entry.entry, entry.key))
    return {v for v in found if value_looks_secret(v)}


def base64_forms(secret: str) -> set[str]:
    """The parts of `secret`'s base64 (standard and URL-safe) that any text around it leaves unchanged,
    at each of the three alignments it can have in a longer encoded text (`user:token` in a Basic
    header, a Docker `auth`): a secret must not leave the pod merely encoded."""
    raw = secret.encode()
    forms: set[str] = set()
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        first = -(-offset * 4 // 3)  # the characters that hold bits of what precedes it
        last = len(encoded) - encoded.count("=") - (0 if (offset + len(raw)) % 3 == 0 else 1)
        part = encoded[first:last]
        if len(part) >= MIN_BASE64_CHARS:
            forms.update({part, part.replace("+", "-").replace("/", "_")})
    return forms


def written_forms(secret: str) -> set[str]:
    """`secret` as a URL, a form or a JSON string write it (`%2F`, `+`, `\\"`): a known value must not leave the
    pod merely escaped."""
    return {quote(secret, safe=""), quote(secret), quote_plus(secret, safe=""), json.dumps(secret)[1:-1]}


def mask_secret_assignment(match: re.Match[str]) -> str:
    name, quote, value = match.groups()
    return f"{name}={quote}{MARKER}" if is_secret(name) and value_looks_secret(value) else match.group(0)


class Redactor:
    """Masks known secret values and token shapes in text; `learn` adds secrets as they appear."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.add(secrets)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Redactor:
        return cls(secret_values(environ))

    def learn(self, variables: Mapping[str, str]) -> None:
        """Adds the secrets found in a mapping of variables (e.g. a freshly read Hub settings file)."""
        self.add(secret_values(variables))

    def add(self, secrets: Iterable[str]) -> None:
        with self._lock:
            known = {s for s in secrets if s.strip()}  # a blank value is no secret: masking it masks spaces
            self._secrets.update(known)
            self._secrets.update(encoded for secret in known for encoded in base64_forms(secret))
            self._secrets.update(written for secret in known for written in written_forms(secret))
            # Longest first, so that a secret containing another one is masked whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def known(self, text: str) -> str:
        """`text` with the secrets it was given masked (their base64 forms too), and nothing else."""
        pattern = self._pattern
        return text if pattern is None else pattern.sub(MARKER, text)

    def __call__(self, text: str) -> str:
        text = self.known(text)
        for found, replacement in SECRET_PATTERNS:
            text = found.sub(replacement, text)
        return ASSIGNMENT.sub(mask_secret_assignment, text)


class Redacted:
    """A terminal stream that masks what a client command holds before it is shown: the secrets it was given on
    stdout (where a connect block shows the user's own pod key on purpose), every secret shape too on stderr."""

    def __init__(self, stream: TextIO, redact: Redactor, shapes: bool) -> None:
        self.stream, self.redact, self.shapes = stream, redact, shapes

    def write(self, text: str) -> int:
        self.stream.write(self.redact(text) if self.shapes else self.redact.known(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno...: the stream's own
        return getattr(self.stream, name)


@contextmanager
def redacted_output(redact: Redactor) -> Iterator[None]:
    """A client command's stdout and stderr through `redact` while it runs (an API's error can quote a request
    back, its keys with it)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Redacted(out, redact, shapes=False), Redacted(err, redact, shapes=True)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
