"""The runtime's Hub side: the pod's log republished to a Hub repo, and its settings read from one.

Entry points for the pod (runtime.start), independent of it, and safe to call during a Hub outage:
- `RemoteConfig.from_settings(settings, environ)`: `.read()` → the settings file's new version (a
  `runtime.settingsfile.SettingsFile`, which the pod judges) or None, `.start(on_file)` → a watcher thread
  handing over each new version, `.stop()`.
- `LogPublisher.from_settings(settings, environ, sources, is_healthy, redactor)`: `.start()`,
  `.publish_now(message=None)` after a crash, a restart or a fatal check (never blocks), `.close(timeout_s)`.
- `Redactor`: one shared instance, which also learns the Hub file's secrets.

`python -m runtime logs POD_ID [--follow]` (`runtime.hub.logtail`) reads what the publisher wrote.
"""

from runtime.hub.logpublish import LogPublisher
from runtime.hub.remoteconfig import RemoteConfig
from runtime.redact import Redactor

__all__ = ["LogPublisher", "Redactor", "RemoteConfig"]
