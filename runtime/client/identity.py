"""What the commands run on the user's machine (`connect`, `status`, `pod`) share: who they say they are,
and where they find the pod's key."""

from __future__ import annotations

import os
from collections.abc import Mapping

# RunPod's proxy answers 403 to Python's default user agents (the field notes): every request says ours.
USER_AGENT = "vllm-pod/1 (+python -m runtime)"
KEY_VARIABLES = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")  # what Claude Code's environment already holds
ANTHROPIC_VERSION = "2023-06-01"


def api_headers(key: str | None) -> dict[str, str]:
    """What every request of ours to a pod carries: the API version, who we are, and the key when there is one (an
    open pod takes none; an empty `Bearer ` is no header at all)."""
    headers = {"anthropic-version": ANTHROPIC_VERSION, "user-agent": USER_AGENT}
    return headers | ({"authorization": f"Bearer {key}"} if key else {})


def pod_key(given: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key to ask a pod with: `--key`, else ANTHROPIC_API_KEY, else ANTHROPIC_AUTH_TOKEN."""
    return given or next((environ[name] for name in KEY_VARIABLES if environ.get(name)), None)
