"""Remote configuration: a `VL_NAME=value` file in a Hub repo, read at start, then polled and applied live.

Precedence is built-in defaults < this file < the pod's environment. The file is checked by one HEAD
request per poll (its ETag): nothing is downloaded while it is unchanged. A valid change is handed to the
caller with the scopes it touches (engine, bridge); an invalid one is refused with its reason and the
current configuration keeps serving. The watcher is its own thread, whatever the engine is doing: the
seeds' watcher only ran once vLLM was healthy, so a pod stuck at start could not be fixed from the Hub.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping

from huggingface_hub.errors import RemoteEntryNotFoundError

from runtime.hub.repo import FileVersion, HubRepo
from runtime.redact import Redactor
from runtime.settings import Scope, Settings, SettingsError, load_settings

log = logging.getLogger("runtime.hub.config")

Notify = Callable[[str], None]
OnChange = Callable[[Settings, frozenset[Scope]], None]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNSEEN = FileVersion("unseen", "unseen")
_ABSENT = FileVersion("absent", "absent")


class ConfigFileError(ValueError):
    """The settings file is not a list of `VL_NAME=value` lines; `str()` names the line and what is wrong."""


def parse_config_file(text: str, source: str = "pod.env") -> dict[str, str]:
    """`VL_NAME=value` lines; blank lines and `#` comments (whole-line, or after a space) are ignored.

    A value may be quoted ('…' or "…", kept verbatim); `export ` before a name is accepted, as in a shell.
    """
    values: dict[str, str] = {}
    lines_of: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, equals, raw = stripped.removeprefix("export ").partition("=")
        name = name.strip()
        if not equals or not _NAME.fullmatch(name):
            raise ConfigFileError(f"{source} line {number}: expected VL_NAME=value, got {stripped!r}")
        if name in values:
            raise ConfigFileError(f"{source} line {number}: {name} is already set on line {lines_of[name]}")
        values[name], lines_of[name] = unquote(raw.strip(), f"{source} line {number}"), number
    return values


def unquote(raw: str, where: str) -> str:
    if raw[:1] in ("'", '"'):
        if len(raw) < 2 or raw[-1] != raw[0]:
            raise ConfigFileError(f"{where}: the quote opened by {raw[0]} is not closed at the end of the line")
        return raw[1:-1]
    return re.split(r"\s#", raw, maxsplit=1)[0].rstrip()


class RemoteConfig:
    """The pod's settings, kept in step with the Hub file `VL_CONFIG_FILE` in `VL_CONFIG_REPO`.

    `load()` once at start (never fails on the Hub's account), then `start()` the watcher thread, which calls
    `on_change(settings, scopes)` after each valid change and `notify(line)` (e.g. the Hub log) on a refusal.
    Without `VL_CONFIG_REPO` it keeps the environment's settings and starts no thread.
    """

    def __init__(
        self,
        environ: Mapping[str, str],
        on_change: OnChange,
        *,
        notify: Notify | None = None,
        redactor: Redactor | None = None,
        poll_s: float | None = None,
    ) -> None:
        # A snapshot of the pod's own environment: the engine's variables (HF_HUB_OFFLINE…) never enter it,
        # so they cannot leak into the next reload as they did in the seeds (bootstrap v58).
        self.environ = dict(environ)
        self.settings = load_settings(self.environ)  # a bad environment stops start-up here (SettingsError)
        self.on_change, self.notify = on_change, notify or (lambda line: None)
        self.redactor = redactor or Redactor.from_environ(self.environ)
        self.file = self.settings.config_file
        spec = self.settings.config_repo
        self.repo = HubRepo.from_environ(spec, self.environ) if spec else None
        self.poll_s = poll_s or self.settings.config_poll_s
        self._version = _UNSEEN
        self._hub_down = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return f"{self.repo}/{self.file}"

    def load(self) -> Settings:
        """The settings to start with: defaults < the Hub file (if it can be read and is valid) < environment."""
        if self.repo is not None:
            self.check(initial=True)
        return self.settings

    def start(self) -> None:
        if self.repo is None or self._thread is not None:
            return
        log.info("watching %s every %g s", self.where, self.poll_s)
        self._thread = threading.Thread(target=self._run, name="hub-config", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def check(self, initial: bool = False) -> bool:
        """One poll: reads the file only if its version changed; True when new settings were applied."""
        try:
            version, text = self._fetch()
        except Exception as error:  # outage, timeout, 5xx, missing repo: keep serving what we have
            if not self._hub_down:
                log.warning("cannot read %s (%s); keeping the current settings", self.where, one_line(error))
            self._hub_down = True
            return False
        if self._hub_down:
            log.info("%s is reachable again", self.where)
        self._hub_down = False
        if text is None:
            return False
        self._version = version
        try:
            remote = parse_config_file(text, self.file)
            self.redactor.learn(remote)  # before any message can quote a value
            new = load_settings(self.environ, remote)
        except (ConfigFileError, SettingsError) as error:
            self._refuse(str(error))
            return False
        for name in sorted(set(remote) & set(self.environ)):
            log.info("%s from %s is overridden by the pod's environment", name, self.where)
        return self._adopt(new, initial)

    def _fetch(self) -> tuple[FileVersion, str | None]:
        """The file's version and, when it changed since the last look, its text ('' once it is deleted)."""
        assert self.repo is not None  # the watcher runs only with a config repo
        try:
            version = self.repo.version(self.file)
        except RemoteEntryNotFoundError:
            return _ABSENT, (None if self._version == _ABSENT else "")
        if version.etag == self._version.etag:  # the repo may have moved on (other files): this file did not
            return version, None
        return version, self.repo.read_text(self.file, version)

    def _adopt(self, full: Settings, initial: bool) -> bool:
        if initial:
            changed = sorted(s.value for s in full.changed_scopes(self.settings))
            self.settings = full
            log.info("settings from %s (changing %s)", self.where, ", ".join(changed) or "nothing")
            return bool(changed)
        later = full.pod_scope_changes(self.settings)
        if later:
            log.info("%s changes %s: applies at the next pod start", self.where, ", ".join(later))
        new = full.keeping_pod_scope(self.settings)
        scopes = frozenset(new.changed_scopes(self.settings))
        if not scopes:
            return False
        self.settings = new
        log.info("new settings from %s: restarting %s", self.where, " and ".join(sorted(s.value for s in scopes)))
        try:
            self.on_change(new, scopes)
        except Exception as error:  # the caller's failure must not stop the watcher
            log.exception("applying the new settings from %s failed", self.where)
            self._tell(f"applying the new settings from {self.where} failed: {one_line(error)}")
        return True

    def _refuse(self, reason: str) -> None:
        line = f"refused {self.where}: {reason}; the current configuration keeps serving"
        log.error("%s", self.redactor(line))
        self._tell(line)

    def _tell(self, line: str) -> None:
        try:
            self.notify(line)
        except Exception:  # a broken notifier must not stop the watcher either
            log.exception("could not pass on: %s", self.redactor(line))


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
