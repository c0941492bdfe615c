"""The runtime's Hub side: the pod's log republished to a Hub repo, and its settings read from one.

Entry points for the supervisor, independent of it, and safe to call during a Hub outage:
- `RemoteConfig(environ, on_change)`: `.settings` (environment only; a bad one raises SettingsError),
  `.load()` → the start settings (defaults < Hub file < environment), `.start()` → a watcher thread
  calling `on_change(settings, scopes)` after each valid change, `.notify` for refusals, `.stop()`.
- `LogPublisher.from_settings(settings, environ, sources, is_healthy, redactor)`: `.start()`,
  `.publish_now(message=None)` after a crash, a restart or a fatal check (never blocks), `.close(timeout_s)`.
- `Redactor`: one shared instance (`RemoteConfig.redactor`) learns the Hub file's secrets too.

The order that also publishes a refusal of the Hub file at start:

    config = RemoteConfig(os.environ, on_change=apply_new_settings)
    publisher = LogPublisher.from_settings(config.settings, os.environ, {"boot": ..., "engine": ..., "bridge": ...},
                                           is_healthy=lambda: state.healthy, redactor=config.redactor)
    config.notify = publisher.publish_now
    publisher.start()
    settings = config.load()
    config.start()

`python -m runtime logs POD_ID [--follow]` (`runtime.hub.logtail`) reads what the publisher wrote.
"""

from runtime.hub.logpublish import LogPublisher
from runtime.hub.remoteconfig import RemoteConfig
from runtime.redact import Redactor

__all__ = ["LogPublisher", "Redactor", "RemoteConfig"]
