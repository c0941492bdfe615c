"""The runtime's Hub side: the pod's log republished to a Hub repo, and its settings read from one.

Entry points for the supervisor (each independent of it, each safe to call during a Hub outage):
- `Redactor.from_environ(environ)`: masks secrets; share one between the two objects below.
- `RemoteConfig(environ, on_change, notify=, redactor=)`: `.load()` → the start settings (defaults < Hub
  file < environment), `.start()` → watcher thread calling `on_change(settings, scopes)`, `.stop()`.
- `LogPublisher.from_settings(settings, environ, sources, is_healthy, redactor)`: `.start()`,
  `.publish_now(message=None)` after a crash, a restart or a fatal check, `.close(timeout_s)`.
`python -m runtime logs POD_ID [--follow]` (`runtime.hub.logtail`) reads what the publisher wrote.
"""

from runtime.hub.logpublish import LogPublisher
from runtime.hub.redact import Redactor
from runtime.hub.remoteconfig import RemoteConfig

__all__ = ["LogPublisher", "Redactor", "RemoteConfig"]
