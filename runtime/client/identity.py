"""What the commands run on the user's machine share: which pod they ask, and with which key (who they say they are,
and the rule's words, are runtime/headers.py's: the pod's self-check and the RunPod client say them too).

One rule for every command that asks a pod (`connect`, `launch`, `check`, `bench`, `status`, `pod`'s last check):
the key is `--key`, else $ANTHROPIC_AUTH_TOKEN, else $ANTHROPIC_API_KEY (never an Anthropic key: it is the paid
API's), else the key kept with that same pod by the `pod` command that last watched it serve (readable by the user
alone). Without a URL, `launch`, `status`, `check` and `bench` ask that last pod.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.headers import KEY_VARIABLES

LAST_POD = "last-pod.json"  # {"url": …, "key": …}: what `pod up` brought up last, in the user's config folder
ANTHROPIC_KEY = "sk-ant-"  # how the paid API's keys start (sk-ant-api03-…, sk-ant-oat01-…): never sent to a pod


@dataclass(frozen=True)
class LastPod:
    """The pod `pod up` brought up last, and the key it checked it with (None when it had none)."""

    url: str
    key: str | None


def config_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The user's config folder for this tool (XDG's, else ~/.config)."""
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "vllm-pod"


def remember_pod(url: str, key: str | None, environ: Mapping[str, str] = os.environ) -> None:
    """What `pod up` brought up last, for the commands run without a URL; written for the user alone (it holds a
    key). A config folder that cannot be written costs only that memory."""
    try:
        folder = config_dir(environ)
        folder.mkdir(parents=True, exist_ok=True)
        written = folder / f".{LAST_POD}.{os.getpid()}"
        descriptor = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(json.dumps({"url": url, "key": key}) + "\n")
        os.replace(written, folder / LAST_POD)  # whole or not at all, for a command reading it meanwhile
    except OSError:
        pass


def last_pod(environ: Mapping[str, str] = os.environ) -> LastPod | None:
    try:
        kept = json.loads((config_dir(environ) / LAST_POD).read_text())
        url, key = kept.get("url"), kept.get("key")
    except (OSError, ValueError, AttributeError):
        return None
    return LastPod(url, key if isinstance(key, str) else None) if isinstance(url, str) else None


def pod_url(given: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The pod to ask: the URL given, else the one `pod up` brought up last; None when there is neither."""
    if given:
        return given
    kept = last_pod(environ)
    return kept.url if kept else None


def pod_key(given: str | None, url: str | None = None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key to ask the pod at `url` with, by the one rule (KEY_RULE): a kept key goes to its own pod only."""
    if given:
        return given
    given_by_shell = (environ.get(name, "") for name in KEY_VARIABLES)
    if chosen := next((key for key in given_by_shell if key and not key.startswith(ANTHROPIC_KEY)), None):
        return chosen
    kept = last_pod(environ)
    return kept.key if kept and url and kept.url.rstrip("/") == url.rstrip("/") else None
