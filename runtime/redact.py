"""Redaction: what must never leave the pod is replaced by a marker before anything is published.

Three nets, applied in order: the values of the pod's secrets (`HF_TOKEN`, each `VL_API_KEYS` key, any
variable whose *name* looks secret), then well-known token shapes (`hf_…`, `sk-…`, PEM private keys,
JWTs, …), then the places a secret sits in (`Authorization:`, `?token=`, `"password": …`, `user:pass@`,
`OTHER_API_KEY=…`), which also catch a secret that reached a log by a path no variable announced.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterable, Mapping

from runtime.settings import is_secret, key_entries

MARKER = "[redacted]"

# Shorter values are not credible secrets, and masking `1` or `on` everywhere would wreck the log.
MIN_SECRET_LENGTH = 6
MIN_BASE64_CHARS = 8  # of a secret's base64 form: shorter pieces would mask ordinary words
HARMLESS_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off"})

# Where a token may start: not inside a word, but right after an escape (`\n` in JSON-quoted prompts).
START = r"(?:(?<![A-Za-z0-9])|(?<=\\[nrt]))"
# Not a value to mask again (a rule further down meets earlier markers), nor an unset one (`api_key=None`).
NOT_A_SECRET_YET = rf"(?!{re.escape(MARKER)}|(?:none|null)\b)"
# Names of fields and URL parameters that hold secrets, with any prefix (`client_secret`, `hf_token`).
SECRET_FIELD = (
    r"(?:[A-Za-z0-9]+[_.-])*(?:access_token|refresh_token|token|password|passwd|passphrase|secret"
    r"|api[_-]?key|apikey|access_key|private_key|credentials?)"
)
SECRET_PARAMETER = (
    r"(?:[A-Za-z0-9]+[_.-])*(?:token|api[_-]?key|apikey|key|secret|password|passwd|sig|signature"
    r"|credential|auth)"
)


def shape(pattern: str) -> tuple[re.Pattern[str], str]:
    """A token recognised by its own shape: masked whole."""
    return re.compile(pattern), MARKER


def after(head: str, value: str = r"[^\s\"',;&#\]]+") -> tuple[re.Pattern[str], str]:
    """A secret recognised by what precedes it (`head`, kept): its `value` is masked, whatever it looks like."""
    return re.compile(rf"(?i)({head}){NOT_A_SECRET_YET}{value}"), rf"\1{MARKER}"


def quoted_field(quote: str) -> tuple[re.Pattern[str], str]:
    """`"password": "…"` (JSON) or `'password': '…'` (a Python dict): the string, escapes included."""
    string = rf"(?:[^{quote}\\]|\\.)[^{quote}\\]*(?:\\.[^{quote}\\]*)*"  # not empty; unrolled: linear
    return after(rf"{quote}{SECRET_FIELD}{quote}\s*:\s*{quote}", string)


SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # The whole block, log prefixes and escaped newlines included; to the end of the text when cut off.
    shape(
        r"(?s)-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)"
    ),  # PEM, and PGP's private key blocks
    shape(r"(?s)Private-Lines: \d+.*?(?:Private-MAC: [0-9a-fA-F]+|\Z)"),  # a PuTTY .ppk's private part
    shape(rf"{START}hf_[A-Za-z0-9]{{20,}}"),  # Hugging Face tokens
    shape(rf"{START}sk-[A-Za-z0-9_-]{{16,}}"),  # OpenAI / Anthropic keys (sk-ant-…)
    shape(rf"{START}gh[pousr]_[A-Za-z0-9]{{30,}}"),  # GitHub tokens
    shape(rf"{START}github_pat_[A-Za-z0-9_]{{22,}}"),  # GitHub fine-grained tokens
    shape(rf"{START}rpa_[A-Za-z0-9]{{20,}}"),  # RunPod API keys
    shape(rf"{START}[sr]k_(?:live|test)_[A-Za-z0-9]{{16,}}"),  # Stripe secret and restricted keys (not pk_: public)
    shape(rf"{START}AIza[0-9A-Za-z_-]{{35}}"),  # Google API keys
    shape(rf"{START}(?:xox[abprs]|xapp)-[A-Za-z0-9-]{{10,}}"),  # Slack tokens, and app-level ones
    shape(rf"{START}glpat-[A-Za-z0-9_-]{{20,}}"),  # GitLab personal access tokens
    shape(rf"{START}npm_[A-Za-z0-9]{{36}}"),  # npm tokens
    shape(rf"{START}pypi-[A-Za-z0-9_-]{{50,}}"),  # PyPI upload tokens
    shape(rf"{START}dckr_pat_[A-Za-z0-9_-]{{20,}}"),  # Docker Hub personal access tokens
    shape(rf"{START}whsec_[A-Za-z0-9+/=]{{20,}}"),  # webhook signing secrets (Stripe, Svix)
    shape(rf"{START}SG\.[A-Za-z0-9_-]{{16,}}\.[A-Za-z0-9_-]{{16,}}"),  # SendGrid API keys
    shape(rf"{START}GOCSPX-[A-Za-z0-9_-]{{20,}}"),  # Google OAuth client secrets
    shape(rf"{START}ya29\.[A-Za-z0-9_-]{{20,}}"),  # Google OAuth access tokens
    shape(rf"{START}(?:AKIA|ASIA)[0-9A-Z]{{16}}\b"),  # AWS access key ids
    shape(
        rf"{START}eyJ[A-Za-z0-9_-]{{8,}}\.eyJ[A-Za-z0-9_-]{{8,}}\.[A-Za-z0-9_-]*"
    ),  # JWTs: two JSON parts, a signature
    # Credentials inside a URL: the user may be empty and the password hold `/` or `@` (the first `@`
    # followed by a host ends it; at most 256 characters: linear on any text); `host:443/…` is a port.
    (
        re.compile(r"(?<=://)[^\s/:@]*:(?!\d+(?:[/?#\s]|\Z))\S{0,256}?@(?=[A-Za-z0-9.-]+(?::\d+)?(?:[/?#\s\"'<>]|\Z))"),
        f"{MARKER}@",
    ),
    after(rf"[?&]{SECRET_PARAMETER}=", r"[^&#\s\"'<>]+"),  # `?token=…`, `&api_key=…`, `X-Amz-Signature=…`
    after(r"hooks\.slack\.com/(?:services|workflows|triggers)/", r"[A-Za-z0-9/_-]+"),  # a webhook's path is its key
    after(r"discord(?:app)?\.com/api/webhooks/", r"[A-Za-z0-9/_-]+"),
    after(r"\b(?:Account|SharedAccess)Key=", r"[^;\s\"']+"),  # Azure connection strings
    # A secret field as a line of YAML (`password: …`) or of an INI file (`aws_secret_access_key = …`).
    after(rf"(?m:^)[ \t-]*{SECRET_FIELD}[ \t]*(?::[ \t]+|=[ \t]*)[\"']?", r"[^\s\"']{6,}"),  # not `=1`
    after(r"(?:^|(?<=\s))(?:-u|--user)[ \t]+[^\s:]+:", r"\S+"),  # `curl -u user:password`
    after(r"--(?:password|passwd|token|secret)(?:[ \t]+|=)"),  # `--password …` on a command line
    quoted_field('"'),
    quoted_field("'"),
    after(r"\b(?:set-)?cookie[\"']?\s*[:=]\s*[\"']?", r"[^\r\n\"']+"),  # every cookie of the header
    after(r"\bbearer\s+", r"[A-Za-z0-9._~+/=-]{8,}"),  # `Bearer …` anywhere, if token-long (not `a bearer of news`)
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
            known = {s for s in secrets if s}
            self._secrets.update(known)
            self._secrets.update(encoded for secret in known for encoded in base64_forms(secret))
            # Longest first, so that a secret containing another one is masked whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(MARKER, text)
        for found, replacement in SECRET_PATTERNS:
            text = found.sub(replacement, text)
        return ASSIGNMENT.sub(mask_secret_assignment, text)
