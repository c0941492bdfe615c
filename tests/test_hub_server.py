"""The test Hub itself: it answers the real huggingface_hub client as the Hub does, and refuses what the Hub refuses."""

from __future__ import annotations

import json

import httpx
import pytest
from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_url
from huggingface_hub.errors import (
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.support.hub_server import HubServer, git_hash

REPO = "pod-owner/logs"


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
    token = {"anonymous": False, "read-only token": hub_server.read_token,
             "another user": hub_server.stranger_token}[who]
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
    for token, repo in [(hub_server.write_token, "pod-owner/missing"), (False, REPO),
                        (hub_server.stranger_token, REPO)]:
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


@pytest.mark.parametrize(("path", "content"), [
    ("../escape", "eA=="), ("/abs", "eA=="), ("a//b", "eA=="), ("a/./b", "eA=="), (".git/config", "eA=="),
    ("a\\b", "eA=="), ("", "eA=="), ("fine.txt", "not base64!"),
])
def test_invalid_commits_are_refused(hub_server: HubServer, path: str, content: str) -> None:
    hub_server.create_repo(REPO)
    lines = [{"key": "header", "value": {"summary": "x"}},
             {"key": "file", "value": {"path": path, "content": content, "encoding": "base64"}}]
    answer = httpx.post(f"{hub_server.endpoint}/api/models/{REPO}/commit/main",
                        content="\n".join(json.dumps(line) for line in lines),
                        headers={"authorization": f"Bearer {hub_server.write_token}",
                                 "content-type": "application/x-ndjson"})
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
            REPO, [CommitOperationAdd("other.txt", b"x")], commit_message="late", parent_commit=first)
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
    with hub_server.outage("refuse"):
        with pytest.raises(httpx.TransportError):
            httpx.get(url)
    assert hub_server.refused_connections == 1
    with hub_server.outage("hang"):
        with pytest.raises(httpx.ReadTimeout):
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
