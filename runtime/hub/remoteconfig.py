"""Remote configuration, the source: each new version of the Hub file `VL_CONFIG_FILE` in `VL_CONFIG_REPO`.

The file is checked by one HEAD request per poll (its ETag): nothing is downloaded while it is unchanged,
nor when it is larger than a settings file can be. Each new version is handed over as a `SettingsFile`
(its text, and whether the repo is private); judging and applying it is the pod's (runtime.pod.hubside and
runtime.pod.changes, with runtime.settingsfile). The watcher is its own thread, whatever the engine is doing: the seeds' watcher
only ran once vLLM was healthy, so a pod stuck at start could not be fixed from the Hub.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from huggingface_hub.errors import RemoteEntryNotFoundError

from runtime.hub.repo import FileVersion, HubRepo
from runtime.logsafe import one_line
from runtime.settings import Settings
from runtime.settingsfile import MAX_FILE_BYTES, SettingsFile

log = logging.getLogger("runtime.hub.config")

OnFile = Callable[[SettingsFile], None]
_UNSEEN = FileVersion("unseen", "unseen")
_ABSENT = FileVersion("absent", "absent")


class RemoteConfig:
    """The settings file in a Hub repo: `read()` once at start, then `start(on_file)` the watcher thread,
    which calls `on_file` with each new version (a deleted file: empty text). A Hub outage is logged once
    and retried at the next poll; it never stops the watcher."""

    def __init__(self, repo: HubRepo, path: str, poll_s: float) -> None:
        self.repo, self.path, self.poll_s = repo, path, poll_s
        self._version = _UNSEEN
        self._hub_down = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings, environ: Mapping[str, str]) -> RemoteConfig:
        """The pod's source: `VL_CONFIG_REPO`, `VL_CONFIG_FILE`, `VL_CONFIG_POLL_S`, `HF_ENDPOINT`, `HF_TOKEN`."""
        assert settings.config_repo is not None
        return cls(HubRepo.from_environ(settings.config_repo, environ), settings.config_file, settings.config_poll_s)

    @property
    def where(self) -> str:
        return f"{self.repo}/{self.path}"

    def start(self, on_file: OnFile) -> None:
        if self._thread is not None:
            return
        log.info("watching %s every %g s", self.where, self.poll_s)
        self._thread = threading.Thread(target=self._run, args=(on_file,), name="hub-config", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self, on_file: OnFile) -> None:
        while not self._stop.wait(self.poll_s):
            file = self.read()
            if file is None:
                continue
            try:
                on_file(file)
            except Exception:  # the receiver's failure must not stop the watcher
                log.exception("handing over %s failed", self.where)

    def read(self) -> SettingsFile | None:
        """One poll: the file's new version, or None when it did not change or the Hub cannot be read
        (outage, timeout, 5xx, missing repo: the pod keeps what it has; the next poll tries again)."""
        try:
            file = self._fetch()
        except Exception as error:
            if not self._hub_down:
                log.warning("cannot read %s (%s); keeping the current settings", self.where, one_line(error))
            self._hub_down = True
            return None
        if self._hub_down:
            log.info("%s is reachable again", self.where)
        self._hub_down = False
        return file

    def _fetch(self) -> SettingsFile | None:
        try:
            version = self.repo.version(self.path)
        except RemoteEntryNotFoundError:
            if self._version == _ABSENT:
                return None
            self._version = _ABSENT
            return SettingsFile("", self.where, private=True)  # no file: nothing secret in it
        if version.etag == self._version.etag:  # the repo may have moved on (other files): this file did not
            return None
        private = self.repo.is_private()  # asked again at each version: a repo can be made public
        too_large = version.size is not None and version.size > MAX_FILE_BYTES
        text = "" if too_large else self.repo.read_text(self.path, version)
        self._version = version  # only once read whole: a failed read is tried again at the next poll
        return SettingsFile(text, self.where, private, version.size if too_large else None)
