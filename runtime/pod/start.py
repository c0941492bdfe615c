"""`python -m runtime start`, the image's entrypoint: settings, GPU check, then vLLM, the bridge and
sshd under the supervisor, the Hub log while the pod is not healthy, and live reconfiguration.

Nothing heavy runs before vLLM is launched: settings, recipes and the GPU check (the Hub client only
when a Hub repo is configured); HTTP clients and sshd's key generation come after, so that a
prebaked pod launches vLLM within moments (the seeds' image took ~15 s). A stock image (no marker)
starts in the base's python, which has only the standard library: it installs the runtime into VL_VENV
and re-executes itself there (runtime.engine.install).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.engine.command import RUNTIME_ROOT, EngineCommand
from runtime.engine.install import InstallError, ensure_runtime, is_prebaked, runs_in_venv
from runtime.engine.volume import cache_root
from runtime.engine.weights import WeightsError
from runtime.gpu import GpuError
from runtime.health import Answers200, engine_generates, health_url, serves_model
from runtime.logfiles import BRIDGE, ENGINE, SSHD, log_file
from runtime.pod.diagnosis import explain
from runtime.pod.engines import ChangeRefused, Engines, check_swap
from runtime.pod.gateway import check_roles, keep_workers
from runtime.pod.preload import preload_in_background
from runtime.pod.replicas import DRAIN_S, Replica, drained
from runtime.pod.router import ROUTER, RouterError, check_router, router_argv, router_url
from runtime.pod.selfstop import SelfStop
from runtime.pod.sshd import SshdLayout, prepare_sshd
from runtime.pod.supervisor import ChildSpec, Health, StartLimit, Supervisor
from runtime.settings import Scope, Settings, SettingsError, load_settings, unknown_settings
from runtime.settingsfile import FileRefused, SettingsFile, settings_with_file
from runtime.state.enginehealth import forget_engine_health, write_engine_health
from runtime.state.preload import RepoPreload, forget_preload_state, write_preload_state
from runtime.state.selfcheck import SELFCHECK_KEY, checked, forget_selfcheck, read_selfcheck, write_selfcheck
from runtime.state.swap import (
    DOWNLOADING,
    PREPARING,
    SERVING,
    WAITING,
    Phase,
    asked,
    forget_swap,
    swap_table,
)

if TYPE_CHECKING:
    from runtime.hub import LogPublisher, Redactor, RemoteConfig

log = logging.getLogger("runtime.pod.start")

# The bridge's /health does not touch the engine: two misses in a row mean it is hung (seeds' watchdog).
# 10 s: a loaded machine can stall a sound bridge for seconds, and a restart cuts every open stream.
BRIDGE_HEALTH = functools.partial(Health, interval_s=10.0, timeout_s=10.0, failures_before_restart=2)
ROUTER_HEALTH = functools.partial(Health, interval_s=10.0, timeout_s=10.0, failures_before_restart=3)
# A real one-token generation: a dead engine can still answer /v1/models with 200. Generous timeout:
# a saturated engine queues the probe behind real work, and restarting a busy engine is a disaster.
ENGINE_PROBE_S = 60.0
ENGINE_HEALTH = functools.partial(Health, interval_s=15.0, timeout_s=ENGINE_PROBE_S, failures_before_restart=3)
ENGINE_START_TRIES = 3  # failed starts in a row (never healthy) before the engine is left stopped: each costs minutes
ENGINE_HEALTH_NOTE_S = 1.0  # how often the engines' health is compared with what /health last read
BRIDGE_CATCH_UP_S = 120.0  # the self-check waits this long for the bridge to name the model its engine serves
HUB_LAST_WORDS_S = 20.0  # how long a refused start waits for its one line to reach the Hub log
REFUSED = 2  # exit status of a start refused by a setting, the GPU or the install
CRASHED = 1  # exit status of a start stopped by anything else (its traceback is in boot.log)
KEEPS_SERVING = "the current configuration keeps serving"
SWAP_POLL_S = 0.25  # how often the pod looks for the bridge's swap request (a small file)
SWAP_WAIT_LOOK_S = 1.0  # how often a swap held back by VL_SWAP_MIN_S looks whether it is still asked for


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "Reads the VL_* variables (docs/reference/settings.md); stops on SIGTERM or SIGINT."


def run(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    try:
        return start(environ)
    except Exception as error:  # before the pod's Hub log exists (its own crashes are start()'s)
        line = crash_line(error)
        print(line, file=sys.stderr)
        publish_refusal(line, environ)
        return CRASHED


def start(environ: Mapping[str, str]) -> int:
    unknown = unknown_settings(environ)
    try:
        settings = load_settings(environ)  # the pod scope is final here: no Hub file can change it
    except SettingsError as error:
        print("\n".join([*unknown, str(error)]), file=sys.stderr)
        publish_refusal(str(error), environ)
        return REFUSED
    if environ.get("SPACE_ID"):  # the Hugging Face builder runs the image on a CPU: say what it is
        from runtime.pod.builder_page import serve_builder_page

        return serve_builder_page(settings, environ)
    log_to(Path(settings.state_dir))
    for line in unknown:
        log.warning("%s", line)
    if not is_prebaked(settings) and not runs_in_venv(settings):
        return enter_venv(settings, environ)
    hub = PodHub.connect(settings, environ)
    try:
        pod = Pod(starting_settings(settings, environ, hub), environ, hub)
        pod.prepare()
        status = asyncio.run(pod.serve())
    except (SettingsError, GpuError, InstallError, WeightsError, RouterError) as error:
        log.error("%s", error)
        hub.tell(str(error))
        status = REFUSED
    except Exception as error:
        line = crash_line(error)
        log.error("%s", line)
        logging.getLogger(TRACEBACKS).error("%s", line, exc_info=error)
        hub.tell(line)
        status = CRASHED
    hub.close(HUB_LAST_WORDS_S if status else 2.0)
    return status


def crash_line(error: BaseException) -> str:
    """The one line an unexpected error gives (the Hub log's redactor masks what it quotes)."""
    message = " ".join(str(error).split())[:500]
    return f"runtime start failed: {type(error).__name__}: {message}".rstrip(": ")


def enter_venv(settings: Settings, environ: Mapping[str, str]) -> int:
    """A stock image's first process: installs the runtime into VL_VENV, then becomes `runtime start`
    there (our code found through PYTHONPATH from any directory); returns only a refusal's status."""
    log.info("no %s: a stock image, the runtime runs from %s", settings.prebaked_marker, settings.venv)
    try:
        ensure_runtime(settings, environ)
    except InstallError as error:
        log.error("%s", error)
        publish_refusal(str(error), environ)
        return REFUSED
    python = str(Path(settings.venv) / "bin" / "python")
    path = os.pathsep.join(filter(None, (str(RUNTIME_ROOT), environ.get("PYTHONPATH"))))
    os.execve(python, [python, "-m", "runtime", *sys.argv[1:]], {**environ, "PYTHONPATH": path})


TRACEBACKS = "runtime.tracebacks"  # a logger whose records reach boot.log only


def log_to(state_dir: Path) -> None:
    """The runtime's own log: on stderr (the container's log, which has its own timestamps) and in
    `boot.log`, the first part of the Hub log; an unexpected error's traceback in boot.log alone."""
    state_dir.mkdir(parents=True, exist_ok=True)
    console, boot = logging.StreamHandler(sys.stderr), logging.FileHandler(log_file(state_dir, "boot"))
    console.setFormatter(logging.Formatter("%(message)s"))
    boot.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    logging.basicConfig(level=logging.WARNING, handlers=[console, boot])
    logging.getLogger("runtime").setLevel(logging.INFO)  # libraries' INFO is a line per HTTP request
    tracebacks = logging.getLogger(TRACEBACKS)
    tracebacks.addHandler(boot)
    tracebacks.propagate = False


def publish_refusal(line: str, environ: Mapping[str, str]) -> None:
    """The line that stopped start-up before the pod's Hub side existed, to the Hub log when one is
    configured (the pod may have no SSH) and its client is installed (a stock image's python has none
    before installing the runtime)."""
    repo = environ.get("VL_LOG_REPO", "").strip()
    if not repo or importlib.util.find_spec("huggingface_hub") is None:
        return
    from runtime.hub import LogPublisher, Redactor
    from runtime.hub.repo import HubRepo, pod_id

    try:
        hub = HubRepo.from_environ(repo, environ)
    except ValueError:
        return  # the bad setting was the log repo itself
    last_words = PodHub(LogPublisher(hub, pod_id(environ), {}, lambda: False, Redactor.from_environ(environ)))
    last_words.tell(line)
    last_words.close(HUB_LAST_WORDS_S)


@dataclass
class PodHub:
    """The pod's Hub side, made from the environment's settings (the pod scope, which no Hub file can
    change): the log publisher, the settings file's source, and the redactor both share. Each is
    None when its repo is not configured (the Hub client is then never imported)."""

    log: LogPublisher | None = None
    remote: RemoteConfig | None = None
    redactor: Redactor | None = None

    @classmethod
    def connect(cls, settings: Settings, environ: Mapping[str, str]) -> PodHub:
        if not (settings.log_repo or settings.config_repo):
            return cls()
        from runtime.hub import LogPublisher, Redactor, RemoteConfig

        redactor = Redactor.from_environ(environ)
        logs = {name: log_file(Path(settings.state_dir), name) for name in ("boot", ENGINE, BRIDGE)}
        # Not healthy until the pod says so: the Pod hands its supervisor's verdict over once it exists.
        publisher = LogPublisher.from_settings(settings, environ, logs, lambda: False, redactor)  # idle without a repo
        remote = RemoteConfig.from_settings(settings, environ) if settings.config_repo else None
        return cls(publisher, remote, redactor)

    def tell(self, line: str) -> None:
        """A death, a restart, a refusal: to the Hub log at once (when the publisher runs)."""
        if self.log is not None:
            self.log.publish_now(line)

    def follow(self, state_dir: Path, names: Sequence[str]) -> None:
        """Publish the logs of these children (the pod's engines and router, once known) with boot's."""
        if self.log is not None:
            self.log.sources = {name: log_file(state_dir, name) for name in ("boot", *names)}

    def learn(self, values: Mapping[str, str]) -> None:
        if self.redactor is not None:
            self.redactor.learn(values)

    def close(self, timeout_s: float) -> None:
        """Publishes what is pending (started first if need be), then stops, within `timeout_s`."""
        if self.log is not None:
            self.log.start()
            self.log.close(timeout_s)


def starting_settings(settings: Settings, environ: Mapping[str, str], hub: PodHub) -> Settings:
    """The settings the pod starts on: the environment's, with the Hub file applied when it can be read
    and is accepted (judged exactly as a live change is)."""
    file = hub.remote.read() if hub.remote is not None else None
    new = judged(settings, environ, file, hub) if file is not None else None
    if file is None or new is None:
        return settings
    changed = sorted(scope.value for scope in settings.changed_scopes(new))
    log.info("settings from %s (changing %s)", file.where, ", ".join(changed) or "nothing")
    return new


def judged(current: Settings, environ: Mapping[str, str], file: SettingsFile, hub: PodHub) -> Settings | None:
    """The settings `file` yields over `current`, or None once its refusal is logged and published."""
    values: dict[str, str] = {}

    def learn(file_values: Mapping[str, str]) -> None:
        values.update(file_values)
        hub.learn(file_values)  # before any message can quote them

    try:
        new = settings_with_file(current, environ, file, learn)
    except FileRefused as refusal:
        refuse(str(refusal), hub)
        return None
    for name in sorted(set(values) & set(environ)):
        log.info("%s from %s is overridden by the pod's environment", name, file.where)
    return new


def refuse(line: str, hub: PodHub) -> None:
    """One wording for every refusal of the Hub file, at start and live."""
    line = f"{line}; {KEEPS_SERVING}"
    log.error("%s", line if hub.redactor is None else hub.redactor(line))
    hub.tell(line)


DESKTOP_ONLY = ("VL_DESKTOP", "VL_DESKTOP_PASSWORD")  # the password is the desktop's alone: no other child sees it


def without_desktop(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child other than the desktop: the pod's, less the desktop's settings."""
    return {name: value for name, value in environ.items() if name not in DESKTOP_ONLY}


class Pod:
    """The running pod, built once from its final settings: the children they call for, their
    supervisor, and the live changes from the Hub file."""

    def __init__(self, settings: Settings, environ: Mapping[str, str], hub: PodHub) -> None:
        self.environ, self.hub = environ, hub
        self.children_environ = without_desktop(environ)  # every child's but the desktop's
        self.state_dir = Path(settings.state_dir)
        self.supervisor = Supervisor(self.state_dir, on_incident=hub.tell)
        if hub.log is not None:
            hub.log.is_healthy = self.supervisor.healthy
        self.engines = Engines(settings, self.supervisor, self.engine_spec)  # what they run, and every change of it
        self.loop: asyncio.AbstractEventLoop | None = None
        # The HEALTHCHECK asks the same URL (runtime.health.pod_health_url): both read the pod scope.
        self.bridge_probe = Answers200(health_url(settings.listen, settings.port))
        self.bridge_health = BRIDGE_HEALTH(self.bridge_probe)
        self.stopping = asyncio.Event()
        self.changes: asyncio.Queue[SettingsFile] = asyncio.Queue()
        self.self_stop = SelfStop.from_settings(settings, environ)  # VL_IDLE_STOP_MIN, VL_MAX_SPEND
        self.selfcheck_key = secrets.token_urlsafe(32)  # VL_SELFCHECK's key: the bridge's alone, never published

    @property
    def settings(self) -> Settings:
        """The settings in force (Engines.settings: the configured ones, on the swapped model after a swap)."""
        return self.engines.settings

    @property
    def command(self) -> EngineCommand | None:
        return self.engines.command

    @property
    def replicas(self) -> tuple[Replica, ...]:
        """The engines (VL_REPLICAS): one, or several behind the router; none on a gateway."""
        return self.engines.replicas

    def prepare(self) -> None:
        """Everything before vLLM's launch: the GPU, the engine (installed unless prebaked), the weights;
        a gateway has none of them, only its router."""
        check_roles(self.settings)
        if self.settings.desktop:  # an image built without the desktop refuses it in one line, before vLLM starts
            from runtime.pod.desktop import check_desktop

            check_desktop()
        forget_engine_health(self.state_dir)  # a previous start's, with other engines or workers
        forget_swap(self.state_dir)
        if self.gateway:
            version = check_router(self.settings)
            log.info(
                "a gateway in front of %d pods (smg %s, %s)", len(self.settings.workers), version, self.settings.routing
            )
            self.hub.follow(self.state_dir, [ROUTER, BRIDGE])
            return
        if not is_prebaked(self.settings):
            self.publish_progress()
        self.engines.prepare(self.environ, self.publish_progress)
        if self.routed:
            version = check_router(self.settings)
            log.info("%d engines behind the router (smg %s, %s)", len(self.replicas), version, self.settings.routing)
            self.hub.follow(self.state_dir, [*(r.name for r in self.replicas), ROUTER, BRIDGE])

    @property
    def gateway(self) -> bool:
        return self.settings.role == "gateway"

    @property
    def routed(self) -> bool:
        """Whether the router runs: in front of several engines, or of a gateway's pods."""
        return len(self.replicas) > 1 or self.gateway

    def publish_progress(self) -> None:
        """Installing or downloading takes minutes: the Hub log shows their progress from now on."""
        if self.hub.log is not None:
            self.hub.log.start()

    async def serve(self) -> int:
        """Launch the children (vLLM first: it takes longest), watch the Hub, supervise until SIGTERM;
        whatever ends it, no child outlives it."""
        assert self.command is not None or self.gateway
        self.loop = asyncio.get_running_loop()
        self.catch_signals()  # before any launch: a SIGTERM must never leave a child behind
        applying = asyncio.create_task(self.apply_changes())
        budget = asyncio.create_task(self.stop_when_due(self.self_stop)) if self.self_stop else None
        engines_seen = None
        if self.gateway:
            engines_seen = asyncio.create_task(keep_workers(self.settings, self.state_dir, router_url(self.settings)))
        elif self.routed:
            engines_seen = asyncio.create_task(self.note_engine_health())
        swapping = asyncio.create_task(self.keep_swapping()) if self.replicas else None
        preloading = asyncio.create_task(self.preload_when_serving())
        checking = asyncio.create_task(self.check_when_serving())
        try:
            for replica in self.replicas:
                self.supervisor.start(self.engine_spec(replica))
            if self.replicas:
                log.info("vLLM launched %.2f s after the process started", seconds_since_process_start())
            if self.routed:
                self.supervisor.start(self.router_spec())
            if self.settings.bridge:
                self.supervisor.start(self.bridge_spec())
            self.publish_progress()
            if self.hub.remote is not None:
                self.hub.remote.start(self.file_arrived)
            self.start_desktop()
            await self.start_sshd()
            await self.stopping.wait()
            log.info("stopping: SIGTERM to every child, SIGKILL after %.0f s", self.supervisor.grace_s)
        finally:
            applying.cancel()
            for task in (budget, engines_seen, self.engines.rolling, swapping, preloading, checking):
                if task is not None:
                    task.cancel()
            if self.hub.remote is not None:
                self.hub.remote.stop(timeout_s=1.0)
            await self.supervisor.stop()
            await self.bridge_probe.aclose()
        log.info("stopped")
        return 0

    def catch_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)

    # --- the children ---

    def engine_spec(self, replica: Replica) -> ChildSpec:
        command = replica.command
        health = ENGINE_HEALTH(engine_generates(command, ENGINE_PROBE_S))
        limit = StartLimit(ENGINE_START_TRIES, explain)  # an engine that cannot start is not restarted for ever
        return ChildSpec(replica.name, command.argv, {**self.children_environ, **command.env}, health, limit)

    def router_spec(self) -> ChildSpec:
        """The router in front of the engines; health-checked like the bridge (its /health is its own)."""
        argv = router_argv(
            self.settings, [replica.command.base_url for replica in self.replicas]
        )  # a gateway's: none yet
        return ChildSpec(
            ROUTER, argv, dict(self.children_environ), ROUTER_HEALTH(Answers200(f"{router_url(self.settings)}/health"))
        )

    def bridge_spec(self) -> ChildSpec:
        settings = self.settings
        # A gateway knows no recipe: its workers' bridges relay what it asks, thinking off unless asked.
        unasked = self.command is not None and self.command.recipe.thinks_unasked
        if not self.routed:
            argv = bridge_argv(self.replicas[0].command.base_url, settings.listen, settings.port, unasked)
        else:  # generations through the router; the rest (and aborts) to the engines, or the pods, themselves
            # A gateway's bridge reads its pods from VL_WORKERS: a URL on its command line is in `ps` and its log.
            engines = [] if self.gateway else [replica.command.base_url for replica in self.replicas]
            argv = bridge_argv(router_url(settings), settings.listen, settings.port, unasked)
            argv += [word for engine in engines for word in ("--engine", engine)]
        argv += ["--ledger", str(cache_root(settings) / USAGE_LEDGER)]  # on the volume, when the pod has one
        # Every setting the bridge reads, as they are now: its own, and the pod's (state folder, image facts).
        env = without_desktop({**self.environ, **settings.environ(Scope.BRIDGE, Scope.POD)})
        env[SELFCHECK_KEY] = self.selfcheck_key
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(RUNTIME_ROOT), env.get("PYTHONPATH"))))
        return ChildSpec(BRIDGE, argv, env, self.bridge_health)

    async def start_sshd(self) -> None:
        if not self.settings.ssh:
            log.info("sshd off (VL_SSH=off)")
            return
        try:
            argv = await asyncio.to_thread(prepare_sshd, sshd_layout(self.settings), self.children_environ)
        except (OSError, subprocess.CalledProcessError) as error:  # no SSH is no reason to stop serving
            log.warning("sshd not started: %s", error)
            return
        if argv is not None:
            self.supervisor.start(ChildSpec(SSHD, argv, dict(self.children_environ)))

    def start_desktop(self) -> None:
        """VL_DESKTOP=on: the browser desktop's launcher, a child like the others (restarted when it, or any
        piece of it, dies)."""
        if not self.settings.desktop:
            return
        from runtime.logfiles import DESKTOP
        from runtime.pod.desktop import desktop_url, launcher_argv

        self.supervisor.start(ChildSpec(DESKTOP, launcher_argv(), dict(self.environ)))
        log.info("desktop: %s (its password: VL_DESKTOP_PASSWORD)", desktop_url(self.environ, self.settings.listen))

    async def preload_when_serving(self) -> None:
        """VL_PRELOAD: once the first engine serves, the other repos' weights downloaded into the cache by a one-shot
        child at the lowest priority (runtime.pod.preload), so that a later swap downloads nothing; the repos the engine
        serves are in the cache already. Meanwhile the console shows them waiting. Cancelled, it kills the child."""
        forget_preload_state(self.state_dir)  # a previous start's
        command = self.command
        if command is None:  # a gateway keeps no weights
            return
        repos = [repo for repo in self.settings.preload if repo not in command.hub_repos]
        if not repos:
            return
        write_preload_state(self.state_dir, map(RepoPreload, repos))
        await self.engines.until_serving()
        await preload_in_background(repos, command.cache, self.state_dir, self.children_environ, self.hub.tell)

    @property
    def self_checks(self) -> bool:
        """VL_SELFCHECK: on, or auto on a GPU; through the bridge, so never on a gateway or with VL_BRIDGE=off."""
        wanted = self.settings.selfcheck == "on" or (
            self.settings.selfcheck == "auto" and self.engines.accelerator == "cuda"
        )
        return wanted and self.settings.bridge and self.command is not None

    async def check_when_serving(self) -> None:
        """VL_SELFCHECK: once the model first serves, `runtime check` against the pod's own bridge, one check at a
        time and each once no user request is in flight; every outcome to the Hub log and selfcheck.json."""
        from runtime.client.check import CHECKS, Outcome, run_checks  # httpx: not on the light path to vLLM's launch
        from runtime.client.connect import EndpointError

        forget_selfcheck(self.state_dir)  # a previous start's
        if not self.self_checks:
            return
        command = self.command
        assert command is not None
        outcomes: list[dict[str, str]] = []
        write_selfcheck(self.state_dir, "running", outcomes)  # from the start: `pod up` waits for a verdict, not "off"
        await self.engines.until_serving()

        def said(outcome: Outcome) -> None:
            outcomes.append({"name": outcome.name, "status": outcome.status, "detail": outcome.detail})
            write_selfcheck(self.state_dir, "running", outcomes)
            self.hub.tell(f"self-check {outcome.name}: {outcome.status}: {outcome.detail}")

        async def users_first() -> None:
            while not await drained(command, DRAIN_S):
                pass

        url = health_url(self.settings.listen, self.settings.port).removesuffix("/health")
        await bridge_serves(url, self.selfcheck_key, BRIDGE_CATCH_UP_S)
        try:
            await run_checks(url, self.selfcheck_key, list(CHECKS), said, command.served_names[0], users_first)
        except EndpointError as error:
            said(Outcome("endpoint", "failed", str(error)))
        failed = any(outcome["status"] == "failed" for outcome in outcomes)
        write_selfcheck(self.state_dir, "failed" if failed else "passed", outcomes)
        line = f"self-check: {checked(read_selfcheck(self.state_dir))}"
        log.log(logging.WARNING if failed else logging.INFO, "%s", line)
        self.hub.tell(line)

    async def note_engine_health(self) -> None:
        """Several engines: their health, as the supervisor sees it, in the file the bridge's /health reads."""
        last: dict[str, bool] | None = None
        while True:
            now = {r.name: self.supervisor.is_healthy(r.name) for r in self.replicas}
            if now != last:
                await asyncio.to_thread(write_engine_health, self.state_dir, now)
                last = now
            await asyncio.sleep(ENGINE_HEALTH_NOTE_S)

    # --- the model swap (VL_SWAP): the damping here, the engine change in Engines ---

    async def keep_swapping(self) -> None:
        """Swap to the recipe the bridge asks for (runtime.state.swap's files), one swap at a time, while VL_SWAP
        lists it; a request for the loaded recipe, or for one VL_SWAP no longer lists, changes nothing."""
        engines = self.engines
        engines.tell(SERVING)
        await engines.until_serving()
        engines.swap = replace(engines.swap, since=time.time())  # VL_SWAP_MIN_S counts from the first answer
        engines.tell(SERVING)
        while True:
            wanted = await asyncio.to_thread(asked, self.state_dir) or ""
            if wanted in swap_table(self.settings.swap).values() and wanted != self.settings.model:
                await self.swap_to(wanted)
            await asyncio.sleep(SWAP_POLL_S)

    async def swap_to(self, recipe: str) -> None:
        """Restart the engine on `recipe` after the loaded one's VL_SWAP_MIN_S (a waiting swap is dropped when asked
        back for the loaded one); its weights ready first (the old engine answers meanwhile), then Engines' change."""
        old, asked_at = self.settings.model, time.monotonic()
        if (due := self.swap_due_in()) > 0:
            log.info("swap to %s asked: %s stays at least %.0f s more (VL_SWAP_MIN_S)", recipe, old, due)
            self.engines.tell(WAITING, recipe)
            while self.swap_due_in() > 0:  # VL_SWAP_MIN_S read anew: a Hub file may change it meanwhile
                await asyncio.sleep(min(self.swap_due_in(), SWAP_WAIT_LOOK_S))
                if await asyncio.to_thread(asked, self.state_dir) != recipe:
                    self.engines.tell(SERVING)
                    return  # asked back meanwhile: the loop swaps to whatever is asked now
        async with self.engines.changing:
            restarts = await self.swap_now(old, recipe)
        if restarts is None:
            return
        try:
            await restarts
        except ChangeRefused as error:  # its engine could not start: left stopped, and the requests told why
            self.swap_failed(recipe, error)
            return
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if restarts.cancelled() and current is not None and not current.cancelling():
                log.info("swap to %s taken over by a newer change", recipe)
                self.engines.tell(SERVING)
                return
            raise
        seconds = time.monotonic() - asked_at
        last = {"from": old, "to": recipe, "seconds": round(seconds, 1)}
        self.engines.swap = replace(self.engines.swap, last=last, since=time.time())  # VL_SWAP_MIN_S: from now
        self.engines.tell(SERVING)
        line = f"swapped the model: {recipe} serves ({old} -> {recipe} in {seconds:.0f} s)"
        log.info("%s", line)
        self.hub.tell(line)

    async def swap_now(self, old: str, recipe: str) -> asyncio.Task[None] | None:
        """The engine change to `recipe` begun (its restarts, returned), or refused in one line (None)."""
        engines = self.engines
        engines.tell(PREPARING, recipe)
        self.hub.tell(f"swapping the model: {old} -> {recipe} (asked by a request)")
        try:
            return await engines.change_to(
                engines.on_recipe(self.settings, recipe),
                f"swapping the model to {recipe}",
                recipe,
                lambda: self.downloading(recipe),
            )
        except ChangeRefused as error:
            self.swap_failed(recipe, error, f"{old} keeps serving")
            return None

    def swap_failed(self, recipe: str, error: ChangeRefused, after: str = "the engine is left stopped") -> None:
        """A swap that could not be prepared, or whose engine could not start: said in one line, and recorded for the
        requests that wait for it (they get a 500 naming the reason)."""
        line = f"swap to {recipe} refused: {error}; {after}"
        log.error("%s", line)
        self.hub.tell(line)
        engines = self.engines
        engines.swap = replace(engines.swap, failed={"recipe": recipe, "reason": str(error), "at": time.time()})
        engines.tell(SERVING)

    def swap_due_in(self) -> float:
        """Seconds before the loaded recipe has had its VL_SWAP_MIN_S (a swap away from it waits that long)."""
        return self.engines.swap.since + self.settings.swap_min_s - time.time()

    def downloading(self, recipe: str) -> None:
        """prepare_engine's word before a download (on its thread): the phase, and the Hub log's progress."""
        self.engines.tell(DOWNLOADING, recipe)
        self.publish_progress()

    async def stop_when_due(self, stopper: SelfStop) -> None:
        """VL_IDLE_STOP_MIN and VL_MAX_SPEND: the reason said in the Hub log first, then RunPod stops the pod
        (and sends SIGTERM); a refused stop is said and tried again."""
        from runtime.client.runpod import RunPodError  # httpx: not on the light path to vLLM's launch

        while True:
            await asyncio.sleep(stopper.check_s)  # a periodic look at the clock and the activity file
            reason = stopper.reason(time.time(), self.settings.cost_per_hour)
            if reason is None:
                continue
            line = f"stopping this pod: {reason}"
            log.warning("%s", line)
            if self.hub.log is not None:
                await asyncio.to_thread(self.hub.log.publish_and_wait, line, HUB_LAST_WORDS_S)
            try:
                await asyncio.to_thread(stopper.stop)
            except RunPodError as error:
                refusal = f"could not stop this pod: {error}; trying again in {stopper.check_s:g} s"
                log.error("%s", refusal)
                self.hub.tell(refusal)
                continue
            log.info("RunPod is stopping this pod")
            return

    # --- live reconfiguration ---

    def file_arrived(self, file: SettingsFile) -> None:
        """The Hub watcher's callback, on its thread: hand the new file over to the event loop."""
        assert self.loop is not None  # the watcher starts once the loop runs
        self.loop.call_soon_threadsafe(self.changes.put_nowait, file)

    async def apply_changes(self) -> None:
        while True:
            await self.reconfigure(await self.changes.get())

    async def bridge_gives_way(self) -> None:
        """VL_BRIDGE=off: the bridge stopped before vLLM restarts on its port."""
        log.info("stopping the bridge: with VL_BRIDGE=off, vLLM itself serves port %d", self.settings.port)
        await self.supervisor.stop(BRIDGE)

    def bridge_takes_over(self) -> None:
        """VL_BRIDGE=on again: the bridge started once vLLM has left the public port (it serves on its own now)."""
        self.supervisor.start(self.bridge_spec())

    async def reconfigure(self, file: SettingsFile) -> None:
        """The one place a new Hub file is judged, compared with what runs, and acted on: restart what
        the change needs, and only that; a refused file changes nothing. One engine change at a time."""
        async with self.engines.changing:
            await self.reconfigure_now(file)

    async def reconfigure_now(self, file: SettingsFile) -> None:
        engines = self.engines
        new = judged(engines.configured, self.environ, file, self.hub)
        if new is None:
            return
        try:
            check_swap(new, len(self.replicas))
        except SettingsError as error:
            refuse(f"refused {file.where}: {error}", self.hub)
            return
        configured = new
        if self.settings.model != new.model == engines.configured.model:
            new = engines.on_recipe(new, self.settings.model)  # the file left the model alone: the swapped one stays
        scopes = self.settings.changed_scopes(new)
        if self.gateway and Scope.ENGINE in scopes:
            log.info("engine settings from %s are ignored: a gateway has no engine (its workers do)", file.where)
            scopes.discard(Scope.ENGINE)
        if not scopes:
            engines.configured = configured
            return
        bridge_runs = BRIDGE in self.supervisor.children
        if Scope.ENGINE in scopes:
            stop_bridge = self.bridge_gives_way if bridge_runs and not new.bridge else None
            start_bridge = self.bridge_takes_over if new.bridge and not bridge_runs else None
            try:
                await engines.change_to(new, "its settings changed", before=stop_bridge, after=start_bridge)
            except ChangeRefused as error:
                refuse(f"refused {file.where}: {error}", self.hub)
                return
        else:
            engines.plan = replace(engines.plan, settings=new)
        engines.configured = configured
        log.info("new settings from %s: restarting %s", file.where, " and ".join(sorted(s.value for s in scopes)))
        if Scope.ENGINE in scopes:
            engines.tell(SERVING)  # another recipe
        elif Scope.BRIDGE in scopes:
            engines.tell(Phase(engines.swap.phase), engines.swap.target)  # another VL_SWAP: a swap's phase as it is
        if Scope.BRIDGE in scopes and bridge_runs and new.bridge:
            self.supervisor.restart(BRIDGE, "its settings changed", self.bridge_spec())
        # A running bridge stays: it learns the new model from vLLM's /v1/models.


USAGE_LEDGER = "usage-ledger.jsonl"  # each key's totals, across restarts (runtime/bridge/ledger.py)


def bridge_argv(upstream: str, host: str, port: int, thinks_unasked: bool = False) -> list[str]:
    """The bridge's command line: `python -m runtime bridge` on `host:port`, in front of `upstream`."""
    argv = [sys.executable, "-m", "runtime", "bridge", "--upstream", upstream, "--host", host, "--port", str(port)]
    return [*argv, "--thinks-unasked"] if thinks_unasked else argv


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


def seconds_since_process_start() -> float:
    """How long ago this process was created (interpreter start-up included), from /proc."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


async def bridge_serves(url: str, key: str, within_s: float) -> None:
    """Returns once the bridge at `url` names the model its engine serves (it learns it by asking the engine, a
    little after the engine is healthy), or after `within_s`: the self-check then fails honestly at its endpoint."""
    import httpx  # not on the light path to vLLM's launch

    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"{url}/health", headers={"x-api-key": key})
                if serves_model(answer.status_code, answer.content):
                    return
            await asyncio.sleep(1.0)  # polling the pod's own bridge: it has no notification to wait on
