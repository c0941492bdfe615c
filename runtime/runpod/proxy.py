"""The pod's ports and the URL RunPod's HTTPS proxy gives one: `https://{pod}-{port}.proxy.runpod.net` (a template's
`N/http` port), written here once for the commands, the pod and the build side. Standard library only."""

from __future__ import annotations

import os
from collections.abc import Mapping

PUBLIC_PORT = 8080  # the pod's public port: the bridge (VL_PORT's default), `8080/http` in the template
SSH_PORT = 22  # sshd, `22/tcp` in the template (direct TCP, not through the proxy)
DESKTOP_PORT = 6080  # the browser desktop's gate (VL_DESKTOP=on), `6080/http` in the template
PROXY_URL = "https://{pod_id}-{port}.proxy.runpod.net"  # RunPod's HTTPS proxy in front of a pod's `N/http` port
PROXY_URL_VARIABLE = "RUNPOD_PROXY_URL"  # the same pattern pointed elsewhere (the tests' stand-in)


def proxy_url(pod_id: str, port: int = PUBLIC_PORT, environ: Mapping[str, str] = os.environ) -> str:
    """The pod's `port` through RunPod's proxy (or RUNPOD_PROXY_URL's pattern), with no trailing slash."""
    return (environ.get(PROXY_URL_VARIABLE) or PROXY_URL).format(pod_id=pod_id, port=port).rstrip("/")
