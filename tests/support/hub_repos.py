"""The test Hub's model: users and their tokens, repos and their commits, and the checks every route
shares (who the caller is, what they may read or write), with the Hub's error shape (`Refusal`).

The routes that read are in hub_files.py, those that write in hub_commits.py, the Spaces' in hub_spaces.py;
hub_server.py assembles them and serves them (see its docstring).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse

from tests.support.hub_spaces import (
    COMPUTE_SDKS,
    KEEPALIVE_S,
    PAID_PLAN,
    Builder,
    Notifier,
    SpaceState,
    check_readme,
    initial_readme,
    readme_sdk,
)
from tests.support.hub_wire import Received

KINDS = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub sends bigger (or binary) files to LFS
HUB_COMMITS_PER_HOUR = 128  # the Hub's limit for a free account ("rate limit for repository commits")
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


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


class HubRoutes:
    """What every group of routes shares: the state, and the URLs the server answers with."""

    def __init__(self, state: HubState) -> None:
        self.state = state
        self.endpoint = ""  # set once the server listens; used in the URLs it returns
        self.object_store = ""  # where LFS redirects point: set with the endpoint

    def repo_url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"
