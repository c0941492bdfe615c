"""The pod's children (sshd, vLLM, the bridge): started, health-checked, restarted, stopped.

One asyncio loop watches every child at once, so no child ever waits on another (the seeds lost
hours to a shell `wait` that waited on the wrong process). Each child runs in its own process group
and is stopped through it: TERM, then KILL after a grace period; never a `pkill -f` pattern (one
matched the agent running the script and killed it). Children are given as argv: the supervisor
imports none of them. Their output comes through a pipe into `<name>.log` (runtime.logfiles' `OutputPump`),
rotated to `<name>.log.1` before it passes a cap: a child's log never fills the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import shlex
import signal
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runtime.logfiles import ChildLog, OutputPump, log_file
from runtime.state.enginehealth import write_engine_stopped

log = logging.getLogger(__name__)

STABLE_AFTER_S = 60.0  # a child without a health check that lived this long is no longer "dying in a row"
LOG_CAP_BYTES = 64 * 2**20  # per child log file, one rotated file kept: ~200,000 trace lines, bounded on a small disk
# After a child's exit, how long its output may take to drain into its log before the death is reported;
# only a process that left the child's group (and so survived its kill) can hold the pipe open that long.
OUTPUT_DRAIN_S = 5.0


@dataclass(frozen=True)
class Health:
    """How to tell that a running child works, and when a failing one counts as hung."""

    probe: Callable[[], Awaitable[bool]]
    interval_s: float
    timeout_s: float
    failures_before_restart: int  # in a row, counted only once the child has been healthy since its start
    starting_interval_s: float = 1.0  # until the first success: notice readiness quickly


@dataclass(frozen=True)
class StartLimit:
    """A child that keeps dying before it ever turns healthy is left stopped after `tries` launches in a row, or at
    the first when `explain` says no try can help: a restart loop only bills; one that served, only when `explain` says
    so (a sick host after a crash). `explain` reads its log: (the likely cause in one line, whether retrying is
    hopeless); it may probe the GPUs, so it runs in a thread."""

    tries: int
    explain: Callable[[Path], tuple[str, bool]]


@dataclass(frozen=True)
class ChildSpec:
    """What to run: a name (its log is `<name>.log`), argv, environment, optional health check and start limit."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    health: Health | None = None
    start_limit: StartLimit | None = None


@dataclass(frozen=True)
class Backoff:
    """Delay before relaunching a child that died `deaths` times in a row: doubling, capped."""

    first_s: float = 1.0
    most_s: float = 60.0

    def delay(self, deaths: int) -> float:
        return min(self.first_s * 2.0 ** (deaths - 1), self.most_s)


class Ask(enum.Enum):
    RESTART = "restart"  # a new configuration: relaunch at once
    HUNG = "hung"  # failed health checks: relaunch at once, its old log kept aside
    STOP = "stop"


@dataclass
class Request:
    ask: Ask
    reason: str


@dataclass
class Child:
    """A child's running state: its process, health, deaths in a row, and what it is asked to do."""

    spec: ChildSpec
    process: asyncio.subprocess.Process | None = None
    launched_at: float = 0.0
    launches: int = 0
    healthy: bool = False
    healthy_since_launch: bool = False
    deaths: int = 0
    request: Request | None = None
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    output: OutputPump | None = None  # its running process's output, on its way to the log
    given_up: str | None = None  # why it is left stopped (its start limit), until it is launched again

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def ask(self, request: Request) -> None:
        if self.request is None or self.request.ask is not Ask.STOP:  # a stop is never overridden
            self.request = request
        self.wakeup.set()

    def take_request(self) -> Request | None:
        request, self.request = self.request, None
        self.wakeup.clear()
        return request

    async def next_request(self, timeout_s: float | None = None) -> Request | None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wakeup.wait(), timeout_s)
        return self.take_request()


class Supervisor:
    """Keeps children alive: each has a keeper task (launch, wait, relaunch) and a health task."""

    def __init__(
        self,
        state_dir: Path,
        on_incident: Callable[[str], None] = lambda message: None,
        grace_s: float = 5.0,
        backoff: Backoff = Backoff(),
        log_cap_bytes: int = LOG_CAP_BYTES,
        drain_s: float = OUTPUT_DRAIN_S,
    ) -> None:
        self.state_dir = state_dir
        self.on_incident = on_incident  # a crash or a restart: the Hub log publishes now
        self.grace_s = grace_s  # Docker's default stop timeout is 10 s: TERM, wait this, then KILL
        self.backoff = backoff
        self.log_cap_bytes = log_cap_bytes
        self.drain_s = drain_s
        self.children: dict[str, Child] = {}

    # --- what the caller sees ---

    def start(self, spec: ChildSpec) -> None:
        """Launch a new child and keep it alive until `stop`."""
        if spec.name in self.children:
            raise ValueError(f"{spec.name} is already supervised")
        child = self.children[spec.name] = Child(spec)
        child.tasks.append(asyncio.create_task(self._keep(child), name=f"keep {spec.name}"))
        if spec.health is not None:
            child.tasks.append(asyncio.create_task(self._watch_health(child), name=f"health {spec.name}"))

    def restart(self, name: str, reason: str, spec: ChildSpec | None = None) -> None:
        """Relaunch a child now (with a new spec if given), without back-off."""
        child = self.children[name]
        if spec is not None:
            child.spec = spec
        child.ask(Request(Ask.RESTART, reason))

    async def stop(self, name: str | None = None) -> None:
        """Stop one child (and forget it), or all at once: TERM to each group, KILL after the grace period."""
        names = [name] if name is not None else list(self.children)
        children = [self.children.pop(n) for n in names if n in self.children]
        for child in children:
            child.ask(Request(Ask.STOP, "stopping"))
        await asyncio.gather(*(child.tasks[0] for child in children))
        for child in children:
            for task in child.tasks[1:]:
                task.cancel()

    def pid(self, name: str) -> int | None:
        child = self.children.get(name)
        process = child.process if child is not None and child.running else None
        return process.pid if process is not None else None

    def is_healthy(self, name: str) -> bool:
        child = self.children.get(name)
        return child is not None and child.healthy and child.running

    def given_up(self, name: str) -> str | None:
        """Why child `name` is left stopped (its start limit), or None while it is kept alive."""
        child = self.children.get(name)
        return child.given_up if child is not None else None

    def is_healthy_after(self, name: str, launch: int) -> bool:
        """Whether child `name` was launched again after its launch number `launch` and is healthy now."""
        child = self.children.get(name)
        return child is not None and child.launches > launch and self.is_healthy(name)

    def healthy(self) -> bool:
        """Every health-checked child answers (false while any is starting, hung or dead)."""
        checked = [child for child in self.children.values() if child.spec.health is not None]
        return bool(checked) and all(child.healthy and child.running for child in checked)

    # --- the keeper: launch, wait for an exit or a request, relaunch ---

    async def _keep(self, child: Child) -> None:
        keep_old_log = False
        while True:
            request = None
            if await self._launch(child, keep_old_log):
                request = await self._until_exit_or_request(child)
            if request is None:  # it died, or could not be launched: back off, unless asked otherwise
                explained = await asyncio.to_thread(self._explain, child)  # it may probe the GPUs: off the loop
                request = await child.next_request(self._after_death(child, explained))
            keep_old_log = False
            if request is None:
                continue
            await self._terminate(child)
            if request.ask is Ask.STOP:
                return
            level = logging.WARNING if request.ask is Ask.HUNG else logging.INFO
            self._report(level, f"restarting {child.spec.name}: {request.reason}")
            child.deaths, keep_old_log = 0, request.ask is Ask.HUNG

    async def _launch(self, child: Child, keep_old_log: bool) -> bool:
        spec = child.spec
        log_path = log_file(self.state_dir, spec.name)
        if keep_old_log and log_path.exists():
            log_path.rename(self.state_dir / f"{spec.name}.hung.{time.strftime('%Y%m%dT%H%M%S')}.log")
        child.healthy = child.healthy_since_launch = False
        if child.given_up is not None:
            child.given_up = None
            write_engine_stopped(self.state_dir, spec.name, None)
        child.launches += 1
        child.launched_at = time.monotonic()
        output = ChildLog(log_path, self.log_cap_bytes)
        output.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(spec.argv)}\n".encode())
        reading, writing = os.pipe()
        try:
            child.process = await asyncio.create_subprocess_exec(
                *spec.argv,
                env=spec.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=writing,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # its own process group
            )
        except OSError as error:
            child.process = None
            os.close(reading)
            output.close()
            log.error("%s could not be launched: %s", spec.name, error)
            return False
        finally:
            os.close(writing)  # the child's copy is the only writer: its exit (and its group's) ends the pipe
        _, child.output = await asyncio.get_running_loop().connect_read_pipe(
            lambda: OutputPump(output), os.fdopen(reading, "rb", buffering=0)
        )
        (self.state_dir / f"{spec.name}.pid").write_text(f"{child.process.pid}\n")  # kill by pid, never by pattern
        log.info("%s started (pid %d)", spec.name, child.process.pid)
        return True

    async def _until_exit_or_request(self, child: Child) -> Request | None:
        assert child.process is not None
        exited = asyncio.ensure_future(child.process.wait())
        asked = asyncio.ensure_future(child.wakeup.wait())
        await asyncio.wait({exited, asked}, return_when=asyncio.FIRST_COMPLETED)
        asked.cancel()
        if exited.done():
            kill_group(child.process.pid, signal.SIGKILL)  # what it left behind in its group (vLLM's engine core)
            await self._drain(child)
            self._forget_pid(child)
            return None
        exited.cancel()
        return child.take_request()

    def _after_death(self, child: Child, explained: tuple[str, bool] | None = None) -> float | None:
        """Count the death, say so (log and Hub), and return how long to wait before relaunching; None: it is left
        stopped (its start limit), until a restart or a stop is asked."""
        stable = child.healthy_since_launch or (
            child.spec.health is None and time.monotonic() - child.launched_at >= STABLE_AFTER_S
        )
        child.deaths = 1 if stable else child.deaths + 1
        child.healthy = False
        how = exit_description(child.process.returncode if child.process else None)
        hopeless = explained is not None and explained[1]  # a sick host ends even a child that served
        if (not stable or hopeless) and (why := self._hopeless(child, explained)) is not None:
            child.given_up = f"{how}; {why}"
            self._report(logging.ERROR, f"{child.spec.name} {child.given_up}")
            write_engine_stopped(self.state_dir, child.spec.name, child.given_up)  # /health: "stopped", and why
            return None
        delay = self.backoff.delay(child.deaths)
        in_a_row = f" ({child.deaths} times in a row, backing off)" if child.deaths > 1 else ""
        self._report(logging.WARNING, f"{child.spec.name} {how}{in_a_row}; restarting in {delay:.0f} s")
        return delay

    def _explain(self, child: Child) -> tuple[str, bool] | None:
        """Its start limit's reading of its log (the cause, whether no retry can help), or None without a limit."""
        limit = child.spec.start_limit
        return None if limit is None else limit.explain(log_file(self.state_dir, child.spec.name))

    def _hopeless(self, child: Child, explained: tuple[str, bool] | None) -> str | None:
        """Why the child is not relaunched (its start limit reached, or a failure no retry can help), or None."""
        limit = child.spec.start_limit
        if limit is None or explained is None:
            return None
        cause, hopeless = explained
        if not hopeless and child.deaths < limit.tries:
            return None
        starts = f"{child.deaths} failed start{'s' if child.deaths > 1 else ''} in a row"
        starts = "a crash" if child.healthy_since_launch else starts
        return f"not restarted after {starts}: {cause} (a Hub file that changes it, or a new pod, starts it again)"

    async def _terminate(self, child: Child) -> None:
        process = child.process
        if process is None:
            return
        child.healthy = child.healthy_since_launch = False  # its failing checks from now on prove nothing
        kill_group(process.pid, signal.SIGTERM)
        # A stopped process handles its TERM only once continued (as systemd does).
        kill_group(process.pid, signal.SIGCONT)
        try:
            await asyncio.wait_for(process.wait(), self.grace_s)
        except TimeoutError:
            log.warning("%s ignored SIGTERM for %.0f s: killing it", child.spec.name, self.grace_s)
            kill_group(process.pid, signal.SIGKILL)
            await process.wait()
        kill_group(process.pid, signal.SIGKILL)
        await self._drain(child)
        self._forget_pid(child)

    async def _drain(self, child: Child) -> None:
        """Wait until the child's last output is in its log (a crash's traceback before its report), but
        at most `drain_s`: a process that left the child's group may hold the pipe open for ever."""
        pump, child.output = child.output, None
        if pump is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(pump.finished), self.drain_s)
        except TimeoutError:
            log.warning(
                "%s: a process outside its group still holds its output open; no longer logged", child.spec.name
            )
            pump.close()

    def _forget_pid(self, child: Child) -> None:
        (self.state_dir / f"{child.spec.name}.pid").unlink(missing_ok=True)

    # --- health: a probe every interval; failures in a row after success mean hung ---

    async def _watch_health(self, child: Child) -> None:
        """Probe with the current spec's check: a restart with a new spec (another port, another
        model name) brings its own probe."""
        failures, launch = 0, 0
        while (health := child.spec.health) is not None:
            await asyncio.sleep(health.interval_s if child.healthy_since_launch else health.starting_interval_s)
            if not child.running:
                continue
            if launch != child.launches:
                failures, launch = 0, child.launches
            works, why_not = await probe_within(health)
            if launch != child.launches or not child.running:
                continue  # the answer is about a process that is gone
            if works:
                if not child.healthy:
                    log.info(
                        "%s is healthy (%.0f s after its launch)", child.spec.name, time.monotonic() - child.launched_at
                    )
                failures, child.healthy, child.healthy_since_launch = 0, True, True
                continue
            if child.healthy:
                log.warning("%s failed its health check: %s", child.spec.name, why_not)
            child.healthy = False
            if child.healthy_since_launch:
                failures += 1
                if failures >= health.failures_before_restart:
                    child.ask(Request(Ask.HUNG, f"{failures} failed health checks in a row"))
                    await relaunched(child, launch)

    def _report(self, level: int, message: str) -> None:
        """A death or a restart: in the boot log, and published to the Hub at once."""
        log.log(level, message)
        self.on_incident(message)


async def probe_within(health: Health) -> tuple[bool, str]:
    """One probe: whether the child works and, when not, why (an error, the timeout, or a plain no)."""
    try:
        works = await asyncio.wait_for(health.probe(), health.timeout_s)
    except TimeoutError:
        return False, f"no answer within {health.timeout_s:g} s"
    except Exception as error:
        return False, str(error) or type(error).__name__
    return works, "" if works else "it answered no"


async def until(condition: Callable[[], bool], every_s: float = 0.1) -> None:
    while not condition():
        await asyncio.sleep(every_s)


async def relaunched(child: Child, launch: int) -> None:
    """Until the keeper launched `child` again, after its launch number `launch`."""
    await until(lambda: child.launches != launch)


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a child's whole process group (the child is its leader: `start_new_session`)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def exit_description(returncode: int | None) -> str:
    if returncode is None:
        return "could not be launched"
    if returncode < 0:
        return f"was killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"
