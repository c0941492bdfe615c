"""`python -m runtime start`, the image's entrypoint: settings, GPU check, then vLLM, the bridge and
sshd under the supervisor, the Hub log while the pod is not healthy, and live reconfiguration.

Only what vLLM's command needs is imported before vLLM is launched (settings, recipes, the GPU
check); the Hub client, the HTTP clients and sshd's key generation come after, so that a prebaked
pod launches vLLM within moments (the seeds' image took ~15 s).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from runtime.engine import RUNTIME_ROOT, EngineCommand, engine_command, prepare_engine
from runtime.settings import BY_ENV, VARIABLES, Scope, Settings, SettingsError, load_settings, parse_value
from runtime.supervisor import ChildSpec, Health, Supervisor

log = logging.getLogger("runtime.start")

ENGINE, BRIDGE, SSHD = "engine", "bridge", "sshd"
# The bridge's /health does not touch the engine: two misses in a row mean it is hung (seeds' watchdog).
BRIDGE_HEALTH = {"interval_s": 5.0, "timeout_s": 5.0, "failures_before_restart": 2}
# A real one-token generation: a dead engine can still answer /v1/models with 200. Generous timeout:
# a saturated engine queues the probe behind real work, and a restart there would be a disaster.
ENGINE_HEALTH = {"interval_s": 15.0, "timeout_s": 60.0, "failures_before_restart": 3}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "Reads the VL_* variables (see the README's table); stops on SIGTERM or SIGINT."


def run(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    try:
        settings = load_settings(environ)
    except SettingsError as error:
        return refuse(str(error), environ)
    state_dir = Path(settings.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    log_to(state_dir / "boot.log")
    return asyncio.run(Pod(settings, environ).serve())


def refuse(line: str, environ: Mapping[str, str]) -> int:
    """Stop start-up with one line, on stderr and in the Hub log when one is configured."""
    print(line, file=sys.stderr)
    return 2


def log_to(boot_log: Path) -> None:
    """The runtime's own log: on stderr (the container's log) and in `boot.log` (the Hub log's first part)."""
    formatter = logging.Formatter("%(asctime)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(boot_log)):
        handler.setFormatter(formatter)
        root.addHandler(handler)


class Pod:
    """The running pod: its effective settings, the children derived from them, and their supervisor."""

    def __init__(self, settings: Settings, environ: Mapping[str, str], remote: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.environ = environ
        self.remote = dict(remote or {})
        self.engine_env: Mapping[str, str] = {}
        self.supervisor = Supervisor(Path(settings.state_dir), on_incident=self.incident)
        self.stopping = asyncio.Event()

    async def serve(self) -> int:
        command = prepare_engine(self.settings, "cpu", self.engine_env)
        self.supervisor.start(self.engine_spec(command))
        log.info("vLLM launched %.2f s after the process started", seconds_since_process_start())
        if self.settings.bridge:
            self.supervisor.start(self.bridge_spec(command))
        await self.start_sshd()
        self.catch_signals()
        await self.stopping.wait()
        log.info("stopping: every child gets SIGTERM, then SIGKILL after %.0f s", self.supervisor.grace_s)
        await self.supervisor.stop()
        log.info("stopped")
        return 0

    def catch_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)

    def incident(self, message: str) -> None:
        """A death or restart was logged; the Hub log publishes it at once."""

    # --- the children ---

    def engine_spec(self, command: EngineCommand) -> ChildSpec:
        health = Health(engine_probe(command), **ENGINE_HEALTH)
        return ChildSpec(ENGINE, command.argv, {**self.environ, **command.env}, health)

    def bridge_spec(self, command: EngineCommand) -> ChildSpec:
        settings = self.settings
        argv = [sys.executable, "-m", "runtime", "bridge", "--upstream", command.base_url,
                "--host", settings.listen, "--port", str(settings.port)]
        env = {**self.remote, **self.environ}  # the bridge reads its VL_* settings: the Hub file's, then the pod's
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RUNTIME_ROOT), env.get("PYTHONPATH", "")) if p)
        return ChildSpec(BRIDGE, argv, env, Health(http_ok(f"http://127.0.0.1:{settings.port}/health"), **BRIDGE_HEALTH))

    async def start_sshd(self) -> None:
        from runtime import sshd

        if not self.settings.ssh:
            log.info("sshd off (VL_SSH=off)")
            return
        argv = await asyncio.to_thread(sshd.prepare, sshd_layout(self.settings), self.environ)
        if argv is not None:
            self.supervisor.start(ChildSpec(SSHD, argv, dict(self.environ)))

    # --- live reconfiguration ---

    async def reconfigure(self, new: Settings, remote: Mapping[str, str]) -> None:
        """Apply a new remote configuration: restart what its changes need, and only that."""
        deferred = [v.env for v in VARIABLES if v.scope is Scope.POD and getattr(new, v.attr) != getattr(self.settings, v.attr)]
        new = keep_pod_settings(new, self.settings)
        scopes = self.settings.changed_scopes(new)
        if Scope.ENGINE in scopes:
            try:
                command = await asyncio.to_thread(prepare_engine, new, "cpu", self.engine_env)
            except SettingsError as error:
                log.error("remote configuration refused: %s; the current one keeps serving", error)
                return
        self.settings, self.remote = new, dict(remote)
        if Scope.ENGINE in scopes:
            await self.replace_engine(command)
        elif Scope.BRIDGE in scopes:
            self.supervisor.restart(BRIDGE, "its settings changed", self.bridge_spec(engine_command(new, self.engine_env)))
        if deferred:
            log.info("%s changed: takes effect at the next pod start", ", ".join(deferred))

    async def replace_engine(self, command: EngineCommand) -> None:
        has_bridge = BRIDGE in self.supervisor.children
        if has_bridge and not self.settings.bridge:
            await self.supervisor.stop(BRIDGE)  # vLLM takes over the public port
        self.supervisor.restart(ENGINE, "its settings changed", self.engine_spec(command))
        if self.settings.bridge:
            if has_bridge:
                self.supervisor.restart(BRIDGE, "the engine changed", self.bridge_spec(command))
            else:
                self.supervisor.start(self.bridge_spec(command))


def keep_pod_settings(new: Settings, current: Settings) -> Settings:
    """`new` with the pod-scope settings of `current`: those are read once, at start."""
    values, sources = new.raw(), dict(new.sources)
    for variable in VARIABLES:
        if variable.scope is Scope.POD:
            values[variable.attr] = getattr(current, variable.attr)
            sources[variable.attr] = current.sources[variable.attr]
    return Settings(values, sources)


def sshd_layout(settings: Settings):  # noqa: ANN201 - runtime.sshd is imported only once vLLM is launched
    from runtime.sshd import SshdLayout

    return SshdLayout(
        config_file=Path(settings.state_dir) / "sshd_config",
        host_key_dir=Path(settings.ssh_host_keys),
        authorized_keys=Path(settings.ssh_authorized_keys),
        environment_file=Path(settings.ssh_env_file),
        port=settings.ssh_port,
        listen=settings.listen,
    )


def http_ok(url: str):  # noqa: ANN201
    """A probe: GET `url` answers 200."""

    async def probe() -> bool:
        import httpx

        async with httpx.AsyncClient() as client:
            return (await client.get(url)).status_code == 200

    return probe


def engine_probe(command: EngineCommand):  # noqa: ANN201
    from runtime.engine import probe

    async def works() -> bool:
        return await asyncio.to_thread(probe, command)

    return works


def seconds_since_process_start() -> float:
    """How long ago this process was created (interpreter start-up included), from /proc."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
