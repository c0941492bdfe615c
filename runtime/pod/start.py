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
import importlib.util
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from runtime.cluster import ClusterNode
from runtime.engine.command import RUNTIME_ROOT
from runtime.engine.install import InstallError, ensure_runtime, is_prebaked, runs_in_venv
from runtime.engine.weights import WeightsError
from runtime.gpu import GpuError
from runtime.logfiles import BRIDGE, log_file
from runtime.pod.changes import SettingsChanges
from runtime.pod.children import Children
from runtime.pod.engines import Engines
from runtime.pod.gateway import check_roles
from runtime.pod.healthnotes import HealthNotes
from runtime.pod.hubside import LAST_WORDS_S, PodHub, starting_settings
from runtime.pod.nodelink import NodeLink, NodeWatch, fingerprint
from runtime.pod.preload import Preloading
from runtime.pod.router import ROUTER, RouterError, check_router
from runtime.pod.selfcheck import SelfCheck
from runtime.pod.selfstop import SelfStop, SelfStopping
from runtime.pod.supervisor import Supervisor
from runtime.pod.swapper import Swapper
from runtime.settings import Settings, SettingsError, load_settings, unknown_settings
from runtime.state.enginehealth import forget_engine_health
from runtime.state.swap import forget_swap

log = logging.getLogger(__name__)

REFUSED = 2  # exit status of a start refused by a setting, the GPU or the install
CRASHED = 1  # exit status of a start stopped by anything else (its traceback is in boot.log)


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
        hub.say(str(error))
        status = REFUSED
    except Exception as error:
        line = crash_line(error)
        log.error("%s", line)
        logging.getLogger(TRACEBACKS).error("%s", line, exc_info=error)
        hub.say(line)
        status = CRASHED
    hub.close(LAST_WORDS_S if status else 2.0)
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
    last_words.say(line)
    last_words.close(LAST_WORDS_S)


class Pod:
    """The running pod, built once from its final settings: the engines' owner, the children it supervises, and
    the duties that run beside them (each a unit with one `run()`, handed what it needs)."""

    def __init__(self, settings: Settings, environ: Mapping[str, str], hub: PodHub) -> None:
        self.environ, self.hub = environ, hub
        self.state_dir = Path(settings.state_dir)
        self.supervisor = Supervisor(self.state_dir, on_incident=hub.say)
        if hub.log is not None:
            hub.log.is_healthy = self.supervisor.healthy
        # The engines' owner: what they run, and every change of it (their specs are the children's).
        self.engines = Engines(settings, self.supervisor, lambda replica: self.children.engine_spec(replica))
        self.children = Children(self.engines, self.supervisor, environ)
        self.stopping = asyncio.Event()
        self.refusal: str | None = None  # what stopped the pod when it must not start (a cluster's disagreement)
        self.self_stop = SelfStop.from_settings(settings, environ)  # VL_IDLE_STOP_MIN, VL_MAX_SPEND

    @property
    def settings(self) -> Settings:
        """The settings in force (Engines.settings: the configured ones, on the swapped model after a swap)."""
        return self.engines.settings

    def prepare(self) -> None:
        """Everything before vLLM's launch: the GPU, the engine (installed unless prebaked), the weights;
        a gateway has none of them, only its router."""
        settings = self.settings
        check_roles(settings)
        if settings.desktop:  # an image built without the desktop refuses it in one line, before vLLM starts
            from runtime.pod.desktop import check_desktop

            check_desktop()
        forget_engine_health(self.state_dir)  # a previous start's, with other engines or workers
        forget_swap(self.state_dir)
        if self.engines.gateway:
            version = check_router(settings)
            log.info("a gateway in front of %d pods (smg %s, %s)", len(settings.workers), version, settings.routing)
            self.hub.follow(self.state_dir, [ROUTER, BRIDGE])
            return
        if not is_prebaked(settings):
            self.publish_progress()
        self.engines.prepare(self.environ, self.publish_progress)
        node = self.node
        if node is not None:
            log.info("%s; VL_CLUSTER=%s", node.describe(), self.engines.command and self.engines.command.spread)
        if self.engines.routed:
            version = check_router(settings)
            replicas = self.engines.replicas
            log.info("%d engines behind the router (smg %s, %s)", len(replicas), version, settings.routing)
            self.hub.follow(self.state_dir, [*(r.name for r in replicas), ROUTER, BRIDGE])

    def publish_progress(self) -> None:
        """Installing or downloading takes minutes: the Hub log shows their progress from now on."""
        if self.hub.log is not None:
            self.hub.log.start()

    @property
    def node(self) -> ClusterNode | None:
        """Its place in a RunPod Instant Cluster, when it is a node of one."""
        command = self.engines.command
        return command.node if command is not None else None

    def refuse(self, line: str) -> None:
        """Stop, refused in one line (the exit status of a refused start)."""
        log.error("%s", line)
        self.hub.say(line)
        self.refusal = line
        self.stopping.set()

    def duties(self) -> list[Duty]:
        """What runs beside the children while the pod serves: each VL_* feature with a loop is one of these."""
        engines, say, node = self.engines, self.hub.say, self.node
        if node is not None and engines.command is not None:
            mine = fingerprint(self.settings, engines.command)
            if not node.head:  # a worker: its engine, joined to rank 0's, and nothing else
                replica = engines.replicas[0]
                return [NodeLink(node, mine, self.supervisor, lambda: self.children.engine_spec(replica), self.refuse)]
            ranks = engines.command.data_parallel // node.nodes if engines.command.spread == "dp" else 0
            watch = NodeWatch(node, mine, self.supervisor, self.state_dir, say, ranks)
        duties: list[Duty] = [
            SettingsChanges(engines, self.children, self.hub, self.environ),
            HealthNotes(engines, self.supervisor),
            Preloading(engines, self.children.children_environ, say),
            SelfCheck(engines, self.children.selfcheck_key, say),
        ]
        if engines.replicas:
            duties.append(Swapper(engines, say, self.publish_progress))
        if self.self_stop is not None:
            duties.append(SelfStopping(self.self_stop, engines, self.hub))
        if node is not None:
            duties.append(watch)
        return duties

    async def serve(self) -> int:
        """Launch the children (vLLM first: it takes longest) and the duties, supervise until SIGTERM;
        whatever ends it, no child outlives it."""
        assert self.engines.command is not None or self.engines.gateway
        self.catch_signals()  # before any launch: a SIGTERM must never leave a child behind
        running = [asyncio.create_task(duty.run()) for duty in self.duties()]
        try:
            if self.engines.replicas and (self.node is None or self.node.head):  # a worker's waits for rank 0's
                self.children.launch_engines()
                log.info("vLLM launched %.2f s after the process started", seconds_since_process_start())
            await self.children.launch_the_rest()
            self.publish_progress()
            await self.stopping.wait()
            log.info("stopping: SIGTERM to every child, SIGKILL after %.0f s", self.supervisor.grace_s)
        finally:
            for task in [*running, self.engines.rolling]:
                if task is not None:
                    task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await self.supervisor.stop()
            await self.children.aclose()
        log.info("stopped")
        return REFUSED if self.refusal else 0

    def catch_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)


def seconds_since_process_start() -> float:
    """How long ago this process was created (interpreter start-up included), from /proc."""
    start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


class Duty(Protocol):
    """A live duty of the pod: runs until its work is done or the pod stops (cancelled)."""

    async def run(self) -> None: ...
