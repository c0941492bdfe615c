"""Children's logs under the supervisor, with real child processes: capped by rotation, complete before
a death is reported, and never waiting for ever on a process that left the child's group."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from runtime.logfiles import LINE_CUT, MAX_LINE_BYTES, tail
from runtime.pod.supervisor import Backoff, ChildSpec, Supervisor
from tests.support.polling import eventually

pytestmark = pytest.mark.anyio

CAP = 16 * 1024
LINES = 2000  # ~130 KB of output: eight times the cap
LOUD = f"import sys; [print(f'line {{n:05d}} ' + 'x' * 50) for n in range({LINES})]; sys.exit(3)"
# A grandchild in a session of its own survives its group's kill and keeps the output pipe open.
ESCAPED_GRANDCHILD = (
    "import os, subprocess, sys; "
    "g = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)']); "
    "print('escaped', g.pid, flush=True); sys.exit(4)"
)
NEVER_AGAIN = Backoff(first_s=600, most_s=600)  # one life per test: the test reads what its death left


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def printed(n: int) -> str:
    return f"line {n:05d} " + "x" * 50


async def test_a_childs_log_is_rotated_before_it_passes_its_cap(tmp_path: Path) -> None:
    """The bridge writes a line per request for as long as it runs: its log must not fill the disk.
    Each file stays under the cap, one older file is kept, and together they end with the child's
    last lines in order, all written before its death is reported."""
    complete_at_report: list[bool] = []
    log_path, older = tmp_path / "bridge.log", tmp_path / "bridge.log.1"

    def incident(message: str) -> None:
        complete_at_report.append(log_path.read_text().endswith(printed(LINES - 1) + "\n"))

    supervisor = Supervisor(tmp_path, on_incident=incident, backoff=NEVER_AGAIN, log_cap_bytes=CAP)
    supervisor.start(ChildSpec("bridge", [sys.executable, "-c", LOUD]))
    try:
        await eventually(lambda: complete_at_report, 60.0)
    finally:
        await supervisor.stop()
    assert complete_at_report == [True]
    assert log_path.stat().st_size <= CAP and older.stat().st_size <= CAP
    assert sorted(p.name for p in tmp_path.glob("bridge.log*")) == ["bridge.log", "bridge.log.1"]
    rows = (older.read_text() + log_path.read_text()).splitlines()
    assert rows == [printed(n) for n in range(LINES - len(rows), LINES)]  # cut after whole lines, none lost
    assert tail(log_path) == rows[-150:]  # the Hub log reads on through the rotation


async def test_a_line_longer_than_the_cap_is_cut_into_files_under_it(tmp_path: Path) -> None:
    said: list[str] = []
    small = MAX_LINE_BYTES // 2  # a file cap under the line cap: a line is cut across files
    supervisor = Supervisor(tmp_path, on_incident=said.append, backoff=NEVER_AGAIN, log_cap_bytes=small)
    supervisor.start(ChildSpec("engine", [sys.executable, "-c", f"print('y' * {MAX_LINE_BYTES}); print('after')"]))
    try:
        await eventually(lambda: said, 60.0)
    finally:
        await supervisor.stop()
    assert ((tmp_path / "engine.log.1").read_text() + (tmp_path / "engine.log").read_text()).endswith("y\nafter\n")
    assert all(path.stat().st_size <= small for path in tmp_path.glob("engine.log*"))


async def test_a_huge_line_is_cut_before_it_reaches_the_log(tmp_path: Path) -> None:
    """One 5 MiB line (a stranger's value in a log) would fill the Hub log's tail: it is cut at 8 KiB,
    marked, and the lines before and after it stay in the tail."""
    said: list[str] = []
    supervisor = Supervisor(tmp_path, on_incident=said.append, backoff=NEVER_AGAIN)
    huge = "import sys; print('before'); sys.stdout.write('z' * (5 * 2**20)); print(); print('after')"
    supervisor.start(ChildSpec("bridge", [sys.executable, "-c", huge]))
    try:
        await eventually(lambda: said, 60.0)
    finally:
        await supervisor.stop()
    lines = tail(tmp_path / "bridge.log")
    cut = "z" * MAX_LINE_BYTES + LINE_CUT.decode()
    assert lines[1:4] == ["before", cut, "after"]  # after the supervisor's line that names the command


async def test_a_process_that_left_the_group_does_not_hold_up_the_death_report(tmp_path: Path) -> None:
    """It keeps the child's output pipe open: the report waits `drain_s` for the output, then goes out."""
    said: list[str] = []
    supervisor = Supervisor(tmp_path, on_incident=said.append, backoff=NEVER_AGAIN, drain_s=0.2)
    supervisor.start(ChildSpec("engine", [sys.executable, "-c", ESCAPED_GRANDCHILD]))
    try:
        await eventually(lambda: said, 60.0)
    finally:
        await supervisor.stop()
        found = re.search(r"^escaped (\d+)$", (tmp_path / "engine.log").read_text(), re.MULTILINE)
        if found:
            os.kill(int(found[1]), signal.SIGKILL)
    assert found and said == ["engine exited with code 4; restarting in 600 s"]


async def test_a_full_disk_loses_the_output_but_not_the_child(tmp_path: Path) -> None:
    """Every write to the log fails (ENOSPC): the child still runs to its own end, and is cared for."""
    said: list[str] = []
    (tmp_path / "engine.log").symlink_to("/dev/full")
    supervisor = Supervisor(tmp_path, on_incident=said.append, backoff=NEVER_AGAIN)
    supervisor.start(ChildSpec("engine", [sys.executable, "-c", LOUD.replace("sys.exit(3)", "sys.exit(5)")]))
    try:
        await eventually(lambda: said, 60.0)
    finally:
        await supervisor.stop()
    assert said == ["engine exited with code 5; restarting in 600 s"]
