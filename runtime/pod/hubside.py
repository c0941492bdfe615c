"""The pod's Hub side: its log there and its settings file there, made from the environment's settings (the pod
scope, which no Hub file can change); how a Hub file is judged over the settings in force, at start and live.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.logfiles import BRIDGE, ENGINE, log_file
from runtime.settings import Settings
from runtime.settingsfile import FileRefused, SettingsFile, settings_with_file

if TYPE_CHECKING:
    from runtime.hub import LogPublisher, Redactor, RemoteConfig

log = logging.getLogger(__name__)

KEEPS_SERVING = "the current configuration keeps serving"
LAST_WORDS_S = 20.0  # how long a refused start, or a pod stopping itself, waits for its line to reach the Hub log


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

    def say(self, line: str) -> None:
        """A death, a restart, a refusal: to the Hub log at once (when the publisher runs)."""
        if self.log is not None:
            self.log.publish_now(line)

    def say_and_wait(self, line: str, timeout_s: float) -> None:
        """A last word (the pod stops itself): published before this returns, or once `timeout_s` has passed."""
        if self.log is not None:
            self.log.publish_and_wait(line, timeout_s)

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
    hub.say(line)
