"""The test Hub's reading routes: repo info, tree listings, and file downloads (`resolve`), an LFS file
redirected to an object store as the Hub does to its CDN; both honour `Range`, and `throttle` paces them."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tests.support.hub_repos import LFS_THRESHOLD, HubRoutes, Refusal, git_hash, iso, repo_ref


class FileRoutes(HubRoutes):
    """Reading a repo: its info, its tree, its files."""

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
