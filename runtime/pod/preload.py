"""VL_PRELOAD: once the first model serves, other models' weights downloaded into the cache on the volume in the
background, so that a later swap (VL_SWAP) starts without a download (field notes, v70: a swap that waits on
135 GB of weights waits ~25 min).

`python -m runtime preload` downloads the repos one after another through runtime.engine.weights, into the same
cache and with the same choice of files and the same completeness record as the engine's own start: that start then
finds them complete and asks the Hub nothing. It runs at the lowest priority, and takes a bounded share of the
network: one file at a time, without Xet's high-performance mode. A repo that fails is said in one line and the next
is still downloaded. Its progress goes to a state file (runtime.state.preload) that the console shows.

The pod runs it as a one-shot child (the duty `Preloading`, through `preload_in_background`), not under the
supervisor, which relaunches whatever exits: its lines go to the pod's log (a failure to the Hub log too), and it is
killed with its process group when the pod stops.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging
import os
import platform
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.engine.command import RUNTIME_ROOT
from runtime.engine.volume import cache_env, cache_root, hub_cache, make_cache_dirs
from runtime.engine.weights import Share, WeightsError, download, is_complete
from runtime.logsafe import strip_controls
from runtime.pod.supervisor import exit_description, kill_group
from runtime.redact import Redactor
from runtime.settings import SettingsError, load_settings
from runtime.state.preload import RepoPreload, forget_preload_state, write_preload_state

if TYPE_CHECKING:  # the child (`runtime preload`) never loads the engines' owner
    from runtime.pod.engines import Engines

log = logging.getLogger(__name__)

# A bounded share, not a cap in bytes/s (huggingface_hub and hf_xet offer none): one file at a time, and Xet at its
# default concurrency rather than its high-performance mode; a progress line every minute, not every 5 s.
BACKGROUND = Share(files_at_once=1, xet_high_performance=False, report_every_s=60.0)
LOWEST_NICE = 19
# ioprio_set(2) has no libc wrapper: its number per architecture (the generic table's for arm64).
IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
IOPRIO_WHO_PROCESS, IOPRIO_CLASS_IDLE, IOPRIO_CLASS_SHIFT = 1, 3, 13
PID_FILE = "preload.pid"  # in VL_STATE_DIR while the child runs, as the supervisor's children have theirs
SOME_FAILED = 1  # the preload's exit status when a repo could not be downloaded (each said in its own line)
LINE_LIMIT = 2**20  # the child's lines are short; a long one must not stop the relay


# --- the child: `python -m runtime preload` ---


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repos", nargs="*", metavar="OWNER/NAME", help="model repos (default: VL_PRELOAD)")
    parser.add_argument("--cache-dir", help="the cache root (default: VL_CACHE_DIR, else the volume's, as a start)")
    parser.add_argument("--state-dir", help="where its progress file goes (default: VL_STATE_DIR)")
    parser.epilog = (
        "Reads HF_TOKEN and HF_ENDPOINT like `python -m runtime weights`; runs at nice 19 in the idle I/O class, "
        "one file at a time. A pod runs it by itself once its first model serves."
    )


def run(args: argparse.Namespace) -> int:
    priority = lowest_priority()  # first: the threads the download starts inherit it (Linux keeps it per thread)
    redact = Redactor.from_environ(os.environ)
    handler = logging.StreamHandler(sys.stderr)
    # The level first: the pod tells the Hub log about an ERROR line (runtime.pod.preload.relay).
    handler.setFormatter(RedactingFormatter("%(levelname)s %(message)s", redact))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.getLogger("runtime").setLevel(logging.INFO)
    try:
        settings = load_settings(os.environ)
    except SettingsError as error:
        log.error("%s", error)
        return 2
    repos = tuple(args.repos) or settings.preload
    root = Path(args.cache_dir) if args.cache_dir else cache_root(settings)
    state_dir = Path(args.state_dir or settings.state_dir)
    if not repos:
        log.info("nothing to preload (VL_PRELOAD is empty)")
        return 0
    make_cache_dirs(root)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.environ.update(cache_env(root))  # Xet's chunk cache on the volume too: a stopped transfer resumes from it
    log.info(
        "preloading %d repo%s into %s: one file at a time, %s",
        len(repos),
        "" if len(repos) == 1 else "s",
        root,
        priority,
    )
    failed = preload(repos, hub_cache(root), state_dir, redact)
    return SOME_FAILED if failed else 0


def lowest_priority() -> str:
    """This thread (and those it starts) at nice 19 and in the idle I/O class, which gets the disk only when no one
    else wants it (honoured by the BFQ scheduler; `none` and mq-deadline, common on NVMe, ignore it: nice then
    is all). Returns what it got, for the log."""
    os.setpriority(os.PRIO_PROCESS, 0, LOWEST_NICE)
    number = IOPRIO_SET.get(platform.machine())
    if number is None:
        return f"nice {LOWEST_NICE} (no idle I/O class on {platform.machine()})"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, IOPRIO_WHO_PROCESS, 0, IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT) != 0:
        return f"nice {LOWEST_NICE} (the idle I/O class was refused: {os.strerror(ctypes.get_errno())})"
    return f"nice {LOWEST_NICE}, idle I/O class"


class RedactingFormatter(logging.Formatter):
    """Every line with the pod's secrets masked (HF_TOKEN first): an error may quote a URL or a header."""

    def __init__(self, fmt: str, redact: Callable[[str], str]) -> None:
        super().__init__(fmt)
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


def preload(
    repos: Sequence[str], cache: Path, state_dir: Path, redact: Callable[[str], str] = lambda text: text
) -> list[str]:
    """Download each repo in turn into the hub cache `cache` unless complete there, its state in `state_dir`'s file
    as it goes; a failure is logged in one line (ERROR) and the next repo downloaded. Returns the repos that failed."""
    entries = [RepoPreload(repo) for repo in repos]
    lock = threading.Lock()  # the progress thread writes too

    def save() -> None:
        with lock:
            write_preload_state(state_dir, entries)

    save()
    for entry in entries:
        if is_complete(cache, entry.repo):
            entry.state = "done"
            save()
            log.info("preload of %s: complete in the cache already", entry.repo)
            continue
        entry.state = "downloading"
        save()

        def progress(done: int, total: int, entry: RepoPreload = entry) -> None:
            entry.done, entry.total = done, total
            save()

        try:
            listing = download(entry.repo, cache, BACKGROUND, progress, setting="VL_PRELOAD")
        except (WeightsError, OSError) as error:  # OSError: a full disk, a lock; each repo on its own
            entry.state, entry.done, entry.reason = "failed", None, redact(" ".join(str(error).split()))
            save()
            log.error("preload of %s failed: %s; the other repos are still downloaded", entry.repo, entry.reason)
            continue
        entry.state, entry.done, entry.total = "done", None, listing.size
        save()
    failed = [entry.repo for entry in entries if entry.state == "failed"]
    log.info(
        "preload finished: %d of %d repos complete in the cache%s",
        len(entries) - len(failed),
        len(entries),
        f" ({', '.join(failed)} failed)" if failed else "",
    )
    return failed


# --- the pod's side: the child, launched once, relayed, stopped with the pod ---


class Preloading:
    """The duty: once the first engine serves, the other VL_PRELOAD repos' weights downloaded by a one-shot child at
    the lowest priority (the repos the engine serves are in the cache already); meanwhile the console shows them
    waiting. Cancelled, it kills the child. `say` publishes a failed repo's line."""

    def __init__(self, engines: Engines, environ: Mapping[str, str], say: Callable[[str], None]) -> None:
        self.engines, self.environ, self.say = engines, environ, say

    async def run(self) -> None:
        state_dir = self.engines.state_dir
        forget_preload_state(state_dir)  # a previous start's
        command = self.engines.command
        if command is None:  # a gateway keeps no weights
            return
        repos = [repo for repo in self.engines.settings.preload if repo not in command.hub_repos]
        if not repos:
            return
        write_preload_state(state_dir, map(RepoPreload, repos))
        await self.engines.until_serving()
        await preload_in_background(repos, command.cache, state_dir, self.environ, self.say)


async def preload_in_background(
    repos: Sequence[str], root: Path, state_dir: Path, environ: Mapping[str, str], tell: Callable[[str], None]
) -> None:
    """`python -m runtime preload` on `repos` into the cache root `root`, until it ends: its lines in this process's
    log, a failed repo's also to `tell` (the Hub log). Cancelled (the pod stops), it kills the child's process group
    at once: a stopped download is taken up again by the next (its finished files kept)."""
    argv = [sys.executable, "-m", "runtime", "preload", *repos, "--cache-dir", str(root), "--state-dir", str(state_dir)]
    env = {**environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(RUNTIME_ROOT), environ.get("PYTHONPATH"))))}
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group, killed whole
        limit=LINE_LIMIT,
    )
    (state_dir / PID_FILE).write_text(f"{process.pid}\n")  # kill by pid, never by pattern
    log.info("preload started (pid %d): %s", process.pid, ", ".join(repos))
    try:
        assert process.stdout is not None
        async for output in process.stdout:
            relay(output.decode(errors="replace"), tell)
        code = await process.wait()
    finally:  # cancelled (the pod stops): at once, no cleanup to wait for; ended: what it left in its group
        kill_group(process.pid, signal.SIGKILL)
        await process.wait()  # reaped
        (state_dir / PID_FILE).unlink(missing_ok=True)
    if code not in (0, SOME_FAILED):
        line = f"preload {exit_description(code)}; the repos it had not finished are downloaded by the swap itself"
        log.warning("%s", line)
        tell(line)


def relay(line: str, tell: Callable[[str], None]) -> None:
    """One line of the child's (`LEVEL message`) into this process's log at its level; an ERROR one, a repo that
    failed, also to `tell`."""
    name, _, message = strip_controls(line).rstrip("\n").partition(" ")
    level = logging.getLevelNamesMapping().get(name)
    if level is None:  # not one of its log lines (a library's print): kept whole
        level, message = logging.INFO, f"{name} {message}".strip()
    log.log(level, "%s", message)
    if level >= logging.ERROR:
        tell(message)
