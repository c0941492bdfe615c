"""What every request of ours says: who we are (RunPod's proxy answers 403 to Python's default user agents, the
field notes), the Anthropic API's version and the key, and the rule by which a command chooses that key, for its
messages. Standard library only: the commands, the pod's self-check and the RunPod client share it."""

from __future__ import annotations

USER_AGENT = "vllm-pod/1 (+python -m runtime)"
ANTHROPIC_VERSION = "2023-06-01"
# Claude Code's own variables, in its order: the token it sends as a bearer, then the API key.
KEY_VARIABLES = ("ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY")
KEY_DEFAULT = "$ANTHROPIC_AUTH_TOKEN, else $ANTHROPIC_API_KEY, else the key kept with that pod by `pod up`"
KEY_RULE = f"--key, else {KEY_DEFAULT}"


def api_headers(key: str | None) -> dict[str, str]:
    """What every request of ours to a pod carries: the API version, who we are, and the key when there is one (an
    open pod takes none; an empty `Bearer ` is no header at all)."""
    headers = {"anthropic-version": ANTHROPIC_VERSION, "user-agent": USER_AGENT}
    return headers | ({"authorization": f"Bearer {key}"} if key else {})
