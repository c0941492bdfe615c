"""Remote configuration, the source: each new version of the Hub file handed over once, with its repo's
visibility; nothing downloaded while it is unchanged or too large; a Hub outage survived."""

from __future__ import annotations

import queue

import pytest
from huggingface_hub import HfApi

from runtime.hub.remoteconfig import RemoteConfig
from runtime.hub.repo import HubRepo
from runtime.settingsfile import MAX_FILE_BYTES, SettingsFile
from tests.support.hub_server import HubServer
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow  # a test Hub per test, polled

CONFIG = "pod-owner/pod-config"
FIRST = "VL_BRIDGE_PING_S=5\nVL_CTX=4096\nVL_MODEL=tiny\n"


class Watch:
    """A RemoteConfig as the pod makes it (its repo from the environment), recording what it hands over."""

    def __init__(self, hub: HubServer) -> None:
        self.hub = hub
        self.files: queue.Queue[SettingsFile] = queue.Queue()
        self.config = RemoteConfig(HubRepo.from_environ(CONFIG, hub.env()), "pod.env", poll_s=0.05)

    def edit(self, text: str) -> None:
        """What the operator does: upload a new pod.env with the real client."""
        self.api.upload_file(path_or_fileobj=text.encode(), path_in_repo="pod.env", repo_id=CONFIG)

    @property
    def api(self) -> HfApi:
        return HfApi(endpoint=self.hub.endpoint, token=self.hub.write_token)

    def next_file(self) -> SettingsFile:
        return self.files.get(timeout=30)

    def polls(self) -> int:
        return sum(1 for r in self.hub.received if r.method == "HEAD" and r.path.endswith("/resolve/main/pod.env"))

    def downloads(self) -> list:
        return [r for r in self.hub.received if r.method == "GET" and r.path.endswith("/pod.env")]


@pytest.fixture
def watch(hub_server: HubServer):
    hub_server.create_repo(CONFIG, private=True)
    hub_server.put_file(CONFIG, "pod.env", FIRST)
    watch = Watch(hub_server)
    yield watch
    watch.config.stop()


def test_the_first_read_hands_over_the_file_and_its_repo_s_visibility(watch: Watch) -> None:
    assert watch.config.read() == SettingsFile(FIRST, f"{CONFIG}/pod.env", private=True)
    assert watch.config.read() is None  # unchanged: nothing new


def test_each_new_version_is_handed_over_once(watch: Watch) -> None:
    watch.config.read()
    watch.config.start(watch.files.put)
    watch.edit("VL_ALIASES=claude-pod\n")
    assert watch.next_file().text == "VL_ALIASES=claude-pod\n"
    polls = watch.polls()
    wait_until(lambda: watch.polls() >= polls + 10, "ten more polls")
    assert watch.files.empty()


def test_a_repo_made_public_is_said_so_with_the_next_version(watch: Watch) -> None:
    watch.config.read()
    watch.config.start(watch.files.put)
    watch.api.update_repo_settings(CONFIG, private=False)
    watch.edit("VL_API_KEYS=team:key-0123456789abcdef\n")
    assert watch.next_file().private is False


def test_an_unchanged_file_is_not_downloaded_again(watch: Watch) -> None:
    watch.config.read()
    downloads = watch.downloads()
    assert len(downloads) == 1
    watch.config.start(watch.files.put)
    watch.hub.put_file(CONFIG, "README.md", "another file changes the repo's sha, not pod.env's ETag")
    watch.edit(FIRST)  # same bytes: the client commits nothing
    polls = watch.polls()
    wait_until(lambda: watch.polls() >= polls + 10, "ten more polls")
    assert watch.downloads() == downloads
    assert watch.files.empty()


def test_a_file_too_large_for_settings_is_not_downloaded(watch: Watch) -> None:
    watch.config.read()
    downloads = watch.downloads()
    watch.hub.put_file(CONFIG, "pod.env", "VL_ALIASES=" + "a," * MAX_FILE_BYTES)
    file = watch.config.read()
    assert file is not None and (file.text, file.size) == ("", len("VL_ALIASES=") + 2 * MAX_FILE_BYTES)
    assert watch.downloads() == downloads


def test_a_deleted_file_is_handed_over_empty(watch: Watch) -> None:
    watch.config.read()
    watch.config.start(watch.files.put)
    watch.api.delete_file("pod.env", CONFIG)
    assert watch.next_file().text == ""


def test_the_watcher_survives_a_hub_outage(watch: Watch) -> None:
    with watch.hub.outage("refuse"):
        assert watch.config.read() is None  # start-up does not wait for the Hub
        watch.config.start(watch.files.put)
        wait_until(lambda: watch.hub.refused_connections >= 5, "five refused polls")
    assert watch.next_file().text == FIRST  # the Hub is back: its file comes

    with watch.hub.outage("hang"):
        wait_until(lambda: watch.hub.hung_connections >= 1, "a poll stuck in a hung request")
    watch.edit("VL_BRIDGE_PING_S=9\n")
    assert watch.next_file().text == "VL_BRIDGE_PING_S=9\n"


def test_a_failing_receiver_does_not_stop_the_watcher(watch: Watch) -> None:
    received: list[SettingsFile] = []

    def on_file(file: SettingsFile) -> None:
        received.append(file)
        if len(received) == 1:
            raise RuntimeError("the pod could not take it")

    watch.config.read()
    watch.config.start(on_file)
    watch.edit("VL_BRIDGE_PING_S=6\n")
    wait_until(lambda: len(received) == 1, "the first version handed over")
    watch.edit("VL_BRIDGE_PING_S=7\n")
    wait_until(lambda: len(received) == 2, "the next version handed over")
