"""A hostile Hub, for tests of what the runtime takes on trust: the strict test Hub (hub_server.HubServer)
behind a liar that, for one repo, answers a forged revision (repo info's `sha`, the `X-Repo-Commit` header)
and forged listed sizes (repo info's siblings, tree entries), while the bytes it serves stay the true ones.

A request naming the forged revision reaches the honest Hub as a request for the head commit, so everything
else is still checked as the Hub checks it. Use it as `with HostileHub(Lies(repo, sha=…, sizes=…)) as hub:`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.support.hub_server import HubServer


@dataclass(frozen=True)
class Lies:
    """What the hostile Hub says about the model repo `repo_id`: its head's sha, and sizes listed by path."""

    repo_id: str
    sha: str | None = None
    sizes: Mapping[str, int] = field(default_factory=dict)


class HostileHub(HubServer):
    """The test Hub with a liar in front: `received` still records what the client really sent."""

    def __init__(self, lies: Lies) -> None:
        super().__init__()
        self.lies = lies

    def asgi(self) -> ASGIApp:
        return Liar(super().asgi(), self.lies, self.head)

    def head(self) -> str:
        """The repo's true head commit, which the forged sha stands for."""
        with self.state.lock:
            return self.state.repos[("model", self.lies.repo_id)].head.oid


class Liar:
    """ASGI middleware: the forged sha in a request's path becomes the true head; in an answer about the repo,
    the true head becomes the forged sha and the listed sizes become the forged ones."""

    def __init__(self, app: ASGIApp, lies: Lies, head: Callable[[], str]) -> None:
        self.app, self.lies, self.head = app, lies, head

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.lies.repo_id not in scope["path"]:
            return await self.app(scope, receive, send)
        head = self.head()
        start: Message = {}
        body = bytearray()

        async def lying_send(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = {**message, "headers": [self.header(k, v, head) for k, v in message.get("headers", [])]}
                if not is_json(start):
                    await send(start)
            elif not is_json(start):
                await send(message)
            else:  # a JSON answer is rewritten whole, once its last piece came
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    lied = json.dumps(self.document(json.loads(body), head)).encode()
                    headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                    await send({**start, "headers": [*headers, (b"content-length", str(len(lied)).encode())]})
                    await send({"type": "http.response.body", "body": lied})

        await self.app(self.request(scope, head), receive, lying_send)

    def request(self, scope: Scope, head: str) -> Scope:
        """The request as the honest Hub sees it: the forged revision (URL-quoted, as sent) made the head."""
        forged = quote(self.lies.sha or "", safe="").encode()
        if not self.lies.sha or forged not in scope["raw_path"]:
            return scope
        raw = scope["raw_path"].replace(forged, head.encode())
        return {**scope, "raw_path": raw, "path": unquote(raw.decode("latin-1"))}

    def header(self, name: bytes, value: bytes, head: str) -> tuple[bytes, bytes]:
        if self.lies.sha and name.lower() == b"x-repo-commit" and value.decode("latin-1") == head:
            return name, self.lies.sha.encode()
        return name, value

    def document(self, document: object, head: str) -> object:
        """A repo info (`sha`, `siblings`) or a tree listing (a list of entries), with the lies told."""
        if isinstance(document, dict):
            if self.lies.sha and document.get("sha") == head:
                document["sha"] = self.lies.sha
            for sibling in document.get("siblings") or []:
                self.resize(sibling, sibling.get("rfilename"))
        elif isinstance(document, list):
            for entry in document:
                self.resize(entry, entry.get("path"))
        return document

    def resize(self, entry: dict, path: object) -> None:
        if isinstance(path, str) and path in self.lies.sizes and "size" in entry:
            entry["size"] = self.lies.sizes[path]
            if isinstance(entry.get("lfs"), dict):
                entry["lfs"]["size"] = self.lies.sizes[path]


def is_json(start: Message) -> bool:
    """Whether an answer's start says JSON (what repo info and tree listings answer)."""
    headers = dict(start.get("headers", []))
    return headers.get(b"content-type", b"").startswith(b"application/json")
