"""The supervisor with real child processes: deaths, back-off, hung children, stopping a process tree."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from runtime.pod.diagnosis import explain
from runtime.pod.supervisor import Backoff, ChildSpec, Health, StartLimit, Supervisor
from runtime.state.enginehealth import read_engine_stopped
from tests.support.fakegpu import fake_nvidia_smi
from tests.support.net import free_port
from tests.support.polling import eventually
from tests.support.signals import alive

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # real child processes, some hung or stubborn on purpose
Make = Callable[..., Supervisor]

CRASH = "import sys; print('crashing', flush=True); sys.exit(3)"
SLEEP = "import time; print('ready', flush=True); time.sleep(600)"
IGNORE_TERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
)
WITH_GRANDCHILD = (
    "import subprocess, sys, time; "
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print('grandchild', g.pid, flush=True); time.sleep(600)"
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def supervisor_for(tmp_path: Path) -> AsyncIterator[Make]:
    """Makes supervisors over `tmp_path`; whatever a test leaves running is stopped, even when it fails."""
    made: list[Supervisor] = []

    def make(**options: object) -> Supervisor:
        made.append(Supervisor(tmp_path, **options))
        return made[-1]

    yield make
    for supervisor in made:
        await supervisor.stop()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def log_of(state: Path, name: str) -> str:
    path = state / f"{name}.log"
    return path.read_text() if path.exists() else ""


def said(state: Path, name: str, line: str) -> bool:
    """The child printed this line (the log's header, which quotes the argv, does not count)."""
    return line in log_of(state, name).splitlines()


def grandchild_of(state: Path, name: str) -> int | None:
    found = re.search(r"^grandchild (\d+)$", log_of(state, name), re.MULTILINE)
    return int(found[1]) if found else None


async def test_a_dying_child_is_relaunched_with_growing_back_off(tmp_path: Path, supervisor_for: Make) -> None:
    incidents: list[str] = []
    supervisor = supervisor_for(on_incident=incidents.append, backoff=Backoff(first_s=0.1, most_s=0.4))
    supervisor.start(ChildSpec("crasher", python(CRASH)))
    await eventually(lambda: len(incidents) >= 4)
    await supervisor.stop()
    assert incidents[:4] == [
        "crasher exited with code 3; restarting in 0 s",
        "crasher exited with code 3 (2 times in a row, backing off); restarting in 0 s",
        "crasher exited with code 3 (3 times in a row, backing off); restarting in 0 s",
        "crasher exited with code 3 (4 times in a row, backing off); restarting in 0 s",
    ]
    assert log_of(tmp_path, "crasher").splitlines().count("crashing") >= 4  # one log, appended to at each launch
    assert Backoff(1, 60).delay(1) == 1 and Backoff(1, 60).delay(4) == 8 and Backoff(1, 60).delay(9) == 60


async def test_a_killed_child_comes_back_and_its_group_is_cleaned(tmp_path: Path, supervisor_for: Make) -> None:
    incidents: list[str] = []
    supervisor = supervisor_for(on_incident=incidents.append, backoff=Backoff(first_s=0.1))
    supervisor.start(ChildSpec("engine", python(WITH_GRANDCHILD)))
    await eventually(lambda: grandchild_of(tmp_path, "engine"))
    first, grandchild = supervisor.pid("engine"), grandchild_of(tmp_path, "engine")
    assert (tmp_path / "engine.pid").read_text() == f"{first}\n"
    os.kill(first, signal.SIGKILL)
    await eventually(lambda: supervisor.pid("engine") not in (None, first))
    assert incidents == ["engine was killed by SIGKILL; restarting in 0 s"]
    await eventually(lambda: not alive(grandchild))  # the orphan went with its group


async def test_stop_ends_every_process_of_every_tree_and_kills_the_stubborn(
    tmp_path: Path, supervisor_for: Make
) -> None:
    supervisor = supervisor_for(grace_s=1.0)
    supervisor.start(ChildSpec("tree", python(WITH_GRANDCHILD)))
    supervisor.start(ChildSpec("stubborn", python(IGNORE_TERM)))
    await eventually(lambda: grandchild_of(tmp_path, "tree") and said(tmp_path, "stubborn", "ready"))
    grandchild = grandchild_of(tmp_path, "tree")
    pids = [supervisor.pid("tree"), supervisor.pid("stubborn"), grandchild]
    await supervisor.stop()
    assert not any(alive(pid) for pid in pids)
    assert supervisor.children == {} and not list(tmp_path.glob("*.pid"))


async def test_one_slow_stop_does_not_hold_up_the_care_of_another_child(tmp_path: Path, supervisor_for: Make) -> None:
    supervisor = supervisor_for(grace_s=20.0, backoff=Backoff(first_s=0.1))
    supervisor.start(ChildSpec("stubborn", python(IGNORE_TERM)))
    supervisor.start(ChildSpec("other", python(SLEEP)))
    await eventually(lambda: said(tmp_path, "stubborn", "ready") and said(tmp_path, "other", "ready"))
    stubborn, other = supervisor.pid("stubborn"), supervisor.pid("other")
    supervisor.restart("stubborn", "new configuration")  # takes the whole 20 s grace period
    os.kill(other, signal.SIGKILL)
    await eventually(lambda: supervisor.pid("other") not in (None, other))
    assert alive(stubborn), "the other child was relaunched while this one was still being stopped"
    os.kill(stubborn, signal.SIGKILL)


async def test_a_restart_with_a_new_spec_touches_only_that_child(tmp_path: Path, supervisor_for: Make) -> None:
    supervisor = supervisor_for()
    supervisor.start(ChildSpec("bridge", python(SLEEP)))
    supervisor.start(ChildSpec("engine", python(SLEEP)))
    await eventually(lambda: supervisor.pid("bridge") and supervisor.pid("engine"))
    engine, bridge = supervisor.pid("engine"), supervisor.pid("bridge")
    supervisor.restart("bridge", "VL_ALIASES changed", ChildSpec("bridge", python(SLEEP.replace("ready", "reloaded"))))
    await eventually(lambda: said(tmp_path, "bridge", "reloaded"))
    assert supervisor.pid("engine") == engine and supervisor.pid("bridge") != bridge
    assert not alive(bridge)


def http_health(port: int) -> Health:
    async def probe() -> bool:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200

    return Health(probe, interval_s=0.2, timeout_s=0.5, failures_before_restart=2, starting_interval_s=0.1)


async def test_a_hung_child_is_restarted_after_two_failed_checks_and_its_log_kept(
    tmp_path: Path, supervisor_for: Make
) -> None:
    incidents: list[str] = []
    port = free_port()
    supervisor = supervisor_for(on_incident=incidents.append)
    server = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    supervisor.start(ChildSpec("bridge", server, health=http_health(port)))
    await eventually(supervisor.healthy)
    hung = supervisor.pid("bridge")
    os.kill(hung, signal.SIGSTOP)
    await eventually(lambda: supervisor.pid("bridge") not in (None, hung))
    assert incidents == ["restarting bridge: 2 failed health checks in a row"]
    assert not alive(hung)  # a stopped process still dies of SIGKILL
    assert [p.name.split(".")[1] for p in tmp_path.glob("bridge.hung.*.log")] == ["hung"]
    await eventually(supervisor.healthy)


async def test_a_child_still_starting_is_not_restarted_for_failing_its_checks(
    tmp_path: Path, supervisor_for: Make
) -> None:
    probes: list[bool] = []

    async def never() -> bool:
        probes.append(False)
        return False

    supervisor = supervisor_for()
    health = Health(never, interval_s=0.05, timeout_s=1, failures_before_restart=2, starting_interval_s=0.05)
    supervisor.start(ChildSpec("engine", python(SLEEP), health=health))
    await eventually(lambda: len(probes) >= 10)  # loading weights can take many minutes
    assert supervisor.children["engine"].launches == 1 and not supervisor.healthy()


async def test_checks_failing_while_a_restart_stops_the_child_do_not_restart_it_again(
    tmp_path: Path, supervisor_for: Make
) -> None:
    answering = {"now": True}
    probes: list[bool] = []

    async def probe() -> bool:
        probes.append(answering["now"])
        return answering["now"]

    supervisor = supervisor_for(grace_s=1.0)
    health = Health(probe, interval_s=0.05, timeout_s=1, failures_before_restart=2, starting_interval_s=0.05)
    supervisor.start(ChildSpec("bridge", python(IGNORE_TERM), health=health))
    await eventually(lambda: supervisor.healthy() and said(tmp_path, "bridge", "ready"))
    answering["now"] = False  # a child being stopped stops answering: that is not a hang
    supervisor.restart("bridge", "its settings changed")
    await eventually(lambda: supervisor.children["bridge"].launches == 2 and probes.count(False) >= 10)
    answering["now"] = True
    await eventually(supervisor.healthy)
    assert supervisor.children["bridge"].launches == 2 and not list(tmp_path.glob("bridge.hung.*.log"))


@pytest.mark.timeout(60)  # a relaunch loop without back-off starves the event loop: a hang, not a failure
async def test_a_child_that_cannot_be_launched_backs_off_until_a_new_spec_fixes_it(
    tmp_path: Path, supervisor_for: Make
) -> None:
    incidents: list[str] = []
    supervisor = supervisor_for(on_incident=incidents.append, backoff=Backoff(first_s=0.1, most_s=0.2))
    supervisor.start(ChildSpec("engine", python(SLEEP)))
    await eventually(lambda: said(tmp_path, "engine", "ready"))
    supervisor.restart("engine", "new settings", ChildSpec("engine", [str(tmp_path / "no-such-python")]))
    await eventually(lambda: len(incidents) >= 3)
    assert incidents[:3] == [
        "restarting engine: new settings",
        "engine could not be launched; restarting in 0 s",
        "engine could not be launched (2 times in a row, backing off); restarting in 0 s",
    ]
    supervisor.restart("engine", "fixed settings", ChildSpec("engine", python(SLEEP.replace("ready", "fixed"))))
    await eventually(lambda: said(tmp_path, "engine", "fixed"))
    assert incidents.count("restarting engine: new settings") == 1


REFUSED_FLAG = "import sys; print('vllm serve: error: unrecognized arguments: --no-such-flag', flush=True); sys.exit(2)"
SICK_HOST = "import sys; print('RuntimeError: No CUDA GPUs are available', flush=True); sys.exit(1)"


async def test_a_child_that_cannot_start_is_left_stopped_with_its_likely_cause_until_a_new_spec(
    tmp_path: Path, supervisor_for: Make
) -> None:
    incidents: list[str] = []
    supervisor = supervisor_for(on_incident=incidents.append, backoff=Backoff(first_s=0.1, most_s=0.2))
    limit = StartLimit(3, explain)
    supervisor.start(ChildSpec("engine", python(REFUSED_FLAG), start_limit=limit))
    await eventually(lambda: len(incidents) >= 3)
    assert incidents == [
        "engine exited with code 2; restarting in 0 s",
        "engine exited with code 2 (2 times in a row, backing off); restarting in 0 s",
        "engine exited with code 2; not restarted after 3 failed starts in a row: vLLM refused its command line "
        "(--no-such-flag): check VL_EXTRA_ARGS (a Hub file that changes it, or a new pod, starts it again)",
    ]
    assert supervisor.children["engine"].launches == 3 and not supervisor.children["engine"].running
    assert read_engine_stopped(tmp_path) == {"engine": incidents[-1].removeprefix("engine ")}  # what /health tells
    supervisor.restart("engine", "its settings changed", ChildSpec("engine", python(SLEEP), start_limit=limit))
    await eventually(lambda: said(tmp_path, "engine", "ready"))  # a new spec: launched again
    assert read_engine_stopped(tmp_path) is None


async def test_a_sick_host_is_not_retried_at_all(tmp_path: Path, supervisor_for: Make) -> None:
    incidents: list[str] = []
    supervisor = supervisor_for(on_incident=incidents.append, backoff=Backoff(first_s=0.1))
    supervisor.start(ChildSpec("engine", python(SICK_HOST), start_limit=StartLimit(3, explain)))
    await eventually(lambda: incidents)
    assert incidents == [
        "engine exited with code 1; not restarted after 1 failed start in a row: this host is sick: recreate the pod "
        "(python -m runtime pod replace POD: a new pod lands elsewhere): a GPU the machine lists is lost to "
        "CUDA (a Hub file that changes it, or a new pod, starts it again)"
    ]
    assert supervisor.children["engine"].launches == 1


CUDA_FAULT = (
    "import sys, time; time.sleep({delay}); "
    "print('RuntimeError: CUDA error: an illegal memory access was encountered', flush=True); sys.exit(1)"
)


@pytest.fixture
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """The host the engine's start limit probes (nvidia-smi on PATH, printing recorded outputs; no CUDA probe)."""

    def make(kernel_log: str | None = None) -> None:
        smi = fake_nvidia_smi(
            tmp_path / "bin", "smi-L-570.133.20-8xh100.txt", "smi-q-570.133.20-8xh100.txt", kernel_log
        )
        monkeypatch.setenv("PATH", f"{smi}{os.pathsep}{os.environ['PATH']}")

    return make


async def test_a_cuda_fault_is_retried_once_and_the_host_called_sick_when_it_comes_again(
    tmp_path: Path, supervisor_for: Make, gpu_host: Callable[..., None]
) -> None:
    gpu_host()
    incidents: list[str] = []
    supervisor = supervisor_for(on_incident=incidents.append, backoff=Backoff(first_s=0.1))
    supervisor.start(ChildSpec("engine", python(CUDA_FAULT.format(delay=0)), start_limit=StartLimit(3, explain)))
    await eventually(lambda: len(incidents) >= 2)
    assert incidents[0] == "engine exited with code 1; restarting in 0 s"
    assert incidents[1].startswith(
        "engine exited with code 1; not restarted after 2 failed starts in a row: this host is sick: recreate the pod "
        "(python -m runtime pod replace POD: a new pod lands elsewhere): CUDA error: an illegal memory access ended "
        "two launches in a row, though the GPU probes found no fault (nvidia-smi: 8 GPUs)"
    )
    assert supervisor.children["engine"].launches == 2


async def test_an_engine_that_served_and_crashes_on_a_gpu_with_an_xid_is_not_restarted(
    tmp_path: Path, supervisor_for: Make, gpu_host: Callable[..., None]
) -> None:
    """After a crash too: the first CUDA fault, corroborated by the kernel's Xid 79 on the pod's GPU, ends it."""
    gpu_host(kernel_log="dmesg-xid79.txt")
    incidents: list[str] = []

    async def answers() -> bool:
        return True

    health = Health(answers, interval_s=0.1, timeout_s=1, failures_before_restart=2, starting_interval_s=0.1)
    supervisor = supervisor_for(on_incident=incidents.append, backoff=Backoff(first_s=0.1))
    spec = ChildSpec("engine", python(CUDA_FAULT.format(delay=1.5)), health=health, start_limit=StartLimit(3, explain))
    supervisor.start(spec)
    await eventually(lambda: incidents)
    assert incidents == [
        "engine exited with code 1; not restarted after a crash: this host is sick: recreate the pod (python -m "
        "runtime pod replace POD: a new pod lands elsewhere): CUDA error: an illegal memory access, and Xid 79 on "
        "0000:5d:00 (GPU has fallen off the bus); Xid 154 on 0000:5d:00 (GPU recovery action changed) (a Hub file "
        "that changes it, or a new pod, starts it again)"
    ]
    assert supervisor.children["engine"].launches == 1
