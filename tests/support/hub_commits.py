"""The test Hub's writing routes: creating a repo (a Space included), preupload, and NDJSON commits
(small text files go "regular"; LFS/Xet uploads are refused as unsupported), with the Hub's commit rate limit."""

from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.support.hub_repos import (
    LFS_THRESHOLD,
    NAME,
    URL_PREFIX,
    HubRoutes,
    Refusal,
    Repo,
    User,
    decode_base64,
    git_hash,
    json_body,
    repo_ref,
    valid_path,
)
from tests.support.hub_spaces import COMPUTE_SDKS, PAID_PLAN, SDKS


class CommitRoutes(HubRoutes):
    """Writing to the Hub: a new repo, then commits to it."""

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

    async def repo_settings(self, request: Request) -> Response:
        """A repo's visibility changed by its owner (`HfApi.update_repo_settings`); gating is not modelled."""
        body = await json_body(request)
        with self.state.lock:
            repo = self.state.writable(request, *repo_ref(request), "main")
            if set(body) != {"visibility"} or body["visibility"] not in ("public", "private"):
                raise Refusal(400, f"Only visibility 'public' or 'private' can be set here, got {body!r}")
            repo.private = body["visibility"] == "private"
            return JSONResponse({})

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
