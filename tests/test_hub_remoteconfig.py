"""Remote configuration: the Hub file is parsed, validated, applied live, or refused while the old one serves."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from runtime.hub.logpublish import LogPublisher
from runtime.hub.remoteconfig import ConfigFileError, RemoteConfig, parse_config_file
from runtime.hub.repo import HubRepo
from runtime.redact import Redactor
from runtime.settings import Scope, Settings
from tests.support.hub_server import HubServer
from tests.support.polling import wait_until

CONFIG = "pod-owner/pod-config"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("VL_CTX=4096\n", {"VL_CTX": "4096"}),
        ("# a comment\n\n  VL_CTX = 4096  \n", {"VL_CTX": "4096"}),
        ('VL_ALIASES="claude-a, claude-b"', {"VL_ALIASES": "claude-a, claude-b"}),
        ("export VL_SPEC=off", {"VL_SPEC": "off"}),
        ("VL_CTX=4096  # 4k is enough here", {"VL_CTX": "4096"}),
        ("VL_EXTRA_ARGS='--served-model-name a #b'", {"VL_EXTRA_ARGS": "--served-model-name a #b"}),
        ("VL_API_KEYS=abc#def", {"VL_API_KEYS": "abc#def"}),
        ("VL_KV=", {"VL_KV": ""}),
        ("", {}),
    ],
)
def test_parse_config_file(text: str, expected: dict[str, str]) -> None:
    assert parse_config_file(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("VL_CTX 4096", "pod.env line 1: expected VL_NAME=value, got 'VL_CTX 4096'"),
        ("# ok\nVL CTX=1", "pod.env line 2: expected VL_NAME=value, got 'VL CTX=1'"),
        ("=4096", "pod.env line 1: expected VL_NAME=value, got '=4096'"),
        ("VL_CTX=1\nVL_CTX=2", "pod.env line 2: VL_CTX is already set on line 1"),
        ('VL_ALIASES="a, b', 'pod.env line 1: the quote opened by " is not closed at the end of the line'),
    ],
)
def test_parse_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(ConfigFileError) as error:
        parse_config_file(text)
    assert str(error.value) == message


class Watch:
    """A RemoteConfig wired the way the supervisor wires it, recording what it was told."""

    def __init__(self, hub: HubServer, **environ: str) -> None:
        self.hub = hub
        self.changes: queue.Queue[tuple[Settings, frozenset[Scope]]] = queue.Queue()
        self.notes: list[str] = []
        self.environ = {**hub.env(), "VL_CONFIG_REPO": CONFIG, **environ}
        self.config = RemoteConfig(
            self.environ, lambda s, scopes: self.changes.put((s, scopes)), notify=self.notes.append, poll_s=0.05
        )

    def edit(self, text: str) -> None:
        """What the operator does: upload a new pod.env with the real client."""
        HfApi(endpoint=self.hub.endpoint, token=self.hub.write_token).upload_file(
            path_or_fileobj=text.encode(), path_in_repo="pod.env", repo_id=CONFIG
        )

    def next_change(self) -> tuple[Settings, frozenset[Scope]]:
        return self.changes.get(timeout=30)

    def polls(self) -> int:
        return sum(1 for r in self.hub.received if r.method == "HEAD" and r.path.endswith("/resolve/main/pod.env"))


@pytest.fixture
def watch(hub_server: HubServer):
    hub_server.create_repo(CONFIG, private=True)
    hub_server.put_file(CONFIG, "pod.env", "VL_BRIDGE_PING_S=5\nVL_CTX=4096\nVL_MODEL=tiny\n")
    watch = Watch(hub_server, VL_CTX="8192")
    yield watch
    watch.config.stop()


def test_initial_load_applies_the_hub_file_under_the_environment(watch: Watch) -> None:
    settings = watch.config.load()
    assert (settings.bridge_ping_s, settings.model, settings.ctx) == (5.0, "tiny", 8192)
    assert (settings.sources["bridge_ping_s"], settings.sources["ctx"], settings.sources["spec"]) == (
        "remote",
        "env",
        "default",
    )
    assert watch.changes.empty()


@pytest.mark.parametrize(("line", "scope", "attr", "value"), [
    ("VL_ALIASES=claude-pod, claude-opus-4", Scope.BRIDGE, "aliases", ("claude-pod", "claude-opus-4")),
    ("VL_SPEC=ngram", Scope.ENGINE, "spec", "ngram"),
], ids=["bridge only", "engine"])  # fmt: skip
def test_a_change_restarts_what_it_concerns_only(
    watch: Watch, line: str, scope: Scope, attr: str, value: object
) -> None:
    watch.config.load()
    watch.config.start()
    watch.edit(f"VL_BRIDGE_PING_S=5\nVL_CTX=4096\nVL_MODEL=tiny\n{line}\n")
    settings, scopes = watch.next_change()
    assert scopes == {scope}
    assert getattr(settings, attr) == value
    assert watch.config.settings == settings


def test_an_invalid_file_is_refused_and_the_old_configuration_keeps_serving(
    hub_server: HubServer, watch: Watch, tmp_path: Path
) -> None:
    hub_server.create_repo("pod-owner/pod-logs")
    log = LogPublisher(
        HubRepo.from_environ("pod-owner/pod-logs", hub_server.env()),
        "pod-1",
        {},
        lambda: True,
        Redactor(),
        interval_s=0.05,
    )
    log.start()
    watch.config.notify = log.publish_now  # the supervisor sends refusals to the Hub log
    before = watch.config.load()
    watch.config.start()
    for bad, reason in [
        ("VL_SPEC=banana\n", "VL_SPEC='banana' is not allowed"),
        ("VL_TYPO=1\n", "VL_TYPO='1' is not allowed: expected a known setting name"),
        ("VL_CTX 4096\n", "pod.env line 1: expected VL_NAME=value"),
    ]:
        watch.edit(bad)
        wait_until(
            lambda reason=reason: reason in (hub_server.file("pod-owner/pod-logs", "etat/pod-1.log") or b"").decode(),
            f"the refusal ({reason}) in the Hub log",
        )
        assert watch.config.settings == before
    assert watch.changes.empty()

    watch.edit("VL_BRIDGE_PING_S=7\n")  # fixed: applied
    settings, scopes = watch.next_change()
    assert (settings.bridge_ping_s, settings.model, scopes) == (7.0, "nemotron", {Scope.ENGINE, Scope.BRIDGE})
    log.close()


def test_an_invalid_file_at_start_is_refused_and_the_pod_starts_on_its_environment(watch: Watch) -> None:
    watch.hub.put_file(CONFIG, "pod.env", "VL_UTIL=1.5\n")
    settings = watch.config.load()
    assert (settings.util, settings.sources["util"], settings.ctx) == (None, "default", 8192)
    assert any("VL_UTIL='1.5' is not allowed" in note for note in watch.notes)


def test_an_unchanged_file_is_not_downloaded_again(watch: Watch) -> None:
    watch.config.load()
    downloads = [r for r in watch.hub.received if r.method == "GET" and r.path.endswith("/pod.env")]
    assert len(downloads) == 1
    watch.config.start()
    watch.hub.put_file(CONFIG, "README.md", "another file changes the repo's sha, not pod.env's ETag")
    watch.edit("VL_BRIDGE_PING_S=5\nVL_CTX=4096\nVL_MODEL=tiny\n")  # same bytes: the client commits nothing
    polls = watch.polls()
    wait_until(lambda: watch.polls() >= polls + 10, "ten more polls")
    assert [r for r in watch.hub.received if r.method == "GET" and r.path.endswith("/pod.env")] == downloads
    assert watch.changes.empty()


def test_what_the_environment_overrides_or_a_pod_setting_restarts_nothing(watch: Watch) -> None:
    watch.config.load()
    watch.config.start()
    watch.edit("VL_BRIDGE_PING_S=5\nVL_CTX=2048\nVL_MODEL=tiny\nVL_PORT=9000\n")  # VL_CTX is set by the pod
    polls = watch.polls()
    wait_until(lambda: watch.polls() >= polls + 10, "ten more polls")
    assert watch.changes.empty()
    assert (watch.config.settings.ctx, watch.config.settings.port) == (8192, 8080)


def test_deleting_the_file_returns_to_the_defaults(watch: Watch) -> None:
    watch.config.load()
    watch.config.start()
    HfApi(endpoint=watch.hub.endpoint, token=watch.hub.write_token).delete_file("pod.env", CONFIG)
    settings, scopes = watch.next_change()
    assert (settings.model, settings.bridge_ping_s, settings.ctx) == ("nemotron", 15.0, 8192)
    assert scopes == {Scope.ENGINE, Scope.BRIDGE}


def test_the_watcher_survives_a_hub_outage(watch: Watch) -> None:
    with watch.hub.outage("refuse"):
        settings = watch.config.load()  # start-up does not wait for the Hub
        assert settings.model == "nemotron" and settings.ctx == 8192
        watch.config.start()
        wait_until(lambda: watch.hub.refused_connections >= 5, "five refused polls")
    settings, scopes = watch.next_change()  # the Hub is back: its file applies
    assert (settings.model, settings.bridge_ping_s) == ("tiny", 5.0)
    assert scopes == {Scope.ENGINE, Scope.BRIDGE}

    with watch.hub.outage("hang"):
        wait_until(lambda: watch.hub.hung_connections >= 1, "a poll stuck in a hung request")
    watch.edit("VL_BRIDGE_PING_S=9\nVL_MODEL=tiny\n")
    settings, scopes = watch.next_change()
    assert (settings.bridge_ping_s, scopes) == (9.0, {Scope.BRIDGE})


def test_a_failing_callback_does_not_stop_the_watcher(watch: Watch) -> None:
    calls: list[frozenset[Scope]] = []

    def on_change(settings: Settings, scopes: frozenset[Scope]) -> None:
        calls.append(scopes)
        if len(calls) == 1:
            raise RuntimeError("bridge would not restart")

    watch.config.on_change = on_change
    watch.config.load()
    watch.config.start()
    watch.edit("VL_BRIDGE_PING_S=6\nVL_MODEL=tiny\nVL_CTX=4096\n")
    wait_until(lambda: any("bridge would not restart" in n for n in watch.notes), "the failure reported")
    watch.edit("VL_BRIDGE_PING_S=7\nVL_MODEL=tiny\nVL_CTX=4096\n")
    wait_until(lambda: len(calls) == 2, "the next change delivered")


def test_without_a_config_repo_it_keeps_the_environment(hub_server: HubServer) -> None:
    config = RemoteConfig({**hub_server.env(), "VL_CTX": "4096"}, lambda s, scopes: None)
    assert config.load().ctx == 4096
    config.start()
    config.stop()
    assert hub_server.received == []


def test_the_documented_wiring_publishes_a_refusal_at_start(hub_server: HubServer, tmp_path: Path) -> None:
    """The order runtime/hub/__init__.py gives the supervisor: the refusal reaches the Hub log, secrets don't."""
    hub_server.create_repo(CONFIG, private=True)
    hub_server.put_file(CONFIG, "pod.env", "VL_CTX=4096\nVL_API_KEY=team-secret-key-1\n")  # a typo: VL_API_KEYS
    environ = {
        **hub_server.env(),
        "VL_CONFIG_REPO": CONFIG,
        "VL_LOG_REPO": "pod-owner/pod-logs",
        "RUNPOD_POD_ID": "pod-7",
    }
    boot = tmp_path / "boot.log"
    boot.write_text("runtime: starting\n")
    config = RemoteConfig(environ, on_change=lambda settings, scopes: None)
    publisher = LogPublisher.from_settings(
        config.settings, environ, {"boot": boot}, is_healthy=lambda: False, redactor=config.redactor
    )
    config.notify = publisher.publish_now
    publisher.start()
    try:
        settings = config.load()
        assert settings.ctx is None  # the whole file is refused, not half of it
        refusal = "VL_API_KEY='[redacted]' is not allowed: expected a known setting name"
        log = wait_until(
            lambda: (
                refusal in (hub_server.file("pod-owner/pod-logs", "etat/pod-7.log") or b"").decode()
                and hub_server.file("pod-owner/pod-logs", "etat/pod-7.log").decode()
            ),
            "the refusal, masked",
        )
        assert "boot | runtime: starting" in log
        assert not [r for r in hub_server.received if r.carries("team-secret-key-1")]
    finally:
        publisher.close(timeout_s=60)
