"""The test Hub itself: it answers the real huggingface_hub client as the Hub does, and refuses what the Hub refuses."""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
import warnings
from collections.abc import Iterator
from email.utils import parsedate_to_datetime

import httpx
import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_url
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import parse_datetime

from tests.support.docker_engine import import_debian_base, private_engine
from tests.support.hub_repos import git_hash
from tests.support.hub_server import HubServer
from tests.support.registry import LocalRegistry
from tests.support.space_builder import SpaceBuilder

pytestmark = pytest.mark.slow  # a test Hub per test, and Space builds that take their time

REPO = "pod-owner/logs"
SPACE = "pod-owner/Hello-Space"
IMAGE = "pod-owner-hello-space"  # the Hub's name for the Space's image: <owner>-<name>, lowercased
CARD = "---\ntitle: hello\nsdk: docker\ncolorFrom: indigo\ncolorTo: gray\napp_port: 7860\nshort_description: hi\n---\n"
DOCKERFILE = b"ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY hello.txt /\nRUN test -f /hello.txt\n"


def api(hub: HubServer, token: str | bool) -> HfApi:
    return HfApi(endpoint=hub.endpoint, token=token)


def upload(hub: HubServer, token: str | bool, content: bytes = b"hello\n", path: str = "etat/p.log") -> None:
    api(hub, token).upload_file(path_or_fileobj=content, path_in_repo=path, repo_id=REPO)


def test_round_trip_through_the_real_client(hub_server: HubServer) -> None:
    owner = api(hub_server, hub_server.write_token)
    owner.create_repo(REPO, private=True)
    upload(hub_server, hub_server.write_token, b"line 1\n")

    info = owner.repo_info(REPO)
    metadata = owner.get_hf_file_metadata(url=hf_hub_url(REPO, "etat/p.log", endpoint=hub_server.endpoint))
    assert metadata.etag == git_hash(b"line 1\n")
    assert metadata.commit_hash == info.sha
    assert metadata.size == len(b"line 1\n")
    assert owner.list_repo_files(REPO) == [".gitattributes", "etat/p.log"]
    assert hub_server.file(REPO, "etat/p.log") == b"line 1\n"
    assert [r.status for r in hub_server.received if "/commit/" in r.path] == [200]


def test_create_repo_twice_is_a_conflict_that_exist_ok_accepts(hub_server: HubServer) -> None:
    owner = api(hub_server, hub_server.write_token)
    owner.create_repo(REPO)
    with pytest.raises(HfHubHTTPError) as conflict:
        owner.create_repo(REPO)
    assert conflict.value.response.status_code == 409
    assert owner.create_repo(REPO, exist_ok=True).repo_id == REPO


@pytest.mark.parametrize("who", ["anonymous", "read-only token", "another user"])
def test_writes_need_the_owners_write_token(hub_server: HubServer, who: str) -> None:
    hub_server.create_repo(REPO)
    token = {"anonymous": False, "read-only token": hub_server.read_token, "another user": hub_server.stranger_token}[
        who
    ]
    with pytest.raises(HfHubHTTPError) as refused:
        upload(hub_server, token)
    assert refused.value.response.status_code == (401 if who == "anonymous" else 403)
    assert len(hub_server.commits(REPO)) == 1  # only the initial commit


def test_an_unknown_token_is_refused_even_on_a_public_repo(hub_server: HubServer) -> None:
    hub_server.create_repo(REPO)
    with pytest.raises(HfHubHTTPError) as refused:
        api(hub_server, "hf_" + "x" * 34).repo_info(REPO)
    assert refused.value.response.status_code == 401
    assert not isinstance(refused.value, RepositoryNotFoundError)


def test_missing_and_private_repos_look_the_same(hub_server: HubServer) -> None:
    hub_server.create_repo(REPO, private=True)
    for token, repo in [
        (hub_server.write_token, "pod-owner/missing"),
        (False, REPO),
        (hub_server.stranger_token, REPO),
    ]:
        with pytest.raises(RepositoryNotFoundError):
            api(hub_server, token).repo_info(repo)
        with pytest.raises(RepositoryNotFoundError):
            api(hub_server, token).hf_hub_download(repo, ".gitattributes")


def test_unknown_file_and_revision(hub_server: HubServer, tmp_path) -> None:
    hub_server.create_repo(REPO)
    client = api(hub_server, False)
    with pytest.raises(RemoteEntryNotFoundError):
        client.hf_hub_download(REPO, "etat/none.log", cache_dir=tmp_path)
    with pytest.raises(RevisionNotFoundError):
        client.hf_hub_download(REPO, ".gitattributes", revision="dev", cache_dir=tmp_path)
    with pytest.raises(RevisionNotFoundError):
        client.repo_info(REPO, revision="0" * 40)


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("../escape", "eA=="),
        ("/abs", "eA=="),
        ("a//b", "eA=="),
        ("a/./b", "eA=="),
        (".git/config", "eA=="),
        ("a\\b", "eA=="),
        ("", "eA=="),
        ("fine.txt", "not base64!"),
    ],
)
def test_invalid_commits_are_refused(hub_server: HubServer, path: str, content: str) -> None:
    hub_server.create_repo(REPO)
    lines = [
        {"key": "header", "value": {"summary": "x"}},
        {"key": "file", "value": {"path": path, "content": content, "encoding": "base64"}},
    ]
    answer = httpx.post(
        f"{hub_server.endpoint}/api/models/{REPO}/commit/main",
        content="\n".join(json.dumps(line) for line in lines),
        headers={"authorization": f"Bearer {hub_server.write_token}", "content-type": "application/x-ndjson"},
    )
    assert answer.status_code == 400, answer.text
    assert len(hub_server.commits(REPO)) == 1


def test_binary_files_go_to_lfs_which_this_server_refuses(hub_server: HubServer) -> None:
    hub_server.create_repo(REPO)
    with pytest.raises((HfHubHTTPError, ConnectionError)):  # the client tries Xet first, then fails
        upload(hub_server, hub_server.write_token, b"\0binary", "weights.bin")
    assert hub_server.file(REPO, "weights.bin") is None
    assert not [r for r in hub_server.received if "/commit/" in r.path]


def test_a_stale_parent_commit_is_refused(hub_server: HubServer) -> None:
    hub_server.create_repo(REPO)
    first = hub_server.commits(REPO)[0].oid
    upload(hub_server, hub_server.write_token)
    with pytest.raises(HfHubHTTPError) as refused:
        api(hub_server, hub_server.write_token).create_commit(
            REPO, [CommitOperationAdd("other.txt", b"x")], commit_message="late", parent_commit=first
        )
    assert refused.value.response.status_code == 412


def test_the_hubs_commit_rate_limit_is_enforced() -> None:
    with HubServer(commits_per_hour=3) as hub:
        hub.create_repo(REPO)  # the initial commit counts
        upload(hub, hub.write_token, b"1")
        upload(hub, hub.write_token, b"2")
        with pytest.raises(HfHubHTTPError) as limited:
            upload(hub, hub.write_token, b"3")
        assert limited.value.response.status_code == 429
        assert "rate limit for repository commits" in str(limited.value)


def test_outages_refuse_or_hang_then_recover(hub_server: HubServer) -> None:
    hub_server.create_repo(REPO)
    url = f"{hub_server.endpoint}/api/models/{REPO}"
    with hub_server.outage("refuse"), pytest.raises(httpx.TransportError):
        httpx.get(url)
    assert hub_server.refused_connections == 1
    with hub_server.outage("hang"), pytest.raises(httpx.ReadTimeout):
        httpx.get(url, timeout=httpx.Timeout(5.0, read=0.5))
    assert hub_server.hung_connections == 1
    assert httpx.get(url).status_code == 200


def test_it_records_what_it_received(hub_server: HubServer) -> None:
    hub_server.create_repo(REPO)
    upload(hub_server, hub_server.write_token, b"planted-value\n")
    commit = next(r for r in hub_server.received if r.path.endswith("/commit/main"))
    assert commit.carries("planted-value")  # found inside the base64 file content
    assert not commit.carries(hub_server.write_token)  # the token is in Authorization only, where it belongs
    assert commit.headers["authorization"] == f"Bearer {hub_server.write_token}"


# --- Spaces ---------------------------------------------------------------------------------------------


def ndjson_commit(hub: HubServer, repo: str, files: dict[str, bytes], token: str) -> httpx.Response:
    """A commit sent as the client sends one, without the client's own checks (validate-yaml, no-op skipping)."""
    lines = [{"key": "header", "value": {"summary": "raw commit"}}]
    lines += [
        {"key": "file", "value": {"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"}}
        for path, content in files.items()
    ]
    return httpx.post(
        f"{hub.endpoint}/api/spaces/{repo}/commit/main",
        content="\n".join(json.dumps(x) for x in lines),
        headers={"authorization": f"Bearer {token}", "content-type": "application/x-ndjson"},
    )


def commit_app(client: HfApi, files: dict[str, bytes], message: str = "the app") -> str:
    """One commit to SPACE through the real client (which asks validate-yaml first when README.md is in it)."""
    operations = [CommitOperationAdd(path, content) for path, content in files.items()]
    return client.create_commit(SPACE, operations, commit_message=message, repo_type="space").oid


def test_a_new_docker_space_has_the_hubs_readme_and_no_app_file(hub_server: HubServer) -> None:
    owner = api(hub_server, hub_server.write_token)
    url = owner.create_repo(SPACE, repo_type="space", space_sdk="docker", private=True)

    assert (url.repo_type, url.repo_id) == ("space", SPACE)
    runtime = owner.get_space_runtime(SPACE)
    assert (runtime.stage, runtime.hardware, runtime.requested_hardware) == ("NO_APP_FILE", None, "cpu-basic")
    assert runtime.raw["domains"] == [{"domain": "pod-owner-hello-space.hf.space", "stage": "READY"}]
    info = owner.space_info(SPACE)
    assert (info.sdk, info.private, info.card_data.sdk, info.runtime.stage) == ("docker", True, "docker", "NO_APP_FILE")
    assert owner.list_repo_files(SPACE, repo_type="space") == [".gitattributes", "README.md"]
    assert owner.create_repo(SPACE, repo_type="space", space_sdk="docker", exist_ok=True).repo_id == SPACE
    with pytest.raises(RepositoryNotFoundError):
        api(hub_server, hub_server.stranger_token).get_space_runtime(SPACE)


@pytest.mark.parametrize("sdk", ["docker", "gradio"])
def test_a_free_plan_cannot_create_a_space_that_runs_on_compute(hub_server: HubServer, sdk: str) -> None:
    free = api(hub_server, hub_server.free_token)
    with pytest.raises(HfHubHTTPError) as refused:
        free.create_repo("free-user/app", repo_type="space", space_sdk=sdk)
    assert refused.value.response.status_code == 402
    assert "requires a paid plan" in refused.value.server_message and "PRO" in refused.value.server_message

    free.create_repo("free-user/site", repo_type="space", space_sdk="static")  # static Spaces stay free
    assert free.space_info("free-user/site").sdk == "static"
    with pytest.raises(RepositoryNotFoundError):
        free.space_info("free-user/app")


def test_a_free_plan_cannot_turn_a_static_space_into_a_docker_one(hub_server: HubServer) -> None:
    hub_server.create_space("free-user/site", sdk="static")
    answer = ndjson_commit(hub_server, "free-user/site", {"README.md": CARD.encode()}, hub_server.free_token)
    assert answer.status_code == 402, answer.text
    assert hub_server.space("free-user/site").sdk == "static"


def test_whoami_tells_the_tokens_role(hub_server: HubServer) -> None:
    who = api(hub_server, hub_server.write_token).whoami()
    assert (who["type"], who["name"], who["orgs"]) == ("user", "pod-owner", [])
    assert who["auth"] == {"type": "access_token", "accessToken": {"displayName": "write", "role": "write"}}
    assert api(hub_server, hub_server.read_token).whoami()["auth"]["accessToken"]["role"] == "read"
    assert api(hub_server, hub_server.free_token).whoami()["isPro"] is False
    assert httpx.get(f"{hub_server.endpoint}/api/whoami-v2").status_code == 401
    with pytest.raises(HfHubHTTPError, match="Invalid user token"):
        api(hub_server, "hf_" + "x" * 34).whoami()


@pytest.mark.parametrize(
    ("card", "error"),
    [
        (CARD.replace("colorTo: gray", "colorTo: teal"), '"colorTo" must be one of'),
        (CARD.replace("sdk: docker\n", ""), '"sdk" is required'),
        (CARD.replace("sdk: docker", "sdk: flask"), '"sdk" is required and must be one of'),
        (CARD.replace("app_port: 7860", "app_port: http"), '"app_port" must be an integer'),
        (CARD.replace("short_description: hi", "short_description: " + "x" * 61), "at most 60 characters"),
        ("---\nsdk: [docker\n---\n", "Invalid YAML"),
        ("# no metadata at all\n", '"sdk" is required'),
    ],
)
def test_validate_yaml_refuses_what_the_hub_refuses_in_a_space_card(
    hub_server: HubServer, card: str, error: str
) -> None:
    hub_server.create_space(SPACE)
    with pytest.raises(ValueError, match=r"Invalid metadata in README\.md") as refused:
        commit_app(api(hub_server, hub_server.write_token), {"README.md": card.encode()})  # asks validate-yaml first
    assert error in str(refused.value)
    assert [r.status for r in hub_server.received if r.path == "/api/validate-yaml"] == [400]
    assert len(hub_server.commits(SPACE, "space")) == 1


def test_validate_yaml_accepts_a_good_card_and_warns_on_a_model_card_without_metadata(hub_server: HubServer) -> None:
    hub_server.create_space(SPACE)
    hub_server.create_repo(REPO)
    client = api(hub_server, hub_server.write_token)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        commit_app(client, {"README.md": (CARD + "# hello\n").encode()})
    with pytest.warns(UserWarning, match="empty or missing yaml metadata"):
        upload(hub_server, hub_server.write_token, b"# a model\n", "README.md")
    assert [r.status for r in hub_server.received if r.path == "/api/validate-yaml"] == [200, 200]


def test_a_commit_with_an_invalid_space_card_is_refused(hub_server: HubServer) -> None:
    hub_server.create_space(SPACE)
    client = api(hub_server, hub_server.write_token)
    bad = CARD.replace("colorFrom: indigo", "colorFrom: teal").encode()
    with pytest.raises(ValueError, match='"colorFrom" must be one of'):  # the client asks validate-yaml first
        commit_app(client, {"README.md": bad, "Dockerfile": DOCKERFILE})

    answer = ndjson_commit(hub_server, SPACE, {"README.md": bad}, hub_server.write_token)  # the commit route too
    assert answer.status_code == 400 and '"colorFrom" must be one of' in answer.json()["error"]
    assert len(hub_server.commits(SPACE, "space")) == 1
    assert hub_server.space_stage(SPACE) == "NO_APP_FILE"


def test_a_commit_to_a_docker_space_is_building_before_the_commit_returns(hub_server: HubServer) -> None:
    client = api(hub_server, hub_server.write_token)
    client.create_repo(SPACE, repo_type="space", space_sdk="docker", private=True)
    oid = commit_app(client, {"Dockerfile": DOCKERFILE, "hello.txt": b"hello\n"})

    assert client.get_space_runtime(SPACE).stage == "BUILDING"
    started = time.monotonic()
    lines = list(client.fetch_space_logs(SPACE, build=True))  # no-follow: ends once the replay went quiet
    assert lines == [f"Commit {oid[:7]}: no builder is attached to this test Hub, the Space stays BUILDING\n"]
    assert time.monotonic() - started < 15  # the client's 5 s read timeout ended it: the stream itself did not
    assert hub_server.space_stage(SPACE) == "BUILDING"


def test_an_identical_commit_still_rebuilds(hub_server: HubServer) -> None:
    hub_server.create_space(SPACE)
    files = {"Dockerfile": DOCKERFILE, "hello.txt": b"hello\n"}
    first = ndjson_commit(hub_server, SPACE, files, hub_server.write_token).json()["commitOid"]
    again = ndjson_commit(hub_server, SPACE, files, hub_server.write_token).json()["commitOid"]

    assert first != again
    assert hub_server.space_build_log(SPACE).startswith(f"Commit {again[:7]}: no builder")


def follow_build_log(client: HfApi) -> queue.Queue[str]:
    """Lines of `fetch_space_logs(follow=True)`, read by a thread the test abandons (the stream never ends)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        try:
            for line in client.fetch_space_logs(SPACE, build=True, follow=True):
                lines.put(line)
        except Exception as error:
            lines.put(f"{type(error).__name__}: {error}")

    threading.Thread(target=read, name="follow-build-log", daemon=True).start()
    return lines


def test_following_the_build_log_replays_then_waits_for_the_next_build(hub_server: HubServer) -> None:
    client = api(hub_server, hub_server.write_token)
    client.create_repo(SPACE, repo_type="space", space_sdk="docker")
    first = commit_app(client, {"Dockerfile": DOCKERFILE, "hello.txt": b"hello\n"})
    lines = follow_build_log(client)
    assert lines.get(timeout=10).startswith(f"Commit {first[:7]}: ")

    second = commit_app(client, {"hello.txt": b"hello again\n"}, "a second build")

    assert lines.get(timeout=10).startswith(f"Commit {second[:7]}: ")  # same stream: it did not close


@pytest.fixture
def event_stream(hub_server: HubServer) -> Iterator[httpx.Response]:
    """The raw build-log stream of a Space with one line, with keep-alives every 0.2 s."""
    hub_server.create_space(SPACE)
    hub_server.put_file(SPACE, "Dockerfile", DOCKERFILE, "space")
    hub_server.keepalive_s = 0.2
    headers = {"authorization": f"Bearer {hub_server.write_token}"}
    with httpx.stream(
        "GET", f"{hub_server.endpoint}/api/spaces/{SPACE}/logs/build", headers=headers, timeout=httpx.Timeout(10.0)
    ) as response:
        yield response


def test_the_build_log_is_server_sent_events_with_keep_alives_that_never_close(
    hub_server: HubServer, event_stream: httpx.Response
) -> None:
    assert event_stream.status_code == 200
    assert event_stream.headers["content-type"].startswith("text/event-stream")
    assert is_exact(event_stream.headers["date"])  # the client's no-follow read stops at events after Date + 1 s
    events = (line for line in event_stream.iter_lines() if line)

    replayed = json.loads(next(events).removeprefix("data: "))
    assert replayed["data"].endswith("no builder is attached to this test Hub, the Space stays BUILDING\n")
    assert parse_datetime(replayed["timestamp"]).year >= 2026
    assert next(events) == "data: "  # a keep-alive: nothing new, and the stream is still open
    oid = hub_server.put_file(SPACE, "hello.txt", "hello\n", "space")
    while (line := next(events)) == "data: ":
        pass
    assert json.loads(line.removeprefix("data: "))["data"].startswith(f"Commit {oid[:7]}: ")


def is_exact(http_date: str) -> bool:
    """Whether an HTTP date (whole seconds) is the current second, not one cached a second ago."""
    return 0 <= time.time() - parsedate_to_datetime(http_date).timestamp() < 1.05


@pytest.mark.parametrize(("who", "status"), [("anonymous", 401), ("another user", 404)])
def test_only_the_owner_reads_a_private_spaces_logs(hub_server: HubServer, who: str, status: int) -> None:
    hub_server.create_space(SPACE, private=True)
    token = {"anonymous": False, "another user": hub_server.stranger_token}[who]
    for build in (True, False):
        with pytest.raises(RepositoryNotFoundError) as refused:
            list(api(hub_server, token).fetch_space_logs(SPACE, build=build))
        assert refused.value.response.status_code == status


# --- a real build: a Docker engine and a registry -------------------------------------------------------


def report(request: pytest.FixtureRequest, line: str) -> None:
    """A measurement on the terminal, even without -s."""
    plugins = request.config.pluginmanager
    with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
        plugins.get_plugin("terminalreporter").write_line(f"[space build] {line}")


@pytest.mark.docker
@pytest.mark.timeout(900)
def test_a_real_builder_builds_the_committed_files_into_the_registry(
    hub_server: HubServer, registry: LocalRegistry, request: pytest.FixtureRequest
) -> None:
    client = api(hub_server, hub_server.write_token)
    with private_engine() as (_, engine):
        base = import_debian_base(engine)
        with SpaceBuilder(engine, registry.host, build_args={"BASE_IMAGE": base}, network_mode="host") as builder:
            hub_server.builder = builder
            client.create_repo(SPACE, repo_type="space", space_sdk="docker", private=True)
            started = time.monotonic()
            commit_app(client, {"Dockerfile": DOCKERFILE, "hello.txt": b"hello\n"})
            assert client.get_space_runtime(SPACE).stage == "BUILDING"

            assert hub_server.wait_for_build(SPACE, 600) == "RUNNING", hub_server.space_build_log(SPACE)
            report(request, f"commit -> RUNNING (built and pushed): {time.monotonic() - started:.1f} s")
            assert client.get_space_runtime(SPACE).stage == "RUNNING"
            assert IMAGE in registry.catalog() and registry.tags(IMAGE) == ["latest"]
            assert registry.manifest(IMAGE)["_digest"].startswith("sha256:")
            log = "".join(client.fetch_space_logs(SPACE, build=True))
            assert "Step 3/4 : COPY hello.txt /" in log and f"Pushed {registry.host}/{IMAGE}:latest" in log

            started = time.monotonic()
            client.create_commit(
                SPACE, [CommitOperationDelete("hello.txt")], commit_message="lose hello.txt", repo_type="space"
            )
            assert hub_server.wait_for_build(SPACE, 600) == "BUILD_ERROR"
            report(request, f"commit -> BUILD_ERROR: {time.monotonic() - started:.1f} s; builds: {builder.builds}")
    runtime = client.get_space_runtime(SPACE)
    assert "hello.txt" in runtime.raw["errorMessage"]
    lines = list(client.fetch_space_logs(SPACE, build=True))
    assert "COPY failed" in lines[-1] and "hello.txt" in lines[-1]
