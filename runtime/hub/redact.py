"""Redaction: what must never leave the pod is replaced by a marker before anything is published.

Three nets, applied in order: the values of the pod's secrets (`HF_TOKEN`, each `VL_API_KEYS` key, any
variable whose *name* looks secret), then well-known token shapes (`hf_…`, `sk-…`, `Bearer …`, …),
which also catch a secret that reached a log by a path no variable announced.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping

MARKER = "[redacted]"

# Whole words of a variable name that mark its value as secret. Matching words, not substrings, is
# what keeps `TOKENIZERS_PARALLELISM`, `VL_KVBYTES` or `KEYBOARD` out; `TOKENS` is left out on
# purpose: `MAX_TOKENS`-style names hold counts.
SECRET_WORDS = frozenset({
    "TOKEN", "KEY", "KEYS", "APIKEY", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH", "AUTHORIZATION", "COOKIE",
})
# Glued spellings (`HFTOKEN`, `OPENAIAPIKEY`); a bare `…KEY` suffix is not enough (`MONKEY`).
SECRET_SUFFIXES = ("TOKEN", "APIKEY", "SECRET", "PASSWORD", "PASSWD")
# A `PUBLIC_KEY` (RunPod's SSH key) is meant to be seen.
PUBLIC_WORDS = frozenset({"PUBLIC", "PUB"})
# Shorter values are not credible secrets, and masking `1` or `on` everywhere would wreck the log.
MIN_SECRET_LENGTH = 6
HARMLESS_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off"})
# Settings whose value is a list of secrets (each one is redacted on its own).
SECRET_LISTS = frozenset({"VL_API_KEYS"})

TOKEN_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), MARKER),  # Hugging Face tokens
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), MARKER),  # OpenAI / Anthropic keys (sk-ant-…)
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), MARKER),  # GitHub tokens
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MARKER),  # AWS access key ids
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\1{MARKER}"),  # `Bearer …` anywhere
    (re.compile(r"(?i)\b(authorization[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z]+\s+)?)[^\s\"',;]{8,}"),
     rf"\1{MARKER}"),  # any `Authorization:` header value (Basic, Token, …)
    (re.compile(r"(?i)((?:\bx-api-key|\bapi[_-]?keys?)[\"']?\s*[:=]\s*[\"'\[]*|--api-key\s+)[^\s\"',;\]]{8,}"),
     rf"\1{MARKER}"),  # `x-api-key: …`, `api_key=…`, vLLM's `--api-key …` and its logged args
    (re.compile(r"(?<=://)[^/\s:@]+:[^/\s@]+@"), f"{MARKER}@"),  # credentials inside a URL
)


def name_looks_secret(name: str) -> bool:
    """Whether a variable's name says its value is a secret (`HF_TOKEN` yes, `VL_KVBYTES` no)."""
    words = [w for w in re.split(r"[^A-Z0-9]+", name.upper()) if w]
    if any(w in PUBLIC_WORDS for w in words):
        return False
    return any(w in SECRET_WORDS or w.endswith(SECRET_SUFFIXES) for w in words)


def secret_values(variables: Mapping[str, str]) -> set[str]:
    """The values in `variables` (an environment, or the Hub settings file) that must be masked."""
    found: set[str] = set()
    for name, value in variables.items():
        if not name_looks_secret(name) and name not in SECRET_LISTS:
            continue
        found.add(value.strip())
        if name in SECRET_LISTS:
            found.update(re.split(r"[\s,]+", value))
    return {v for v in found if len(v) >= MIN_SECRET_LENGTH and v.lower() not in HARMLESS_VALUES}


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
            self._secrets.update(s for s in secrets if s)
            # Longest first, so that a secret containing another one is masked whole.
            ordered = sorted(self._secrets, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __call__(self, text: str) -> str:
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(MARKER, text)
        for shape, replacement in TOKEN_SHAPES:
            text = shape.sub(replacement, text)
        return text
