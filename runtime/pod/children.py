"""The pod's children as the supervisor runs them: each one's command line, environment and health probe (the
engines, the router, the bridge, sshd, the desktop), made from the settings in force.

The bridge is the one child a Hub file starts, stops and restarts by itself (VL_BRIDGE, its own settings); the
engines change only through `Engines`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from runtime.engine.command import RUNTIME_ROOT
from runtime.engine.volume import cache_root
from runtime.gpu import engine_python
from runtime.gpuprobe import examine
from runtime.health import Answers200, engine_generates, health_url
from runtime.logfiles import BRIDGE, SSHD
from runtime.pod.diagnosis import explain
from runtime.pod.engines import Engines
from runtime.pod.replicas import Replica
from runtime.pod.router import ROUTER, router_argv, router_url
from runtime.pod.sshd import SshdLayout, prepare_sshd
from runtime.pod.supervisor import ChildSpec, Health, StartLimit, Supervisor
from runtime.settings import Scope, Settings
from runtime.state.selfcheck import SELFCHECK_KEY

log = logging.getLogger(__name__)

# The bridge's /health does not touch the engine: two misses in a row mean it is hung (seeds' watchdog).
# 10 s: a loaded machine can stall a sound bridge for seconds, and a restart cuts every open stream.
BRIDGE_HEALTH = functools.partial(Health, interval_s=10.0, timeout_s=10.0, failures_before_restart=2)
ROUTER_HEALTH = functools.partial(Health, interval_s=10.0, timeout_s=10.0, failures_before_restart=3)
# A real one-token generation: a dead engine can still answer /v1/models with 200. Generous timeout:
# a saturated engine queues the probe behind real work, and restarting a busy engine is a disaster.
ENGINE_PROBE_S = 60.0
ENGINE_HEALTH = functools.partial(Health, interval_s=15.0, timeout_s=ENGINE_PROBE_S, failures_before_restart=3)
ENGINE_START_TRIES = 3  # failed starts in a row (never healthy) before the engine is left stopped: each costs minutes
USAGE_LEDGER = "usage-ledger.jsonl"  # each key's totals, across restarts (runtime/bridge/ledger.py)
DESKTOP_ONLY = ("VL_DESKTOP", "VL_DESKTOP_PASSWORD")  # the password is the desktop's alone: no other child sees it


def without_desktop(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child other than the desktop: the pod's, less the desktop's settings."""
    return {name: value for name, value in environ.items() if name not in DESKTOP_ONLY}


def bridge_argv(upstream: str, host: str, port: int, thinks_unasked: bool = False, data_parallel: int = 1) -> list[str]:
    """The bridge's command line: `python -m runtime bridge` on `host:port`, in front of `upstream`, with what it
    must know of the engine (restarted when that changes)."""
    argv = [sys.executable, "-m", "runtime", "bridge", "--upstream", upstream, "--host", host, "--port", str(port)]
    argv += ["--thinks-unasked"] if thinks_unasked else []
    return [*argv, "--data-parallel", str(data_parallel)] if data_parallel > 1 else argv


def sshd_layout(settings: Settings) -> SshdLayout:
    return SshdLayout(
        config_file=Path(settings.state_dir) / "sshd_config",
        host_key_dir=Path(settings.ssh_host_keys),
        authorized_keys=Path(settings.ssh_authorized_keys).expanduser(),
        environment_file=Path(settings.ssh_env_file),
        port=settings.ssh_port,
        listen=settings.listen,
        strict_modes=settings.ssh_strict_modes,
    )


class Children:
    """The children's specs and their launch, from `engines`' settings in force; `environ` is the pod's own."""

    def __init__(self, engines: Engines, supervisor: Supervisor, environ: Mapping[str, str]) -> None:
        self.engines, self.supervisor, self.environ = engines, supervisor, environ
        self.children_environ = without_desktop(environ)  # every child's but the desktop's
        settings = engines.settings
        # The HEALTHCHECK asks the same URL (runtime.health.pod_health_url): both read the pod scope.
        self.bridge_probe = Answers200(health_url(settings.listen, settings.port))
        self.bridge_health = BRIDGE_HEALTH(self.bridge_probe)
        self.selfcheck_key = secrets.token_urlsafe(32)  # VL_SELFCHECK's key: the bridge's alone, never published

    def launch_engines(self) -> None:
        """vLLM first: it takes longest."""
        for replica in self.engines.replicas:
            self.supervisor.start(self.engine_spec(replica))

    async def launch_the_rest(self) -> None:
        """Every other child the settings call for, sshd last (its keys take a moment); a cluster's worker serves
        nothing but its engine and sshd."""
        command = self.engines.command
        if command is not None and command.headless:
            await self.start_sshd()
            return
        if self.engines.routed:
            self.supervisor.start(self.router_spec())
        if self.engines.settings.bridge:
            self.supervisor.start(self.bridge_spec())
        self.start_desktop()
        await self.start_sshd()

    def engine_spec(self, replica: Replica) -> ChildSpec:
        command = replica.command
        if command.headless:  # no HTTP to probe: rank 0's node link watches it (runtime.pod.nodelink)
            return ChildSpec(replica.name, command.argv, {**self.children_environ, **command.env})
        health = ENGINE_HEALTH(engine_generates(command, ENGINE_PROBE_S))
        env = {**self.children_environ, **command.env}
        probes = functools.partial(examine, engine_python(self.engines.settings), env)  # after a CUDA fault
        limit = StartLimit(ENGINE_START_TRIES, functools.partial(explain, examine_host=probes))  # not for ever
        return ChildSpec(replica.name, command.argv, env, health, limit)

    def router_spec(self) -> ChildSpec:
        """The router in front of the engines (a gateway's: none yet); health-checked like the bridge."""
        settings = self.engines.settings
        argv = router_argv(settings, [replica.command.base_url for replica in self.engines.replicas])
        health = ROUTER_HEALTH(Answers200(f"{router_url(settings)}/health"))
        return ChildSpec(ROUTER, argv, dict(self.children_environ), health)

    def bridge_spec(self) -> ChildSpec:
        settings, command, replicas = self.engines.settings, self.engines.command, self.engines.replicas
        # A gateway knows no recipe: its workers' bridges relay what it asks, thinking off unless asked.
        unasked = command is not None and command.recipe.thinks_unasked
        if not self.engines.routed:
            first = replicas[0].command
            argv = bridge_argv(first.base_url, settings.listen, settings.port, unasked, first.data_parallel)
        else:  # generations through the router; the rest (and aborts) to the engines, or the pods, themselves
            # A gateway's bridge reads its pods from VL_WORKERS: a URL on its command line is in `ps` and its log.
            engines = [replica.command.base_url for replica in replicas]
            argv = bridge_argv(router_url(settings), settings.listen, settings.port, unasked)
            argv += [word for engine in engines for word in ("--engine", engine)]
        argv += ["--ledger", str(cache_root(settings) / USAGE_LEDGER)]  # on the volume, when the pod has one
        # Every setting the bridge reads, as they are now: its own, and the pod's (state folder, image facts).
        env = without_desktop({**self.environ, **settings.environ(Scope.BRIDGE, Scope.POD)})
        env[SELFCHECK_KEY] = self.selfcheck_key
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(RUNTIME_ROOT), env.get("PYTHONPATH"))))
        return ChildSpec(BRIDGE, argv, env, self.bridge_health)

    @property
    def bridge_runs(self) -> bool:
        return BRIDGE in self.supervisor.children

    async def bridge_gives_way(self) -> None:
        """VL_BRIDGE=off: the bridge stopped before vLLM restarts on its port."""
        log.info("stopping the bridge: with VL_BRIDGE=off, vLLM itself serves port %d", self.engines.settings.port)
        await self.supervisor.stop(BRIDGE)

    def bridge_takes_over(self) -> None:
        """VL_BRIDGE=on again: the bridge started once vLLM has left the public port (it serves on its own now)."""
        self.supervisor.start(self.bridge_spec())

    def restart_bridge(self, why: str) -> None:
        self.supervisor.restart(BRIDGE, why, self.bridge_spec())

    async def start_sshd(self) -> None:
        settings = self.engines.settings
        if not settings.ssh:
            log.info("sshd off (VL_SSH=off)")
            return
        try:
            argv = await asyncio.to_thread(prepare_sshd, sshd_layout(settings), self.children_environ)
        except (OSError, subprocess.CalledProcessError) as error:  # no SSH is no reason to stop serving
            log.warning("sshd not started: %s", error)
            return
        if argv is not None:
            self.supervisor.start(ChildSpec(SSHD, argv, dict(self.children_environ)))

    def start_desktop(self) -> None:
        """VL_DESKTOP=on: the browser desktop's launcher, a child like the others (restarted when it, or any
        piece of it, dies)."""
        if not self.engines.settings.desktop:
            return
        from runtime.logfiles import DESKTOP
        from runtime.pod.desktop import desktop_url, launcher_argv

        self.supervisor.start(ChildSpec(DESKTOP, launcher_argv(), dict(self.environ)))
        log.info(
            "desktop: %s (its password: VL_DESKTOP_PASSWORD)", desktop_url(self.environ, self.engines.settings.listen)
        )

    async def aclose(self) -> None:
        await self.bridge_probe.aclose()
