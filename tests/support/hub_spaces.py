"""Spaces for the test Hub: their README metadata, stage, build log, and the builds handed to a builder.

The Hub's rules kept here: a Space's README front matter is checked as `/api/validate-yaml` checks it;
compute SDKs (gradio, streamlit, docker) need a paid plan, static Spaces are free; every commit to a Docker
Space starts a build (stage BUILDING before the commit call returns), whose log is served as server-sent
events that never close. The routes are in hub_server.py; a real builder is in space_builder.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import yaml

SDKS = ("gradio", "streamlit", "docker", "static")
COMPUTE_SDKS = {"gradio", "streamlit", "docker"}  # run on compute: creating one needs a paid plan (hub-docs, 2026)
COLORS = ("red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray")
SHORT_DESCRIPTION_MAX = 60
DNS_LABEL_MAX = 63  # a Space's host name is one label of hf.space
APP_FILES = {"docker": "Dockerfile", "static": "index.html", "gradio": "app.py", "streamlit": "app.py"}
DEFAULT_HARDWARE = "cpu-basic"
SLEEP_TIME_S = 172800  # a cpu-basic Space sleeps after 48 h without visitors
KEEPALIVE_S = 10.0  # must exceed huggingface_hub's 5 s no-follow read timeout: that timeout ends a no-follow read
KEEPALIVE = "data: \n\n"  # an empty event: huggingface_hub reads only `data: {` lines
EMPTY_METADATA = (
    "empty or missing yaml metadata in repo card (https://huggingface.co/docs/hub/model-cards#model-card-metadata)"
)
PAID_PLAN = (
    "Creating a {sdk} Space requires a paid plan: PRO for users, Team or Enterprise for organizations "
    "(static Spaces are free). See https://huggingface.co/pricing"
)
# huggingface_hub's own pattern for a card's metadata block (repocard.py)
YAML_BLOCK = re.compile(r"^(\s*---[\r\n]+)([\S\s]*?)([\r\n]+---(\r\n|\n|$))")


class MetadataError(ValueError):
    """README metadata that does not parse; `errors` are the messages `/api/validate-yaml` answers."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


def front_matter(text: str) -> dict | None:
    """The README's YAML metadata block (at its top, between `---` lines); None when it has none."""
    block = YAML_BLOCK.search(text)
    if block is None:
        return None
    try:
        data = yaml.safe_load(block.group(2))
    except yaml.YAMLError as error:
        raise MetadataError([f"Invalid YAML in README.md metadata: {' '.join(str(error).split())}"]) from None
    if data is not None and not isinstance(data, dict):
        raise MetadataError(["README.md metadata must be a YAML mapping"])
    return data or {}


def space_metadata_errors(data: dict) -> list[str]:
    """What the Hub refuses in a Space's metadata: its SDK, colours, app port and short description."""
    errors = [] if data.get("sdk") in SDKS else [f'"sdk" is required and must be one of [{", ".join(SDKS)}]']
    errors += [
        f'"{key}" must be one of [{", ".join(COLORS)}]'
        for key in ("colorFrom", "colorTo")
        if key in data and data[key] not in COLORS
    ]
    port = data.get("app_port")
    if "app_port" in data and (not isinstance(port, int) or isinstance(port, bool)):
        errors.append('"app_port" must be an integer')
    described = data.get("short_description")
    if described is not None and (not isinstance(described, str) or len(described) > SHORT_DESCRIPTION_MAX):
        errors.append(f'"short_description" must be a string of at most {SHORT_DESCRIPTION_MAX} characters')
    return errors


def check_readme(text: str, repo_type: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) for a README.md, as `/api/validate-yaml` answers for that repo type."""
    try:
        data = front_matter(text)
    except MetadataError as error:
        return error.errors, []
    if repo_type == "space":
        return space_metadata_errors(data or {}), []
    return [], ([] if data else [EMPTY_METADATA])


def initial_readme(name: str, sdk: str) -> bytes:
    """The README.md the Hub puts in a new Space's initial commit: a card whose metadata names the SDK."""
    colour = sum(name.encode()) % len(COLORS)
    meta = {
        "title": name,
        "emoji": "🚀",
        "colorFrom": COLORS[colour],
        "colorTo": COLORS[(colour + 3) % len(COLORS)],
        "sdk": sdk,
        **({"app_file": "app.py"} if sdk in ("gradio", "streamlit") else {}),
        "pinned": False,
    }
    card = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    return f"---\n{card}---\n\nCheck out the configuration reference at https://huggingface.co/docs/hub/spaces-config-reference\n".encode()


def readme_sdk(readme: bytes | None) -> str | None:
    """The SDK a Space's README.md names; None when it names none the Hub knows (or does not parse)."""
    try:
        sdk = (front_matter(readme.decode("utf-8", "replace")) or {}).get("sdk") if readme else None
    except MetadataError:
        return None
    return sdk if sdk in SDKS else None


def subdomain(space_id: str) -> str:
    """The Space's host name on hf.space, and its image's name: `<owner>-<name>`, lowercased, other characters as
    hyphens; one too long for a DNS label is cut and given a 7-hex suffix, as the Hub does (undocumented)."""
    name = re.sub(r"[^a-z0-9]+", "-", space_id.lower()).strip("-")
    if len(name) <= DNS_LABEL_MAX:
        return name
    suffix = hashlib.sha256(space_id.encode()).hexdigest()[:7]  # the Hub's hash is unknown: only its shape counts
    return f"{name[: DNS_LABEL_MAX - len(suffix) - 1].rstrip('-')}-{suffix}"


class Notifier:
    """Wakes the server's waiting log streams (asyncio) when a line or a stage changes in any thread."""

    def __init__(self) -> None:
        self.closed = False
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def watching(self) -> Iterator[asyncio.Event]:
        """An event set by the next `notify()`; register it before reading, so no change is missed."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(waiter)
        try:
            yield waiter[1]
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # the server's loop has already stopped
                loop.call_soon_threadsafe(event.set)

    def close(self) -> None:
        """The test Hub stops: every stream ends (the only way the Hub's log streams end)."""
        self.closed = True
        self.notify()


@dataclass(frozen=True)
class LogLine:
    text: str
    at: float

    def event(self) -> str:
        """The line as one server-sent event, shaped as the Hub sends it (`data` keeps the newline)."""
        stamp = datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return f"data: {json.dumps({'data': self.text, 'timestamp': stamp})}\n\n"


class BuildLog:
    """One build's lines: appended by the builder's thread, read by the server's streams and by tests."""

    def __init__(self) -> None:
        self._lines: list[LogLine] = []
        self._lock = threading.Lock()

    def append(self, text: str) -> None:
        with self._lock:
            self._lines.append(LogLine(text, time.time()))

    def since(self, start: int) -> list[LogLine]:
        with self._lock:
            return self._lines[start:]

    def text(self) -> str:
        return "".join(line.text for line in self.since(0))


async def woken(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether `event` was set within `timeout_s`."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
        return True
    except TimeoutError:
        return False


async def log_stream(current: Callable[[], BuildLog], notifier: Notifier, keepalive_s: float) -> AsyncIterator[str]:
    """A log as the Hub streams it: the lines so far, then each new one, and it never closes on its own.

    A new build (a later commit) replays from its first line; an empty event goes out after `keepalive_s`
    without a line. The stream ends only when the test Hub stops.
    """
    log, sent = None, 0
    while not notifier.closed:
        with notifier.watching() as changed:
            if current() is not log:
                log, sent = current(), 0
            fresh = log.since(sent)
            if not fresh:
                if not await woken(changed, keepalive_s):
                    yield KEEPALIVE
                continue
        sent += len(fresh)
        yield "".join(line.event() for line in fresh)


class Builder(Protocol):
    """What the test Hub hands a Docker Space's builds to (space_builder.SpaceBuilder is the real one)."""

    def submit(self, build: Build) -> None: ...


@dataclass(eq=False)
class Build:
    """One commit's build: exactly the commit's files, the Space's variables, and where its outcome goes."""

    space: SpaceState
    revision: str
    files: dict[str, bytes]
    variables: dict[str, str]
    log: BuildLog = field(default_factory=BuildLog)
    created: float = field(default_factory=time.time)  # when the commit landed: the context's file times
    done: threading.Event = field(default_factory=threading.Event)  # finished, or superseded by a newer commit

    @property
    def space_id(self) -> str:
        return self.space.space_id

    @property
    def image(self) -> str:
        """The Hub names a Space's image as its host: `registry.hf.space/<subdomain>:latest`."""
        return subdomain(self.space_id)

    def current(self) -> bool:
        """Whether this is still the Space's latest build: a newer commit supersedes it."""
        return self.space.build is self

    def say(self, line: str) -> None:
        """One line of the build log (a newline is added when missing)."""
        self.log.append(line if line.endswith("\n") else line + "\n")
        self.space.notifier.notify()

    def succeeded(self) -> None:
        self.space.finish(self, "RUNNING", None)

    def failed(self, message: str) -> None:
        """The build failed: the error is the log's last line and the runtime's `errorMessage`."""
        self.say(message)
        self.space.finish(self, "BUILD_ERROR", message.strip())


@dataclass(frozen=True)
class SpaceView:
    """A Space as a test sees it at one moment."""

    space_id: str
    sdk: str
    private: bool
    stage: str
    error: str | None
    log: str


class SpaceState:
    """A Space's runtime on the Hub: its SDK, stage, hardware, variables and current build."""

    def __init__(
        self,
        space_id: str,
        sdk: str,
        notifier: Notifier,
        variables: dict[str, str] | None = None,
        hardware: str | None = None,
    ) -> None:
        self.space_id, self.sdk, self.notifier = space_id, sdk, notifier
        self.variables = dict(variables or {})  # the Hub passes them to a Docker build as build args
        self.hardware = hardware or DEFAULT_HARDWARE
        self.stage, self.has_run = "NO_APP_FILE", False
        self.error: str | None = None
        self.build: Build | None = None
        self.log = BuildLog()
        self.run_log = BuildLog()  # the app's output: nothing runs here, so it stays empty
        self.building_read = threading.Event()  # someone read the stage of the current build while it built
        self._lock = threading.RLock()

    def committed(self, revision: str, files: dict[str, bytes], builder: Builder | None) -> None:
        """A commit landed: the README decides the SDK; a Docker Space with a Dockerfile starts building."""
        sdk = readme_sdk(files.get("README.md"))
        with self._lock:
            if sdk is None:
                return self._settle("CONFIG_ERROR", "Missing or invalid configuration in README.md")
            self.sdk = sdk
            if APP_FILES[sdk] not in files:
                return self._settle("NO_APP_FILE", None)
            if self.sdk == "static":
                return self._settle("RUNNING", None)
            build = self._start(revision, files)
        self._hand_over(build, builder)

    def _hand_over(self, build: Build, builder: Builder | None) -> None:
        if self.sdk != "docker":
            build.say(f"This test Hub builds Docker Spaces only: the {self.sdk} Space stays BUILDING")
        elif builder is None:
            build.say(f"Commit {build.revision[:7]}: no builder is attached to this test Hub, the Space stays BUILDING")
        else:
            build.say(f"Commit {build.revision[:7]}: build queued")
            builder.submit(build)

    def _start(self, revision: str, files: dict[str, bytes]) -> Build:
        """A new build supersedes the current one: BUILDING at once (RUNNING_BUILDING if it was running)."""
        if self.build is not None:
            self.build.done.set()
        self.build = Build(self, revision, dict(files), dict(self.variables))
        self.building_read.clear()
        self.log = self.build.log
        self.stage = "RUNNING_BUILDING" if self.stage == "RUNNING" else "BUILDING"
        self.error = None
        self.notifier.notify()
        return self.build

    def _settle(self, stage: str, error: str | None) -> None:
        """A stage without a build (no app file, no configuration, a static site)."""
        if self.build is not None:
            self.build.done.set()
        self.build, self.log = None, BuildLog()
        self.stage, self.error = stage, error
        self.has_run = self.has_run or stage == "RUNNING"
        self.notifier.notify()

    def finish(self, build: Build, stage: str, error: str | None) -> None:
        """The builder's outcome; a superseded build's outcome no longer matters."""
        with self._lock:
            if self.build is not build:
                return
            self.stage, self.error = stage, error
            self.has_run = self.has_run or stage == "RUNNING"
            build.done.set()
        self.notifier.notify()

    def runtime(self) -> dict:
        """`GET /api/spaces/{id}/runtime`, shaped as the Hub answers it."""
        with self._lock:
            if self.stage in ("BUILDING", "RUNNING_BUILDING"):
                self.building_read.set()
            answer = {
                "stage": self.stage,
                "hardware": {"current": self.hardware if self.has_run else None, "requested": self.hardware},
                "storage": None,
                "gcTimeout": SLEEP_TIME_S,
                "replicas": {"current": 1, "requested": 1},
                "devMode": False,
                "domains": [{"domain": f"{subdomain(self.space_id)}.hf.space", "stage": "READY"}],
                "sdk": self.sdk,
            }
            if self.error:
                answer["errorMessage"] = self.error
            return answer

    def info(self, readme: bytes | None) -> dict:
        """What `GET /api/spaces/{id}` adds to repo info: the SDK, the card's metadata, host and runtime."""
        try:
            card = front_matter(readme.decode("utf-8", "replace")) if readme else None
        except MetadataError:
            card = None
        host = subdomain(self.space_id)
        info = {"sdk": self.sdk, "subdomain": host, "host": f"https://{host}.hf.space", "runtime": self.runtime()}
        return info | ({"cardData": card} if card else {})

    def settled_stage(self, timeout_s: float) -> str:
        """Waits for the current build to end (a newer commit's build replaces it); returns the stage."""
        deadline = time.monotonic() + timeout_s
        while (build := self.build) is not None:
            if not build.done.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(
                    f"{self.space_id} is still {self.stage} after {timeout_s:g} s; "
                    f"its build log ends:\n{self.log.text()[-3000:]}"
                )
            if build is self.build:
                break
        return self.stage

    def view(self, private: bool) -> SpaceView:
        with self._lock:
            return SpaceView(self.space_id, self.sdk, private, self.stage, self.error, self.log.text())
