"""The Hub log publisher, against the test Hub through the real huggingface_hub client."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import RepositoryNotFoundError

from runtime.client.status import render
from runtime.gpu import GpuError, HostGpu, decide
from runtime.hub.commitrate import commit_rate
from runtime.hub.logpublish import LogPublisher
from runtime.hub.repo import HubRepo
from runtime.logfiles import tail
from runtime.ratelimit import RateLimit
from runtime.redact import MARKER, Redactor
from runtime.settings import load_settings
from runtime.state.hublog import read_hub_log_refusal
from tests.support.bridge import pod_status, start_bridge
from tests.support.hub_server import HubServer
from tests.support.net import free_port
from tests.support.polling import wait_until

pytestmark = pytest.mark.slow  # a test Hub per test, and waits on the publisher's real rate limit

REPO = "pod-owner/pod-logs"
MakePublisher = Callable[..., LogPublisher]
LOG = "etat/pod-1.log"


class Pod:
    """The files and health flag a supervisor would hand to the publisher."""

    def __init__(self, root: Path) -> None:
        self.logs = {name: root / f"{name}.log" for name in ("boot", "engine", "bridge")}
        self.healthy = threading.Event()

    def write(self, name: str, *lines: str) -> None:
        with self.logs[name].open("a") as file:
            file.writelines(f"{line}\n" for line in lines)


@pytest.fixture
def pod(tmp_path: Path) -> Pod:
    return Pod(tmp_path)


@pytest.fixture
def publisher(hub_server: HubServer, pod: Pod) -> Iterator[MakePublisher]:
    """Makes publishers for this test's Hub, and makes sure their threads are gone before the Hub is.

    (A thread left retrying against a stopped Hub would disturb the next tests: on a connection error,
    huggingface_hub closes the HTTP client that every thread shares.)
    """
    made: list[LogPublisher] = []

    def make(
        environ: dict[str, str] | None = None,
        hub: HubServer = hub_server,
        is_healthy: Callable[[], bool] = pod.healthy.is_set,
        **options,
    ) -> LogPublisher:
        environ = {**hub.env(), **(environ or {})}
        options = {"interval_s": 0.05, "retry_s": (0.05, 0.2), **options}
        made.append(
            LogPublisher(
                HubRepo.from_environ(REPO, environ),
                "pod-1",
                pod.logs,
                is_healthy,
                Redactor.from_environ(environ),
                **options,
            )
        )
        return made[-1]

    yield make
    for pub in made:
        pub.close(timeout_s=60)
        assert pub._thread is None or not pub._thread.is_alive()


def hub_log(hub: HubServer) -> str:
    return (hub.file(REPO, LOG) or b"").decode()


def log_commits(hub: HubServer) -> int:
    return sum(1 for c in hub.commits(REPO) if c.message == "log of pod pod-1")


def test_the_log_appears_while_not_healthy_and_stops_once_healthy(
    hub_server: HubServer, pod: Pod, publisher: MakePublisher
) -> None:
    hub_server.create_repo(REPO)
    pod.write("boot", "runtime: starting vLLM")
    pod.write("engine", "INFO loading weights")
    pub = publisher()
    pub.start()
    wait_until(lambda: "loading weights" in hub_log(hub_server), "the first publish")
    assert "not healthy" in hub_log(hub_server).splitlines()[0]
    assert "boot   | runtime: starting vLLM" in hub_log(hub_server)

    pod.write("engine", "INFO weights loaded in 31 s")
    wait_until(lambda: "weights loaded" in hub_log(hub_server), "a republish while still not healthy")

    pod.healthy.set()
    wait_until(lambda: "· healthy since" in hub_log(hub_server), "the last publish, saying healthy")
    commits, cycles = log_commits(hub_server), pub.stats.cycles
    pod.write("engine", "INFO serving requests")
    wait_until(lambda: pub.stats.cycles >= cycles + 10, "ten more publisher cycles")
    assert log_commits(hub_server) == commits
    assert "serving requests" not in hub_log(hub_server)
    pub.close()


def test_publish_now_after_a_crash_even_when_healthy(hub_server: HubServer, pod: Pod, publisher: MakePublisher) -> None:
    hub_server.create_repo(REPO)
    pod.healthy.set()
    pod.write("engine", "Traceback (most recent call last):", "RuntimeError: CUDA error: unspecified launch failure")
    pub = publisher()
    pub.start()
    wait_until(lambda: pub.stats.cycles >= 5, "five publisher cycles")
    assert hub_server.file(REPO, LOG) is None  # healthy: nothing to say

    pub.publish_now("engine exited with code 1; restarting it in 2 s")
    text = wait_until(lambda: "restarting it in 2 s" in hub_log(hub_server) and hub_log(hub_server), "the crash note")
    assert "engine | RuntimeError: CUDA error: unspecified launch failure" in text
    assert text.rstrip().splitlines()[-1].endswith("engine exited with code 1; restarting it in 2 s")
    pub.close()


def test_a_fatal_line_is_published_before_close_returns(
    hub_server: HubServer, pod: Pod, publisher: MakePublisher
) -> None:
    """The GPU check's path: publish its one line, then stop, before the process exits."""
    hub_server.create_repo(REPO)
    pub = publisher(interval_s=3600)
    pub.start()
    wait_until(lambda: log_commits(hub_server) == 1, "the first publish")
    with pytest.raises(GpuError) as refused:
        decide(HostGpu("535.104.05", "12.2", ("NVIDIA GeForce RTX 4090",)), "13.0", Path("/no/compat"))
    pub.publish_now(str(refused.value))
    pub.close(timeout_s=60)
    assert hub_log(hub_server).rstrip().endswith('RunPod: "allowedCudaVersions": ["13.0"])')


class HeldRepo:
    """The real repo, whose first upload waits for `go`: an upload under way when a last word is said."""

    def __init__(self, repo: HubRepo) -> None:
        self.repo, self.uploading, self.go = repo, threading.Event(), threading.Event()

    def __str__(self) -> str:
        return str(self.repo)

    def write_text(self, path: str, text: str, message: str) -> None:
        if not self.uploading.is_set():
            self.uploading.set()
            self.go.wait(60)
        self.repo.write_text(path, text, message)


def test_the_last_word_is_on_the_hub_when_publish_and_wait_returns(hub_server: HubServer, pod: Pod) -> None:
    """The self-stop's path: an upload of an older text finishing meanwhile does not count as the last word."""
    hub_server.create_repo(REPO)
    held = HeldRepo(HubRepo.from_environ(REPO, hub_server.env()))
    pub = LogPublisher(held, "pod-1", pod.logs, pod.healthy.is_set, Redactor.from_environ(hub_server.env()))
    pub.start()
    assert held.uploading.wait(60)  # the first text, without the last word, is on its way
    seen: list[tuple[bool, str]] = []
    waiter = threading.Thread(
        target=lambda: seen.append((pub.publish_and_wait("stopping this pod", 60), hub_log(hub_server)))
    )
    waiter.start()
    wait_until(lambda: "stopping this pod" in pub.render(False), "the last word noted")
    held.go.set()
    waiter.join(120)
    pub.close(timeout_s=60)
    ((published, text),) = seen
    assert published and "stopping this pod" in text


def test_no_planted_secret_reaches_the_hub(hub_server: HubServer, pod: Pod, publisher: MakePublisher) -> None:
    secrets = {
        "HF_TOKEN": hub_server.write_token,  # the pod's own token: it may only travel in Authorization
        "VL_API_KEYS": "sk-bridge-key-0123456789abcdef,second-bridge-key",
        "MY_SERVICE_PASSWORD": "correct horse battery staple",
        "ANTHROPIC_AUTH_TOKEN": "anthropic-token-value",
    }
    stray = "hf_StrayTokenNotInAnyVariable0123456789"
    hub_server.create_repo(REPO)
    pod.write("boot", f"env: HF_TOKEN={secrets['HF_TOKEN']} MY_SERVICE_PASSWORD={secrets['MY_SERVICE_PASSWORD']}")
    pod.write("engine", f"non-default args: {{'api_key': ['second-bridge-key']}} hub token {stray}")
    pod.write(
        "bridge",
        "401 for Authorization: Bearer sk-bridge-key-0123456789abcdef",
        f"upstream said {secrets['ANTHROPIC_AUTH_TOKEN']}",
    )
    pub = publisher(secrets)
    pub.start()
    pub.publish_now(f"refused remote VL_API_KEYS=second-bridge-key (HF_TOKEN={secrets['HF_TOKEN']})")
    wait_until(lambda: "refused remote" in hub_log(hub_server), "the publish with the note")
    pub.close()

    text = hub_log(hub_server)
    assert text.count(MARKER) >= 8
    planted = [*secrets.values(), "sk-bridge-key-0123456789abcdef", "second-bridge-key", stray]
    for secret in planted:
        assert not [r for r in hub_server.received if r.carries(secret)], f"{secret!r} reached the Hub"


def test_the_commit_rate_is_bounded(hub_server: HubServer, pod: Pod, publisher: MakePublisher) -> None:
    hub_server.create_repo(REPO)
    now = [0.0]
    rate = RateLimit(burst=3, every_s=60.0, clock=lambda: now[0])  # 60 an hour

    steps = itertools.count()

    def chatty_and_never_healthy() -> bool:  # every look finds new engine output
        pod.write("engine", f"INFO step {next(steps)}")
        return False

    pub = publisher(is_healthy=chatty_and_never_healthy, interval_s=0.02, rate=rate)
    pub.start()
    wait_until(lambda: pub.stats.cycles >= 30, "thirty publisher cycles")
    assert log_commits(hub_server) == 3  # the burst, and nothing more while the bucket is empty

    pub.publish_now("engine exited with code 1")
    wait_until(lambda: pub.stats.cycles >= 40, "ten more cycles")
    assert "engine exited" not in hub_log(hub_server)  # owed, not forgotten
    now[0] += 60.0  # one minute later: one more commit is allowed
    wait_until(lambda: "engine exited" in hub_log(hub_server), "the owed publish")
    wait_until(lambda: pub.stats.cycles >= 60, "twenty more cycles")
    assert log_commits(hub_server) == 4
    pub.close()


def test_the_default_commit_rate_keeps_a_pod_under_the_hubs_limit() -> None:
    """Publishing every 25 s for two hours: 25 s cadence at first, then one a 72 s; never 60 in an hour."""
    now = [0.0]
    rate, commits = commit_rate(clock=lambda: now[0]), []
    for step in range(2 * 3600 // 25):
        now[0] = step * 25.0
        if rate.wait_s() == 0:
            rate.spend()
            commits.append(now[0])
    assert commits[:10] == [25.0 * i for i in range(10)]
    assert max(sum(1 for c in commits if start <= c < start + 3600) for start in commits) <= 60
    assert len(commits) >= 100  # and it keeps publishing


def test_a_hub_outage_never_blocks_the_caller_and_publishing_resumes(
    hub_server: HubServer, pod: Pod, publisher: MakePublisher
) -> None:
    hub_server.create_repo(REPO)
    pod.write("engine", "INFO starting")
    pub = publisher()
    with hub_server.outage("hang"):
        pub.start()
        wait_until(lambda: hub_server.hung_connections >= 1, "the publisher stuck in a hung request")
        pub.publish_now("engine exited with code 1 during the outage")  # returns at once, Hub or not
        assert hub_server.file(REPO, LOG) is None
    wait_until(lambda: "during the outage" in hub_log(hub_server), "the publish after the hang")

    with hub_server.outage("refuse"):
        pub.publish_now("bridge restarted while the Hub refused connections")
        wait_until(lambda: hub_server.refused_connections >= 1, "a refused connection")
    wait_until(lambda: "refused connections" in hub_log(hub_server), "the publish after the refusals")
    pub.close()


def test_close_does_not_wait_for_a_hung_hub(hub_server: HubServer, pod: Pod, publisher: MakePublisher) -> None:
    hub_server.create_repo(REPO)
    pub = publisher()
    with hub_server.outage("hang"):
        pub.start()
        wait_until(lambda: hub_server.hung_connections >= 1, "the publisher stuck in a hung request")
        pub.close(timeout_s=0.1)
        assert pub._thread.is_alive()  # still stuck in the request; close() returned anyway


def test_failures_are_retried_with_back_off_and_never_raised(pod: Pod, publisher: MakePublisher) -> None:
    with HubServer(commits_per_hour=1) as hub:  # the repo's initial commit uses the Hub's whole allowance
        hub.create_repo(REPO)
        pod.write("engine", "INFO starting")
        pub = publisher(hub=hub)
        pub.start()
        wait_until(lambda: pub.stats.failures >= 3, "three refused publishes")
        assert "429" in pub.stats.last_error or "rate limit" in pub.stats.last_error
        hub.commits_per_hour = 100  # the limit lifts
        wait_until(lambda: "INFO starting" in (hub.file(REPO, LOG) or b"").decode(), "the publish after back-off")
        pub.close()


def test_it_creates_a_missing_log_repo_as_private(hub_server: HubServer, pod: Pod, publisher: MakePublisher) -> None:
    pod.write("engine", "INFO starting")
    pub = publisher()
    pub.start()
    wait_until(lambda: "INFO starting" in hub_log(hub_server), "the first publish")
    pub.close()
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub_server.endpoint, token=False).repo_info(REPO)


UNTIL = "; until then `python -m runtime logs` shows nothing of this pod"
REFUSALS = {  # HF_TOKEN's kind -> the one line the pod says
    "read": f"the Hub refuses this pod's log ({REPO}: HTTP 403): HF_TOKEN may not write there (a read token only "
    f"downloads): give the pod a token with write access to {REPO}{UNTIL}",
    "unknown": f"the Hub refuses this pod's log ({REPO}: HTTP 401): it knows no such HF_TOKEN{UNTIL}",
    "secret never created": f"the Hub refuses this pod's log ({REPO}: HTTP 401): the RunPod secret HF_TOKEN "
    f"(HF_TOKEN) was never created: create it in RunPod's console (Secrets), a token with write access to {REPO}{UNTIL}",
}


def token_of_kind(hub: HubServer, kind: str) -> str:
    return {
        "read": hub.read_token,
        "unknown": "hf_" + "0" * 34,
        "secret never created": "{{ RUNPOD_SECRET_HF_TOKEN }}",
    }[kind]


@pytest.mark.parametrize("kind", REFUSALS)
def test_a_token_that_cannot_write_is_said_once_in_one_line(
    hub_server: HubServer,
    pod: Pod,
    publisher: MakePublisher,
    tmp_path: Path,
    kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a read token the log never appeared and `logs --follow` waited forever: the pod now says why, once."""
    hub_server.create_repo(REPO)
    pub = publisher({"HF_TOKEN": token_of_kind(hub_server, kind)}, state_dir=tmp_path / "state")
    with caplog.at_level("INFO", logger="runtime.hub.log"):
        pub.start()
        wait_until(lambda: pub.stats.failures >= 3, "three refused writes")
        pub.close()
    assert read_hub_log_refusal(tmp_path / "state") == REFUSALS[kind]
    said = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert said == [REFUSALS[kind]], "once, however often the Hub refuses"


def test_the_refusal_reaches_the_pod_status_and_goes_once_the_hub_takes_the_log(
    hub_server: HubServer, pod: Pod, publisher: MakePublisher, tmp_path: Path
) -> None:
    hub_server.create_repo(REPO)
    state = tmp_path / "state"
    refused = publisher({"HF_TOKEN": hub_server.read_token}, state_dir=state)
    refused.start()
    wait_until(lambda: read_hub_log_refusal(state), "the refusal")
    refused.close()
    key = "sk-status-0123456789abcdef"
    settings = {"VL_STATE_DIR": str(state), "VL_API_KEYS": key}
    with start_bridge(f"http://127.0.0.1:{free_port()}", tmp_path / "bridge.log", settings) as bridge:
        status = pod_status(bridge.url, key)
    assert status["hub_log_refused"] == REFUSALS["read"]
    assert f"Hub log {REFUSALS['read']}" in render(status).splitlines()  # `python -m runtime status`

    fixed = publisher(state_dir=state)  # the pod restarted with a token that may write
    fixed.start()
    wait_until(lambda: hub_log(hub_server), "the first publish")
    fixed.close()
    assert read_hub_log_refusal(state) is None


def test_without_a_log_repo_it_does_nothing(hub_server: HubServer, pod: Pod) -> None:
    settings = load_settings({})
    pub = LogPublisher.from_settings(settings, hub_server.env(), pod.logs, pod.healthy.is_set, Redactor())
    pub.start()
    pub.publish_now("nobody listens")
    pub.close()
    assert pub._thread is None and hub_server.received == []


def test_from_settings_reads_the_pods_variables(hub_server: HubServer, pod: Pod) -> None:
    environ = {
        **hub_server.env(),
        "VL_LOG_REPO": "datasets/pod-owner/boot-logs",
        "VL_LOG_INTERVAL_S": "7",
        "RUNPOD_POD_ID": "abc123xyz",
    }
    pub = LogPublisher.from_settings(load_settings(environ), environ, pod.logs, pod.healthy.is_set, Redactor())
    assert (pub.repo.repo_id, pub.repo.repo_type, pub.path, pub.interval_s) == (
        "pod-owner/boot-logs",
        "dataset",
        "etat/abc123xyz.log",
        7.0,
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", []),
        (b"one\ntwo\n", ["one", "two"]),
        (b"\x1b[32mINFO\x1b[0m colour\n", ["INFO colour"]),
        (b"Loading: 10%\rLoading: 50%\rLoading: 100%\n", ["Loading: 100%"]),
        (b"windows line\r\n", ["windows line"]),
        (b"no newline at the end", ["no newline at the end"]),
        (b"caf\xc3\xa9 \xff\n", ["caf\u00e9 \ufffd"]),
    ],
)
def test_tail_of_a_log(tmp_path: Path, content: bytes, expected: list[str]) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(content)
    assert tail(path) == expected


def test_tail_keeps_the_end_of_a_long_log(tmp_path: Path) -> None:
    path = tmp_path / "x.log"
    path.write_text("".join(f"line {i} " + "x" * 100 + "\n" for i in range(2000)))
    rows = tail(path, lines=150, max_bytes=4096)
    assert rows[-1].startswith("line 1999 ") and len(rows) < 150 and all(r.startswith("line ") for r in rows)
    assert tail(tmp_path / "missing.log") == []
