"""The Hub log: the tail of the pod's logs, republished to `etat/<POD_ID>.log` while the server is not healthy.

Without it a failed boot is invisible as soon as SSH is down (seeds, bootstrap v74). One background thread
does every upload, redacted, within a commit rate, with timeouts and back-off: nothing here blocks the
caller or raises into it, so a Hub outage never touches serving.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.hub.commitrate import commit_rate
from runtime.hub.repo import HubRepo, pod_id
from runtime.logfiles import tail
from runtime.logsafe import strip_controls
from runtime.ratelimit import RateLimit
from runtime.redact import Redactor
from runtime.settings import RUNPOD_SECRET_REFERENCE, Settings
from runtime.state.hublog import write_hub_log_refusal
from runtime.units import utc_now

log = logging.getLogger("runtime.hub.log")

LOG_FOLDER = "etat"  # the seeds' layout, kept so existing habits and scripts still find the logs
NOTES_KEPT = 50
NOTE_CHARS = 2000  # a note is a line: a crash, a restart, a refusal (whose quoted values are capped already)
RETRY_S = (5.0, 300.0)  # back-off after a failed upload: first wait, longest wait


def log_path(pod: str) -> str:
    """Where a pod's log lives in the log repo."""
    return f"{LOG_FOLDER}/{pod}.log"


def refusal_line(repo: HubRepo, error: Exception) -> str | None:
    """The one line for a write the Hub refused (401: a token it does not know; 403: one that may not write), or
    None for any other failure: with a read token the log never appeared and `logs --follow` waited forever."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status not in (401, 403):
        return None
    until = "; until then `python -m runtime logs` shows nothing of this pod"
    if isinstance(repo.token, str) and (reference := RUNPOD_SECRET_REFERENCE.search(repo.token)):
        return (
            f"the Hub refuses this pod's log ({repo}: HTTP {status}): the RunPod secret {reference.group(1)} "
            f"(HF_TOKEN) was never created: create it in RunPod's console (Secrets), a token with write access "
            f"to {repo}{until}"
        )
    if status == 401:
        return f"the Hub refuses this pod's log ({repo}: HTTP 401): it knows no such HF_TOKEN{until}"
    return (
        f"the Hub refuses this pod's log ({repo}: HTTP 403): HF_TOKEN may not write there (a read token only "
        f"downloads): give the pod a token with write access to {repo}{until}"
    )


@dataclass
class PublisherStats:
    """What the publisher has done so far (read by tests and status pages)."""

    cycles: int = 0
    commits: int = 0
    failures: int = 0
    last_error: str = ""


class LogPublisher:
    """Republishes the tails of `sources` (name → log file) to the pod's Hub log, from a background thread.

    Publishes every `interval_s` while `is_healthy()` is false and the text changed, once more when the pod
    turns healthy, and at once on `publish_now()` (after a crash, a restart, a fatal check). With `repo=None`
    (no `VL_LOG_REPO`) it does nothing, so callers never need to check.
    """

    def __init__(
        self,
        repo: HubRepo | None,
        pod: str,
        sources: Mapping[str, Path],
        is_healthy: Callable[[], bool],
        redactor: Redactor,
        *,
        interval_s: float = 25.0,
        rate: RateLimit | None = None,
        retry_s: tuple[float, float] = RETRY_S,
        state_dir: Path | None = None,
    ) -> None:
        self.repo, self.pod, self.path = repo, pod, log_path(pod)
        self.state_dir = state_dir  # where the Hub's refusal is told to the bridge (runtime.state.hublog)
        self.refused: str | None = None  # the Hub's refusal of our writes, said once until a write goes through
        self.sources = {name: Path(p) for name, p in sources.items()}
        self.is_healthy, self.redact = is_healthy, redactor
        self.interval_s, self.retry_s = interval_s, retry_s
        self.rate = rate or commit_rate()
        self.stats = PublisherStats()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._uploaded = threading.Condition()  # notified at each commit: publish_and_wait's signal
        self._notes: deque[str] = deque(maxlen=NOTES_KEPT)
        self._noted = self._published_noted = 0  # notes taken so far; how many of them the Hub's text holds
        self._requested = self._closing = False
        self._thread: threading.Thread | None = None
        self._published: str | None = None  # the last text that reached the Hub
        self._published_healthy: bool | None = None  # the state that text announced
        self._seen_healthy: bool | None = None
        self._since = utc_now()
        self._retry_at, self._failures = 0.0, 0

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        environ: Mapping[str, str],
        sources: Mapping[str, Path],
        is_healthy: Callable[[], bool],
        redactor: Redactor,
    ) -> LogPublisher:
        """The pod's publisher: `VL_LOG_REPO`, `VL_LOG_INTERVAL_S`, `HF_ENDPOINT`, `HF_TOKEN`, `RUNPOD_POD_ID`."""
        repo = HubRepo.from_environ(settings.log_repo, environ) if settings.log_repo else None
        return cls(
            repo,
            pod_id(environ),
            sources,
            is_healthy,
            redactor,
            interval_s=settings.log_interval_s,
            state_dir=Path(settings.state_dir),
        )

    def start(self) -> None:
        if self._thread is None:  # a previous start's refusal says nothing of this one
            self._tell_status(None)
        if self.repo is None or self._thread is not None:
            return
        log.info("publishing this pod's log to %s/%s while it is not healthy", self.repo, self.path)
        self._thread = threading.Thread(target=self._run, name="hub-log", daemon=True)
        self._thread.start()

    def publish_now(self, message: str | None = None) -> None:
        """Publishes as soon as the commit rate allows, with `message` (e.g. a crash line) added; never blocks."""
        with self._lock:
            if message:  # bounded: one note must not erase the others' share of the log
                clipped = message if len(message) <= NOTE_CHARS else f"{message[:NOTE_CHARS]}..."
                self._notes.append(f"{utc_now()} {clipped}")
                self._noted += 1
            self._requested = True
        self._wake.set()

    def publish_and_wait(self, message: str, timeout_s: float) -> bool:
        """`publish_now(message)`, then wait (at most `timeout_s`) until the Hub has a text that holds it: the
        last word before the pod stops itself. False without a running publisher, or when the Hub was late."""
        if self.repo is None or self._thread is None:
            return False
        with self._uploaded:  # an upload already under way holds an older text: wait for one that holds this
            self.publish_now(message)
            with self._lock:
                noted = self._noted
            return self._uploaded.wait_for(lambda: self._published_noted >= noted, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stops the thread after one last attempt at a pending `publish_now`; waits at most `timeout_s`."""
        with self._lock:
            self._closing = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def render(self, healthy: bool) -> str:
        """The log file's text, redacted: a header, the tail of each source, then the notes."""
        return self._render(healthy)[0]

    def _render(self, healthy: bool) -> tuple[str, int]:
        """The text, and how many notes (ever taken) it holds."""
        with self._lock:
            notes, noted = list(self._notes), self._noted
        width = max(map(len, [*self.sources, "note"]))
        state = "healthy" if healthy else "not healthy"
        rows = [f"# vllm-pod {self.pod} · {state} since {self._since}"]
        for name, path in self.sources.items():
            rows += [f"{name:<{width}} | {row}" for row in tail(path)]
        rows += [f"{'note':<{width}} | {strip_controls(note)}" for note in notes]
        return self.redact("\n".join(rows) + "\n"), noted

    def _run(self) -> None:
        while True:
            self._wake.clear()
            with self._lock:
                closing = self._closing
            wait_s = self._turn(final=closing)
            self.stats.cycles += 1
            if closing:
                return
            self._wake.wait(wait_s)

    def _turn(self, final: bool) -> float:
        """One look at the pod: publishes when due and allowed; returns how long to sleep before the next."""
        healthy = self._check_health()
        with self._lock:
            requested, self._requested = self._requested, False
        if healthy and not requested and self._published_healthy is not False:
            return self.interval_s  # serving, and the Hub already says so: nothing to do
        text, noted = self._render(healthy)
        if text == self._published:
            self._mark_published(noted)  # the Hub holds this text already, notes and all
            return self.interval_s  # nothing new to say
        blocked_s = 0.0 if final else max(self._retry_at - time.monotonic(), self.rate.wait_s())
        if blocked_s <= 0 and self._upload(text, noted):
            self._published_healthy, self._failures = healthy, 0
            return self.interval_s
        if blocked_s <= 0:
            self._failures += 1
            blocked_s = min(self.retry_s[1], self.retry_s[0] * 2 ** (self._failures - 1))
            self._retry_at = time.monotonic() + blocked_s
        with self._lock:
            self._requested |= requested  # still owed
        return min(self.interval_s, blocked_s)

    def _check_health(self) -> bool:
        try:
            healthy = bool(self.is_healthy())
        except Exception as error:  # the supervisor's callable must not kill the publisher
            log.warning("health callback failed (%s); counting the pod as not healthy", error)
            healthy = False
        if healthy != self._seen_healthy:
            self._seen_healthy, self._since = healthy, utc_now()
        return healthy

    def _upload(self, text: str, noted: int) -> bool:
        assert self.repo is not None  # the publisher runs only with a log repo
        try:
            self.repo.write_text(self.path, text, f"log of pod {self.pod}")
        except Exception as error:  # any failure (network, 4xx, 5xx, timeout) is retried later, never raised
            self.stats.failures += 1
            self.stats.last_error = self.redact(f"{type(error).__name__}: {error}".splitlines()[0])
            log.warning("could not publish the log to %s (%s); retrying later", self.repo, self.stats.last_error)
            if refused := refusal_line(self.repo, error):  # another failure (network, 5xx) says nothing of the token
                self._say_refused(refused)
            return False
        self._say_refused(None)
        self.rate.spend()
        self._published = text
        self.stats.commits += 1
        self._mark_published(noted)
        return True

    def _say_refused(self, line: str | None) -> None:
        """The Hub's refusal of our writes, once, to the boot log and the pod's status; and when it takes them again."""
        line = None if line is None else self.redact(line)
        if line == self.refused:
            return
        if line is not None:
            log.error("%s", line)
        elif self.refused is not None:
            log.info("the Hub takes this pod's log again (%s)", self.repo)
        self.refused = line
        self._tell_status(line)

    def _tell_status(self, line: str | None) -> None:
        """The refusal for the bridge's /v1/pod/status; a full disk costs the status line, never the publisher."""
        if self.state_dir is not None:
            with contextlib.suppress(OSError):
                write_hub_log_refusal(self.state_dir, line)

    def _mark_published(self, noted: int) -> None:
        with self._uploaded:
            self._published_noted = max(self._published_noted, noted)
            self._uploaded.notify_all()
