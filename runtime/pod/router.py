"""The router in front of the pod's engines (VL_REPLICAS > 1): SGLang's gateway `smg`, a child of the
supervisor on loopback, pinned in docker/versions.toml and installed in the image's engine layer.

Why smg and not vllm-router (both on PyPI, both Rust; measured side by side, docs/guide/more-gpus.md): a
request to a freshly dead engine was retried on the other one by smg (0 failures in 3) and answered 500
by vllm-router (2 in 4: its consistent hash kept choosing the dead engine until its health check
caught up), and logged every request's routing key at its default level. smg's `manual` policy pins a
new key to the engine holding the fewest; a key whose engine died moves to another, and back once that
engine serves again. smg does not route `/tokenize`: the bridge asks an engine directly for it
(runtime.bridge.upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.image import read_image_facts
from runtime.packages import PackagesError, read_versions
from runtime.settings import Settings

if TYPE_CHECKING:
    import httpx

ROUTER = "router"  # its child's and log's name
POLICIES = {  # smg's `manual` policy pins a conversation by the header the bridge sets (runtime.bridge.affinity)
    # A new key goes to the engine holding the fewest keys, and stays there while that engine lives.
    "affinity": ("--policy", "manual", "--assignment-mode", "min_group"),
    "round-robin": ("--policy", "round_robin"),
}
HEALTH_EVERY_S = 5  # how soon the router stops sending to a dead engine (its retries cover the gap meanwhile)
HEALTH_TIMEOUT_S = 30  # a busy engine answers /health late; a dead one refuses at once (and is retried around)
STARTUP_TIMEOUT_S = 6 * 3600  # an engine that compiles for an hour is still routed to once it serves
REQUEST_TIMEOUT_S = 3600  # a long generation on a loaded engine; the bridge has its own limits per client


class RouterError(RuntimeError):
    """The router is missing or is not the pinned version; `str()` is one line saying so."""


def router_program(settings: Settings) -> Path:
    return Path(settings.venv) / "bin" / "smg"


def pinned_version(settings: Settings) -> str:
    """The version this pod's router must be: the image's, as its build checked and recorded it, else the
    pin of docker/versions.toml (a stock image carries it beside runtime/)."""
    facts = read_image_facts(Path(settings.prebaked_marker)) or {}
    versions = facts.get("versions")
    if isinstance(versions, dict) and isinstance(smg := versions.get("smg"), str):
        return smg
    try:
        return str(read_versions()["engine"]["smg"])
    except PackagesError as error:
        raise RouterError(str(error)) from None


def check_router(settings: Settings) -> str:
    """The router's version, checked against the pin at start (as the engine's is); RouterError otherwise."""
    program, pin = router_program(settings), pinned_version(settings)
    try:
        answer = subprocess.run([str(program), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RouterError(f"VL_REPLICAS needs the router {program} (smg {pin}): {error}") from None
    found = answer.stdout.split()[-1:] or ["nothing"]
    if answer.returncode or found[0] != pin:
        raise RouterError(
            f"{program} is smg {found[0]}, this pod needs smg {pin} (the image's, or docker/versions.toml's)"
        )
    return pin


def router_argv(settings: Settings, workers: Sequence[str]) -> list[str]:
    """`smg launch` on loopback in front of `workers` (base URLs), with VL_ROUTING's policy; its own
    metrics on VL_ROUTER_PORT + 1, on loopback too."""
    return [
        str(router_program(settings)),
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(settings.router_port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(settings.router_port + 1),
        "--worker-urls",
        *workers,
        *POLICIES[settings.routing],
        "--disable-tokenizer-autoload",  # it only forwards: no tokenizer download from the Hub
        "--health-check-interval-secs",
        str(HEALTH_EVERY_S),
        "--health-check-timeout-secs",
        str(HEALTH_TIMEOUT_S),
        "--worker-startup-check-interval",
        str(HEALTH_EVERY_S),  # an engine is routed to soon after it loads
        "--worker-startup-timeout-secs",
        str(STARTUP_TIMEOUT_S),
        "--request-timeout-secs",
        str(REQUEST_TIMEOUT_S),
        "--log-level",
        "warn",  # info is several lines per request
    ]


def router_url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.router_port}"


class RouterControl:
    """The router's worker list, changed around an engine's restart for a new setting (a rolling change):
    withdrawn first, so that the router sends it nothing new while it finishes what it runs, and
    admitted again once it serves. Its control plane listens on loopback only, like the router."""

    def __init__(self, url: str, timeout_s: float = 120.0) -> None:
        self.url, self.timeout_s = url, timeout_s

    async def withdraw(self, engine: str) -> bool:
        """Take `engine` out of the rotation; whether the router let go of it in time."""
        import httpx  # not on the light path to vLLM's launch

        async with httpx.AsyncClient(base_url=self.url, trust_env=False, timeout=10.0) as client:
            for worker in await self.workers(client):
                if worker.get("url") == engine:
                    await client.delete(f"/workers/{worker['id']}")
            return await self.until(client, lambda workers: engine not in workers)

    async def admit(self, engine: str) -> bool:
        """Put `engine` back into the rotation; whether the router routes to it again in time."""
        import httpx

        async with httpx.AsyncClient(base_url=self.url, trust_env=False, timeout=10.0) as client:
            await client.post("/workers", json={"url": engine})
            return await self.until(client, lambda workers: workers.get(engine, False))

    async def keep(self, workers: Sequence[str], key: str | None) -> dict[str, bool]:
        """Register each of `workers` the router lacks (a gateway's pods, each with the key it presents
        to them: in the request's body, never on the router's command line); each one's health."""
        import httpx

        async with httpx.AsyncClient(base_url=self.url, trust_env=False, timeout=10.0) as client:
            listed = {w.get("url", ""): bool(w.get("is_healthy")) for w in await self.workers(client)}
            for url in workers:
                if url not in listed:  # a registration under way answers 409: asked again next time
                    with contextlib.suppress(httpx.HTTPError):
                        await client.post("/workers", json={"url": url} | ({"api_key": key} if key else {}))
        return {url: listed.get(url, False) for url in workers}

    async def until(self, client: httpx.AsyncClient, done: Callable[[dict[str, bool]], bool]) -> bool:
        """Poll the worker list (url → healthy) until `done` holds, at most `timeout_s`."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if done({w.get("url", ""): bool(w.get("is_healthy")) for w in await self.workers(client)}):
                return True
            await asyncio.sleep(0.5)
        return False

    @staticmethod
    async def workers(client: httpx.AsyncClient) -> list[dict[str, Any]]:
        import httpx

        try:
            workers = (await client.get("/workers")).json().get("workers", [])
            return [worker for worker in workers if isinstance(worker, dict)] if isinstance(workers, list) else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return []
