"""A strict local stand-in for the Hugging Face Hub: exactly the routes `huggingface_hub` uses for what the
runtime does, answered the way the Hub answers, refusing what the Hub refuses.

Routes: create a repo, repo info (with its sha; sizes and LFS facts with `blobs=true`), tree listing, preupload +
NDJSON commit (small text files go "regular"; LFS/Xet uploads are refused as unsupported), and HEAD/GET
`resolve/<revision>/<path>` with the ETag and `X-Repo-Commit` headers the client relies on: an LFS file (a
safetensors or a big one, put there by `put_folder`) redirects to an object store, as the Hub does to its CDN;
both honour `Range` (a resumed download), and `throttle()` slows their bodies. Errors carry the `X-Error-Code` header that the client maps
to `RepositoryNotFoundError`, `RevisionNotFoundError` and `RemoteEntryNotFoundError`. Every request is recorded
(`received`, once its answer ended) so tests can assert on what reached "the Hub"; `outage()` refuses or hangs
connections. Also `whoami-v2` and `validate-yaml`, and Spaces (hub_spaces.py): creation (402 for a compute SDK
on a free plan), space info, runtime, and build logs as never-ending server-sent events. A commit to a Docker
Space goes to the attached `builder` (space_builder.SpaceBuilder: a real engine and registry).

New routes go in `HubApp.routes()`, one handler each.
Use it through the `hub_server` fixture (registered in tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.hub_spaces import (
    COMPUTE_SDKS,
    KEEPALIVE_S,
    PAID_PLAN,
    SDKS,
    Builder,
    Notifier,
    SpaceState,
    SpaceView,
    check_readme,
    initial_readme,
    log_stream,
    readme_sdk,
)
from tests.support.hub_wire import (
    DateHeader,
    Front,
    Received,
    Recorder,
    listening_socket,
)

KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub sends bigger (or binary) files to LFS
HUB_COMMITS_PER_HOUR = 128  # the Hub's limit for a free account ("rate limit for repository commits")
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
T = TypeVar("T")


def git_hash(content: bytes) -> str:
    """The git blob id: what the Hub serves as a regular file's ETag and preupload `oid`."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class Refusal(Exception):
    """An error answer, shaped like the Hub's: JSON `{"error": …}` plus `X-Error-Code`/`X-Error-Message`."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}

    def response(self) -> JSONResponse:
        headers = {"X-Error-Message": self.message, **self.headers}
        if self.code:
            headers["X-Error-Code"] = self.code
        return JSONResponse({"error": self.message}, self.status, headers=headers)


@dataclass(frozen=True)
class User:
    """The user a token belongs to, with that token's rights (`write`) and the account's plan (`paid`)."""

    name: str
    write: bool
    paid: bool = True  # PRO: may create Spaces that run on compute
    token_name: str = "token"

    def whoami(self) -> dict:
        """`GET /api/whoami-v2`, shaped as the Hub answers it for a user's access token."""
        return {
            "type": "user",
            "id": hashlib.md5(self.name.encode()).hexdigest()[:24],
            "name": self.name,
            "fullname": self.name.replace("-", " ").title(),
            "isPro": self.paid,
            "canPay": self.paid,
            "orgs": [],
            "auth": {
                "type": "access_token",
                "accessToken": {"displayName": self.token_name, "role": "write" if self.write else "read"},
            },
        }


@dataclass(frozen=True)
class Commit:
    oid: str
    message: str
    files: dict[str, bytes]
    at: float


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    owner: str
    private: bool
    commits: list[Commit] = field(default_factory=list)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def at(self, revision: str) -> Commit:
        if revision == "main":
            return self.head
        for commit in self.commits:
            if commit.oid == revision:
                return commit
        raise Refusal(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def add_commit(self, message: str, files: dict[str, bytes]) -> Commit:
        seed = f"{self.repo_id}\n{len(self.commits)}\n{message}\n{sorted((p, git_hash(c)) for p, c in files.items())}"
        commit = Commit(hashlib.sha1(seed.encode()).hexdigest(), message, files, time.time())
        self.commits.append(commit)
        return commit


def valid_path(path: object) -> str:
    """A repo path as the Hub accepts it: relative, no empty/`.`/`..` segment, nothing under `.git/`."""
    if not isinstance(path, str) or not path or len(path) > 1000 or path.startswith("/") or "\\" in path:
        raise Refusal(400, f"Invalid path: {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..", ".git") or "\0" in p for p in parts):
        raise Refusal(400, f"Invalid path: {path!r}")
    return path


class HubState:
    """Users, repos and commits, shared by the app (server thread) and the test (main thread)."""

    def __init__(self, users: dict[str, User], commits_per_hour: int) -> None:
        self.lock = threading.RLock()
        self.users = users
        self.repos: dict[tuple[str, str], Repo] = {}
        self.received: list[Received] = []
        self.lfs_objects: dict[str, bytes] = {}  # by sha256: what LFS redirects point to
        self.download_rate: float | None = None  # bytes/s for file bodies (HubServer.throttle); None: at once
        self.commits_per_hour = commits_per_hour
        self.spaces: dict[str, SpaceState] = {}
        self.notifier = Notifier()  # wakes the log streams; closed when the server stops
        self.builder: Builder | None = None
        self.keepalive_s = KEEPALIVE_S

    def user(self, request: Request) -> User | None:
        """The caller: None when anonymous; a token the Hub does not know is refused outright."""
        header = request.headers.get("authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        user = self.users.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise Refusal(401, "Invalid credentials in Authorization header")
        return user

    def readable(self, request: Request, repo_type: str, repo_id: str) -> Repo:
        user = self.user(request)
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and (user is None or user.name != repo.owner)):
            # Like the Hub: a private repo is indistinguishable from a missing one; 401 when anonymous.
            raise Refusal(401 if user is None else 404, "Repository not found", "RepoNotFound")
        return repo

    def writable(self, request: Request, repo_type: str, repo_id: str, revision: str) -> Repo:
        user = self.user(request)
        if user is None:
            raise Refusal(401, "You must be authenticated to write to a repository")
        repo = self.readable(request, repo_type, repo_id)
        if not user.write:
            raise Refusal(403, "This token is read-only: writing needs a token with write access")
        if user.name != repo.owner:
            raise Refusal(403, f"You don't have the rights to write to {repo_id}")
        if revision != "main":
            raise Refusal(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo

    def create(
        self, repo_id: str, repo_type: str, owner: str, private: bool, files: dict[str, bytes] | None = None
    ) -> Repo:
        repo = Repo(repo_id, repo_type, owner, private)
        repo.add_commit("initial commit", {".gitattributes": GITATTRIBUTES, **(files or {})})
        self.repos[(repo_type, repo_id)] = repo
        return repo

    def create_space(
        self,
        repo_id: str,
        private: bool,
        sdk: str,
        variables: dict[str, str] | None = None,
        hardware: str | None = None,
    ) -> Repo:
        """A Space: its initial commit holds the Hub's README.md (a card naming the SDK); nothing to run yet."""
        readme = initial_readme(repo_id.split("/")[1], sdk)
        repo = self.create(repo_id, "space", repo_id.split("/")[0], private, {"README.md": readme})
        self.spaces[repo_id] = SpaceState(repo_id, sdk, self.notifier, variables, hardware)
        return repo

    def readable_space(self, request: Request) -> SpaceState:
        """The Space a `/api/spaces/{namespace}/{name}/…` route names, if the caller may read it (401/404 if not)."""
        params = request.path_params
        return self.spaces[self.readable(request, "space", f"{params['namespace']}/{params['name']}").repo_id]

    def check_space_commit(self, repo: Repo, files: dict[str, bytes], user: User) -> None:
        """A Space's README.md must stay valid metadata, and may not turn it into a compute Space on a free plan."""
        readme = files.get("README.md")
        if repo.repo_type != "space" or readme is None:
            return
        errors, _ = check_readme(readme.decode("utf-8", "replace"), "space")
        if errors:
            raise Refusal(400, f"Invalid metadata in README.md: {'; '.join(errors)}")
        sdk = readme_sdk(readme)
        if sdk != self.spaces[repo.repo_id].sdk and sdk in COMPUTE_SDKS and not user.paid:
            raise Refusal(402, PAID_PLAN.format(sdk=sdk.capitalize()))

    def committed(self, repo: Repo, commit: Commit) -> None:
        """After every commit: a Space reacts to it (a Docker Space's build starts before the commit answers)."""
        if repo.repo_type == "space":
            self.spaces[repo.repo_id].committed(commit.oid, commit.files, self.builder)


def repo_ref(request: Request) -> tuple[str, str]:
    """(repo type, repo id) from the route's `kind`/`namespace`/`name`; 404 for an unknown kind."""
    params = request.path_params
    kind = params.get("kind", "models")
    if kind not in KINDS:
        raise Refusal(404, "Not Found")
    return KINDS[kind], f"{params['namespace']}/{params['name']}"


def decode_base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise Refusal(400, "Invalid base64 content") from None


async def json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise Refusal(400, "Invalid JSON body") from None
    if not isinstance(body, dict):
        raise Refusal(400, "Expected a JSON object")
    return body


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


class HubApp:
    """The Starlette app: one handler per Hub route."""

    def __init__(self, state: HubState) -> None:
        self.state = state
        self.endpoint = ""  # set once the server listens; used in the URLs it returns
        self.object_store = ""  # where LFS redirects point: set with the endpoint

    def routes(self) -> list[Route]:
        api = "/api/{kind}/{namespace}/{name}"
        resolve = "/{namespace}/{name}/resolve/{revision}/{path:path}"
        space = "/api/spaces/{namespace}/{name}"
        return [
            Route("/api/whoami-v2", self.whoami, methods=["GET"]),
            Route("/api/validate-yaml", self.validate_yaml, methods=["POST"]),
            Route("/api/repos/create", self.create_repo, methods=["POST"]),
            Route(space + "/runtime", self.space_runtime, methods=["GET"]),
            Route(space + "/logs/{which}", self.space_logs, methods=["GET"]),
            Route(api, self.repo_info, methods=["GET"]),
            Route(api + "/revision/{revision}", self.repo_info, methods=["GET"]),
            Route(api + "/preupload/{revision}", self.preupload, methods=["POST"]),
            Route(api + "/commit/{revision}", self.commit, methods=["POST"]),
            Route(api + "/tree/{revision}", self.tree, methods=["GET"]),
            Route(api + "/tree/{revision}/{path:path}", self.tree, methods=["GET"]),
            Route("/datasets" + resolve, self.resolve, methods=["GET", "HEAD"]),
            Route("/spaces" + resolve, self.resolve, methods=["GET", "HEAD"]),
            Route(resolve, self.resolve, methods=["GET", "HEAD"]),
            Route("/lfs-objects/{sha256}", self.lfs_object, methods=["GET", "HEAD"]),
        ]

    def asgi(self) -> Starlette:
        async def refusal(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, Refusal)
            return exc.response()

        return Starlette(routes=self.routes(), exception_handlers={Refusal: refusal})

    def repo_url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"

    async def whoami(self, request: Request) -> Response:
        with self.state.lock:
            user = self.state.user(request)
        if user is None:
            raise Refusal(401, "Invalid username or password.")
        return JSONResponse(user.whoami())

    async def validate_yaml(self, request: Request) -> Response:
        """A README's metadata checked as the Hub checks it before a commit: 400 with `errors`, or 200."""
        body = await json_body(request)
        with self.state.lock:
            self.state.user(request)  # anonymous is fine; a token the Hub does not know is not
        content, repo_type = body.get("content"), body.get("repoType", "model")
        if not isinstance(content, str) or repo_type not in URL_PREFIX:
            raise Refusal(400, "Expected {content: string, repoType: model|dataset|space}")
        errors, warnings = check_readme(content, repo_type)
        return JSONResponse(
            {"errors": [{"message": m} for m in errors], "warnings": [{"message": m} for m in warnings]},
            400 if errors else 200,
        )

    async def create_repo(self, request: Request) -> Response:
        body = await json_body(request)
        with self.state.lock:
            user = self.state.user(request)
            if user is None:
                raise Refusal(401, "You must be authenticated to create a repository")
            repo_type, owner, private = new_repo(body, user)
            repo_id = f"{owner}/{body['name']}"
            existing = self.state.repos.get((repo_type, repo_id))
            if existing is not None:
                return JSONResponse({"error": "You already created this repo", "url": self.repo_url(existing)}, 409)
            if repo_type == "space":
                repo = self.state.create_space(repo_id, private, *new_space(body, user))
            else:
                repo = self.state.create(repo_id, repo_type, owner, private)
            return JSONResponse({"url": self.repo_url(repo), "name": repo.repo_id, "id": repo.repo_id})

    async def repo_info(self, request: Request) -> Response:
        with self.state.lock:
            repo = self.state.readable(request, *repo_ref(request))
            commit = repo.at(request.path_params.get("revision", "main"))
            info = {
                "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
                "id": repo.repo_id,
                "author": repo.owner,
                "sha": commit.oid,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "lastModified": iso(commit.at),
                "createdAt": iso(repo.commits[0].at),
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": [
                    sibling(path, commit.files[path], request.query_params.get("blobs") == "true")
                    for path in sorted(commit.files)
                ],
            }
            if repo.repo_type == "space":
                info |= self.state.spaces[repo.repo_id].info(commit.files.get("README.md"))
            return JSONResponse(info)

    async def space_runtime(self, request: Request) -> Response:
        with self.state.lock:
            space = self.state.readable_space(request)
        return JSONResponse(space.runtime())

    async def space_logs(self, request: Request) -> Response:
        """The build (or run) log as the Hub serves it: server-sent events on a stream that never ends."""
        which = request.path_params["which"]
        if which not in ("build", "run"):
            raise Refusal(404, "Not Found")
        with self.state.lock:
            space = self.state.readable_space(request)
        current = (lambda: space.log) if which == "build" else (lambda: space.run_log)
        events = log_stream(current, self.state.notifier, self.state.keepalive_s)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def preupload(self, request: Request) -> Response:
        body = await json_body(request)
        with self.state.lock:
            repo = self.state.writable(request, *repo_ref(request), request.path_params["revision"])
            files = body.get("files")
            if not isinstance(files, list) or not files:
                raise Refusal(400, "Expected a non-empty list of files")
            answers = []
            for entry in files:
                if not isinstance(entry, dict):
                    raise Refusal(400, f"Invalid file entry: {entry!r}")
                path, size, sample = entry.get("path"), entry.get("size"), entry.get("sample")
                if not isinstance(size, int) or size < 0 or not isinstance(sample, str):
                    raise Refusal(400, f"Invalid file entry: {entry!r}")
                binary = b"\0" in decode_base64(sample)
                mode = "lfs" if size >= LFS_THRESHOLD or binary else "regular"
                answer = {"path": valid_path(path), "uploadMode": mode, "shouldIgnore": False}
                if mode == "regular" and path in repo.head.files:
                    answer["oid"] = git_hash(repo.head.files[path])
                answers.append(answer)
            return JSONResponse({"files": answers, "commitOid": repo.head.oid})

    async def commit(self, request: Request) -> Response:
        if not request.headers.get("content-type", "").startswith("application/x-ndjson"):
            raise Refusal(400, "Expected an application/x-ndjson body")
        if request.query_params.get("create_pr") or request.query_params.get("hot_reload"):
            raise Refusal(501, "Pull requests and hot reload are not implemented by this test server")
        lines = [line for line in (await request.body()).splitlines() if line.strip()]
        try:
            items = [json.loads(line) for line in lines]
        except ValueError:
            raise Refusal(400, "Invalid NDJSON body") from None
        with self.state.lock:
            repo = self.state.writable(request, *repo_ref(request), request.path_params["revision"])
            files = self.apply(repo, items)
            self.state.check_space_commit(repo, files, self.state.user(request))
            recent = [c for c in repo.commits if c.at > time.time() - 3600]
            if len(recent) >= self.state.commits_per_hour:
                raise Refusal(
                    429,
                    f"You have exceeded the rate limit for repository commits "
                    f"({self.state.commits_per_hour} per hour).",
                )
            commit = repo.add_commit(items[0]["value"]["summary"], files)
            self.state.committed(repo, commit)
            return JSONResponse(
                {
                    "success": True,
                    "commitOid": commit.oid,
                    "hookOutput": "",
                    "commitUrl": f"{self.repo_url(repo)}/commit/{commit.oid}",
                }
            )

    @staticmethod
    def apply(repo: Repo, items: list) -> dict[str, bytes]:
        """The files after a commit's operations, refusing a malformed or impossible one (nothing applied)."""
        if not items or not isinstance(items[0], dict) or items[0].get("key") != "header":
            raise Refusal(400, "The first line must be the commit header")
        header = items[0].get("value") or {}
        if not isinstance(header.get("summary"), str) or not header["summary"].strip():
            raise Refusal(400, "The commit summary must not be empty")
        if header.get("parentCommit") not in (None, repo.head.oid):
            raise Refusal(412, "A commit has happened since. Please refresh and try again.")
        files = dict(repo.head.files)
        for item in items[1:]:
            key, value = (item.get("key"), item.get("value")) if isinstance(item, dict) else (None, None)
            if not isinstance(value, dict):
                raise Refusal(400, f"Invalid operation: {item!r}")
            path = valid_path(value.get("path"))
            if key == "file":
                if value.get("encoding") != "base64" or not isinstance(value.get("content"), str):
                    raise Refusal(400, f"Invalid file operation for {path}")
                files[path] = decode_base64(value["content"])
            elif key == "deletedFile":
                if files.pop(path, None) is None:
                    raise Refusal(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            elif key == "deletedFolder":
                files = {p: c for p, c in files.items() if not p.startswith(path.rstrip("/") + "/")}
            elif key == "lfsFile":
                raise Refusal(501, "LFS files are not implemented by this test server")
            else:
                raise Refusal(400, f"Unknown operation {key!r}")
        return files

    async def tree(self, request: Request) -> Response:
        with self.state.lock:
            repo = self.state.readable(request, *repo_ref(request))
            commit = repo.at(request.path_params["revision"])
            folder = request.path_params.get("path", "").strip("/")
            recursive = request.query_params.get("recursive", "").lower() in ("1", "true")
            entries = tree_entries(commit.files, folder, recursive)
            if folder and not entries:
                raise Refusal(404, f"{folder} does not exist on main", "EntryNotFound")
            return JSONResponse(entries)

    async def resolve(self, request: Request) -> Response:
        """A file at a revision: a regular one served here (a `Range` honoured); an LFS one (see `is_lfs`)
        answered, as the Hub does, by a redirect to the object store with `X-Linked-Etag`/`X-Linked-Size`."""
        with self.state.lock:
            repo_type = "dataset" if request.url.path.startswith("/datasets/") else "model"
            if request.url.path.startswith("/spaces/"):
                repo_type = "space"
            params = request.path_params
            repo = self.state.readable(request, repo_type, f"{params['namespace']}/{params['name']}")
            commit = repo.at(params["revision"])
            content = commit.files.get(params["path"])
        headers = {"X-Repo-Commit": commit.oid}
        if content is None:
            raise Refusal(404, "Entry not found", "EntryNotFound", headers)
        if is_lfs(params["path"], content):
            sha256 = hashlib.sha256(content).hexdigest()
            with self.state.lock:
                self.state.lfs_objects[sha256] = content
            headers |= {
                "ETag": f'"{git_hash(lfs_pointer(content))}"',
                "X-Linked-Etag": f'"{sha256}"',
                "X-Linked-Size": str(len(content)),
                "Location": f"{self.object_store}/{sha256}",
            }
            return Response(status_code=302, headers=headers)
        headers |= {"ETag": f'"{git_hash(content)}"', "Content-Type": "text/plain; charset=utf-8"}
        return self.file_response(request, content, headers)

    async def lfs_object(self, request: Request) -> Response:
        """The object store an LFS redirect points to (the Hub's CDN): bytes by sha256, no auth, ranges honoured."""
        with self.state.lock:
            content = self.state.lfs_objects.get(request.path_params["sha256"])
        if content is None:
            raise Refusal(404, "Not Found")
        return self.file_response(request, content, {"ETag": f'"{request.path_params["sha256"]}"'})

    def file_response(self, request: Request, content: bytes, headers: dict[str, str]) -> Response:
        """The bytes asked for: all (200), or from a `Range: bytes=N-[M]` on (206 with `Content-Range`; 416 past
        the end), sent at `HubServer.throttle`'s pace when one is set."""
        start, end, status = 0, len(content), 200
        if match := re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("range", "")):
            start, end, status = int(match[1]), min(int(match[2] or len(content) - 1) + 1, len(content)), 206
            if start >= len(content):
                return Response(status_code=416, headers={"Content-Range": f"bytes */{len(content)}"})
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(content)}"
        headers |= {"Content-Length": str(end - start), "Accept-Ranges": "bytes"}
        headers.setdefault("Content-Type", "application/octet-stream")
        if request.method == "HEAD":
            return Response(b"", status, headers=headers)
        rate = self.state.download_rate
        if rate is None:
            return Response(content[start:end], status, headers=headers)
        return StreamingResponse(paced(content[start:end], rate), status, headers=headers)


def is_lfs(path: str, content: bytes) -> bool:
    """Whether the Hub keeps a file in LFS: the `.gitattributes` patterns (safetensors), or a big file."""
    return path.endswith(".safetensors") or len(content) >= LFS_THRESHOLD


def lfs_pointer(content: bytes) -> bytes:
    """The git-lfs pointer file that stands in the repo for an LFS file."""
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(content).hexdigest()}\n"
        f"size {len(content)}\n"
    ).encode()


def sibling(path: str, content: bytes, blobs: bool) -> dict:
    """One entry of a repo info's `siblings`; with `blobs=true` (files_metadata), its size, blob id and LFS facts."""
    if not blobs:
        return {"rfilename": path}
    if not is_lfs(path, content):
        return {"rfilename": path, "size": len(content), "blobId": git_hash(content)}
    pointer = lfs_pointer(content)
    return {
        "rfilename": path,
        "size": len(content),
        "blobId": git_hash(pointer),
        "lfs": {"size": len(content), "sha256": hashlib.sha256(content).hexdigest(), "pointerSize": len(pointer)},
    }


async def paced(content: bytes, rate: float, piece: int = 16 * 1024) -> AsyncIterator[bytes]:
    """`content` in pieces, at `rate` bytes/s on average (a slow link, for tests that stop a download midway)."""
    for offset in range(0, len(content), piece):
        yield content[offset : offset + piece]
        await asyncio.sleep(piece / rate)


def new_repo(body: dict, user: User) -> tuple[str, str, bool]:
    """(type, owner, private) of a repo to create, refusing a bad name, type or visibility, or another's namespace."""
    name, owner = body.get("name"), body.get("organization") or user.name
    repo_type, visibility = body.get("type") or "model", body.get("visibility", "public")
    if not isinstance(name, str) or not NAME.fullmatch(name) or not NAME.fullmatch(owner):
        raise Refusal(400, f"Invalid repo name: {owner}/{name}")
    if repo_type not in URL_PREFIX:
        raise Refusal(400, f"Invalid repo type: {repo_type!r}")
    if visibility not in ("public", "private", *(("protected",) if repo_type == "space" else ())):
        raise Refusal(400, f"Invalid visibility: {visibility!r}")
    if not user.write or owner != user.name:
        raise Refusal(403, f"You don't have the rights to create a {repo_type} under the namespace {owner}")
    return repo_type, owner, visibility != "public"


def new_space(body: dict, user: User) -> tuple[str, dict[str, str], str | None]:
    """(sdk, variables, hardware) of a Space to create; 402 for a compute SDK on a free plan, like the Hub."""
    sdk, variables = body.get("sdk"), body.get("variables") or []
    if sdk not in SDKS:
        raise Refusal(400, f"Invalid sdk {sdk!r}: a Space needs one of {', '.join(SDKS)}")
    if body.get("template") or body.get("volumes"):
        raise Refusal(501, "Space templates and volumes are not implemented by this test server")
    if not isinstance(variables, list) or not all(
        isinstance(v, dict) and isinstance(v.get("key"), str) and isinstance(v.get("value"), str) for v in variables
    ):
        raise Refusal(400, "Invalid variables: expected [{key, value, description?}]")
    if not isinstance(body.get("hardware") or "", str):
        raise Refusal(400, f"Invalid hardware: {body['hardware']!r}")
    if sdk in COMPUTE_SDKS and not user.paid:
        raise Refusal(402, PAID_PLAN.format(sdk=sdk.capitalize()))
    return sdk, {v["key"]: v["value"] for v in variables}, body.get("hardware")


def tree_entries(files: dict[str, bytes], folder: str, recursive: bool) -> list[dict]:
    """The Hub's tree listing of `folder`: files and sub-folders, direct children unless `recursive`."""
    prefix = f"{folder}/" if folder else ""
    entries: dict[str, dict] = {}
    for path, content in sorted(files.items()):
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
            sub = prefix + "/".join(parts[:depth])
            entries.setdefault(
                sub, {"type": "directory", "oid": hashlib.sha1(sub.encode()).hexdigest(), "size": 0, "path": sub}
            )
        if recursive or len(parts) == 1:
            entries[path] = {"type": "file", "oid": git_hash(content), "size": len(content), "path": path}
    return list(entries.values())


class HubServer:
    """The test Hub, served from a background thread on 127.0.0.1 (free ports), with users and tokens ready.

    `pod-owner` (a paid plan) holds `write_token` and `read_token`; `stranger_token` is another paid user's;
    `free_token` is `free-user`'s, with write access but a free plan (no Spaces that run on compute).
    """

    owner = "pod-owner"
    free_user = "free-user"

    def __init__(self, commits_per_hour: int = HUB_COMMITS_PER_HOUR) -> None:
        # Tokens shaped like real ones, so a leak of them would also be caught by shape.
        self.write_token = f"hf_{secrets.token_hex(17)}"
        self.read_token = f"hf_{secrets.token_hex(17)}"
        self.stranger_token = f"hf_{secrets.token_hex(17)}"
        self.free_token = f"hf_{secrets.token_hex(17)}"
        users = {
            self.write_token: User(self.owner, True, token_name="write"),
            self.read_token: User(self.owner, False, token_name="read"),
            self.stranger_token: User("stranger", True, token_name="write"),
            self.free_token: User(self.free_user, True, paid=False, token_name="write"),
        }
        self.state = HubState(users, commits_per_hour)
        self.app = HubApp(self.state)
        self.endpoint = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._front: Front | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> HubServer:
        front_sock, app_sock = listening_socket(), listening_socket()
        self.endpoint = self.app.endpoint = f"http://127.0.0.1:{front_sock.getsockname()[1]}"
        # Another origin, as the Hub's CDN is: the client follows no redirect there with its token.
        self.app.object_store = f"http://127.0.0.1:{app_sock.getsockname()[1]}/lfs-objects"
        ready = threading.Event()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(front_sock, app_sock, ready),), name="hub-server", daemon=True
        )
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the test Hub did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.notifier.close()  # the log streams end: nothing else ever closes them
        self._call(self._stop.set)
        self._thread.join(30)

    async def _serve(self, front_sock: socket.socket, app_sock: socket.socket, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._front = Front(app_sock.getsockname()[1])
        app = DateHeader(Recorder(self.app.asgi(), self.state.received, self.state.lock))
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", date_header=False, timeout_graceful_shutdown=5
        )
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve(sockets=[app_sock]))
        front = await asyncio.start_server(self._front.handle, sock=front_sock)
        while not server.started:
            await asyncio.sleep(0.01)
        ready.set()
        await self._stop.wait()
        self._front.set_mode(None)
        front.close()
        server.should_exit = True
        await serving

    def _call(self, fn: Callable[..., T], *args: object) -> T:
        """Runs `fn` in the server's loop (where the outage state lives) and returns its result."""

        async def call() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    # --- what tests use ---

    def env(self, token: str | None = None) -> dict[str, str]:
        """The variables that point the real client here (as the owner, with a write token, by default)."""
        return {"HF_ENDPOINT": self.endpoint, "HF_TOKEN": token or self.write_token}

    @contextlib.contextmanager
    def outage(self, mode: str = "refuse") -> Iterator[None]:
        """Within the block, connections are reset at once (`refuse`) or held unanswered (`hang`)."""
        assert mode in ("refuse", "hang")
        self._call(self._front.set_mode, mode)
        try:
            yield
        finally:
            self._call(self._front.set_mode, None)

    @property
    def commits_per_hour(self) -> int:
        """The Hub's commit rate limit per repo; lower it to see 429s, raise it to lift them."""
        return self.state.commits_per_hour

    @commits_per_hour.setter
    def commits_per_hour(self, value: int) -> None:
        with self.state.lock:
            self.state.commits_per_hour = value

    @property
    def refused_connections(self) -> int:
        return self._front.refused

    @property
    def hung_connections(self) -> int:
        return self._front.hung

    def create_repo(self, repo_id: str, repo_type: str = "model", private: bool = False) -> None:
        if repo_type == "space":
            return self.create_space(repo_id, private=private)
        with self.state.lock:
            self.state.create(repo_id, repo_type, repo_id.split("/")[0], private)

    def create_space(self, repo_id: str, sdk: str = "docker", private: bool = False) -> None:
        """A Space as the Hub creates it (test setup: no plan check), with the Hub's initial README.md."""
        with self.state.lock:
            self.state.create_space(repo_id, private, sdk)

    def put_file(self, repo_id: str, path: str, content: bytes | str, repo_type: str = "model") -> str:
        """Commits one file directly (test setup, as if someone pushed it; a Space builds it); returns the commit id."""
        with self.state.lock:
            repo = self.state.repos[(repo_type, repo_id)]
            data = content.encode() if isinstance(content, str) else content
            commit = repo.add_commit(f"Upload {path}", {**repo.head.files, path: data})
            self.state.committed(repo, commit)
            return commit.oid

    def put_folder(self, repo_id: str, folder: Path) -> str:
        """Commits every file under `folder` at once (test setup: a model pushed with git and git-lfs)."""
        files = {
            str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()
        }
        with self.state.lock:
            repo = self.state.repos[("model", repo_id)]
            commit = repo.add_commit("Upload folder", {**repo.head.files, **files})
            self.state.committed(repo, commit)
            return commit.oid

    @contextlib.contextmanager
    def throttle(self, bytes_per_s: float) -> Iterator[None]:
        """Within the block, file bodies begun are sent at `bytes_per_s` (they keep that pace to their end)."""
        self.state.download_rate = bytes_per_s
        try:
            yield
        finally:
            self.state.download_rate = None

    def file(self, repo_id: str, path: str, repo_type: str = "model") -> bytes | None:
        with self.state.lock:
            repo = self.state.repos.get((repo_type, repo_id))
            return None if repo is None else repo.head.files.get(path)

    def commits(self, repo_id: str, repo_type: str = "model") -> list[Commit]:
        with self.state.lock:
            repo = self.state.repos.get((repo_type, repo_id))
            return [] if repo is None else list(repo.commits)

    @property
    def received(self) -> list[Received]:
        with self.state.lock:
            return list(self.state.received)

    # --- Spaces ---

    @property
    def builder(self) -> Builder | None:
        """What builds a Docker Space's commits (space_builder.SpaceBuilder); None: Spaces stay BUILDING."""
        return self.state.builder

    @builder.setter
    def builder(self, builder: Builder | None) -> None:
        with self.state.lock:
            self.state.builder = builder

    @property
    def keepalive_s(self) -> float:
        """Seconds without a log line before a log stream sends an empty event (the client's no-follow
        read ends after 5 s of silence, so below that it never ends while the Space is quiet)."""
        return self.state.keepalive_s

    @keepalive_s.setter
    def keepalive_s(self, value: float) -> None:
        self.state.keepalive_s = value

    def space(self, repo_id: str) -> SpaceView:
        """The Space now: sdk, private, stage, error and its current build's log (KeyError if missing)."""
        with self.state.lock:
            repo = self.state.repos[("space", repo_id)]
            return self.state.spaces[repo_id].view(repo.private)

    def space_stage(self, repo_id: str) -> str:
        return self.space(repo_id).stage

    def space_build_log(self, repo_id: str) -> str:
        """The current build's log, every line with its newline."""
        return self.space(repo_id).log

    def space_files(self, repo_id: str) -> dict[str, bytes]:
        """The Space's files at its head commit."""
        with self.state.lock:
            return dict(self.state.repos[("space", repo_id)].head.files)

    def wait_for_build(self, repo_id: str, timeout_s: float = 600) -> str:
        """Waits for the Space's latest build to end (the builder signals it: no polling); returns its stage."""
        with self.state.lock:
            space = self.state.spaces[repo_id]
        return space.settled_stage(timeout_s)


@pytest.fixture
def hub_server() -> Iterator[HubServer]:
    """A fresh test Hub for one test; the owner `pod-owner` holds `write_token` and `read_token` (see HubServer)."""
    with HubServer() as server:
        yield server
