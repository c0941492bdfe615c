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

New routes go in `HubApp.routes()`, one handler each: reading ones in hub_files.py, writing ones in
hub_commits.py; users, repos, commits and the shared checks are in hub_repos.py.
Use it through the `hub_server` fixture (registered in tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from tests.support.hub_commits import CommitRoutes
from tests.support.hub_files import FileRoutes
from tests.support.hub_repos import HUB_COMMITS_PER_HOUR, URL_PREFIX, Commit, HubState, Refusal, User, json_body
from tests.support.hub_spaces import Builder, SpaceView, check_readme, log_stream
from tests.support.hub_wire import DateHeader, Front, Received, Recorder, listening_socket

T = TypeVar("T")


class HubApp(FileRoutes, CommitRoutes):
    """The Starlette app: one handler per Hub route (reading in hub_files.py, writing in hub_commits.py)."""

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
            Route(api + "/settings", self.repo_settings, methods=["PUT"]),
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
        app = DateHeader(Recorder(self.asgi(), self.state.received, self.state.lock))
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

    def asgi(self) -> ASGIApp:
        """The app behind the recorder: the honest Hub (hub_lies.HostileHub puts a liar in front of it)."""
        return self.app.asgi()

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


POD_LOG_REPO, POD_CONFIG_REPO = f"{HubServer.owner}/pod-logs", f"{HubServer.owner}/pod-config"


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    """A test Hub for a module's pod: its log repo and config repo made, both private."""
    with HubServer() as server:
        server.create_repo(POD_LOG_REPO, private=True)
        server.create_repo(POD_CONFIG_REPO, private=True)
        yield server
