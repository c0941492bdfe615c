"""The runtime's Hub side: the pod's log republished to a Hub repo, and its settings read from one.

What the pod (runtime.pod.hubside) uses, each safe to call during a Hub outage:
- `RemoteConfig.from_settings(settings, environ)`: `.read()` → the settings file's new version (a
  `runtime.settingsfile.SettingsFile`, which the pod judges) or None, `.start(on_file)` → a watcher thread
  handing over each new version, `.stop()`.
- `LogPublisher.from_settings(settings, environ, sources, is_healthy, redactor)` (or built on a `HubRepo`
  for a refused start's one line): `.start()`, `.publish_now(message=None)` after a crash, a restart or a
  fatal check, `.publish_and_wait(message, timeout_s)` for a pod's last words before it stops itself,
  `.close(timeout_s)`.
- `Redactor` (runtime.redact, re-exported): one shared instance, which also learns the Hub file's secrets.

`runtime.hub.repo.HubRepo` is one Hub repository as all of these read and write it; `runtime.hub.logtail`
reads what the publisher wrote, for `python -m runtime logs POD_ID [--follow]` and `runtime pod`.
"""

from runtime.hub.logpublish import LogPublisher
from runtime.hub.remoteconfig import RemoteConfig
from runtime.redact import Redactor

__all__ = ["LogPublisher", "Redactor", "RemoteConfig"]
