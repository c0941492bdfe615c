"""One Hub repository as the runtime uses it: read a file's version cheaply, read it, write it, list it.

Everything goes through the real `huggingface_hub` client; the endpoint (`HF_ENDPOINT`) and the token
(`HF_TOKEN`) are passed explicitly, so the caller's environment decides, not the import order.
"""

from __future__ import annotations

import functools
import re
import socket
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, RepoFile, hf_hub_url, set_client_factory
from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError
from huggingface_hub.utils._http import default_client_factory
from huggingface_hub.utils.tqdm import disable_progress_bars

from runtime.settings import hub_repo, is_commit_id

# huggingface_hub's shared HTTP client waits forever by default: one hung connection would freeze the
# log publisher's thread for good. Every request (connect, each read, each write) gets this bound.
# (That client is shared by all threads, and huggingface_hub closes it after a connection error, which
# fails the other threads' requests in flight: the publisher and the watcher count it as one more failure.)
HUB_TIMEOUT_S = 20.0
_setup_lock = threading.Lock()
_bounded = False


def bound_hub_timeouts() -> None:
    """Gives huggingface_hub's shared client a timeout, and silences its progress bars (log noise)."""
    global _bounded
    with _setup_lock:
        if _bounded:
            return

        def bounded_client() -> Any:  # huggingface_hub's own client class, whatever it is
            client = default_client_factory()
            client.timeout = HUB_TIMEOUT_S
            return client

        set_client_factory(bounded_client)
        disable_progress_bars()
        _bounded = True


def pod_id(environ: Mapping[str, str]) -> str:
    """The pod's name in the log repo: RunPod's `RUNPOD_POD_ID`, else the hostname, made path-safe."""
    raw = environ.get("RUNPOD_POD_ID") or socket.gethostname() or "pod"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip(".-") or "pod"


@dataclass(frozen=True)
class FileVersion:
    """One version of a file on the Hub: its ETag (the content's git blob id) and the commit it was read at.

    Compare ETags to know whether the content changed: the commit also moves when other files change.
    """

    etag: str
    commit: str
    size: int | None = None  # bytes, as the HEAD request said


@dataclass(frozen=True)
class HubRepo:
    """A repo id (`owner/name`, or `datasets/owner/name`, `spaces/owner/name`) plus where and as whom."""

    repo_id: str
    repo_type: str = "model"
    endpoint: str | None = None
    token: str | bool | None = None

    @classmethod
    def parse(cls, spec: str, *, endpoint: str | None = None, token: str | bool | None = None) -> HubRepo:
        """The repo `spec` names (the settings' rule: `runtime.settings.hub_repo`); ValueError when malformed."""
        try:
            repo_type, repo_id = hub_repo(spec.strip().strip("/"))  # a pasted URL path's slashes are harmless
        except ValueError:
            raise ValueError(
                f"{spec!r} is not a Hub repo id: owner/name, datasets/owner/name or spaces/owner/name"
            ) from None
        return cls(repo_id, repo_type, endpoint, token)

    @classmethod
    def from_environ(cls, spec: str, environ: Mapping[str, str]) -> HubRepo:
        """The repo a setting names (checked by the settings), as the pod sees it: `HF_ENDPOINT`
        (default: the Hub) and `HF_TOKEN`; without it anonymous, never a token found elsewhere on disk."""
        return cls.parse(spec, endpoint=environ.get("HF_ENDPOINT") or None, token=environ.get("HF_TOKEN") or False)

    def __str__(self) -> str:
        return self.repo_id if self.repo_type == "model" else f"{self.repo_type}s/{self.repo_id}"

    @property
    def api(self) -> HfApi:
        bound_hub_timeouts()
        return HfApi(endpoint=self.endpoint, token=self.token)

    def version(self, path: str) -> FileVersion:
        """The file's current version on `main`, by one HEAD request (nothing downloaded).

        Raises huggingface_hub's errors: `RepositoryNotFoundError`, `RemoteEntryNotFoundError`, network errors.
        """
        api = self.api
        url = hf_hub_url(self.repo_id, path, repo_type=self.repo_type, endpoint=api.endpoint)
        metadata = api.get_hf_file_metadata(url=url, timeout=HUB_TIMEOUT_S)
        if metadata.etag is None or metadata.commit_hash is None:
            raise ConnectionError(f"{api.endpoint} did not answer like a Hub (no ETag or commit for {path})")
        if not is_commit_id(metadata.commit_hash):  # `read_text` hands it on (settings.COMMIT_ID says why)
            shown = ascii(metadata.commit_hash)[:100]
            raise ConnectionError(
                f"{api.endpoint} answered {self.repo_id}'s revision as {shown}, not a 40-hex commit id (for {path})"
            )
        return FileVersion(metadata.etag, metadata.commit_hash, metadata.size)

    def is_private(self) -> bool:
        """Whether only its owner can read the repo (one request for its info)."""
        return bool(self.api.repo_info(self.repo_id, repo_type=self.repo_type, timeout=HUB_TIMEOUT_S).private)

    def read_text(self, path: str, version: FileVersion) -> str:
        """The file's text at exactly `version` (a throwaway cache: the model cache stays untouched)."""
        with tempfile.TemporaryDirectory(prefix="vlpod-hub-") as cache:
            local = self.api.hf_hub_download(
                self.repo_id,
                path,
                repo_type=self.repo_type,
                revision=version.commit,
                cache_dir=cache,
                etag_timeout=HUB_TIMEOUT_S,
            )
            return Path(local).read_text(encoding="utf-8", errors="replace")

    def write_text(self, path: str, text: str, message: str) -> None:
        """One commit writing `path`; creates the repo (private) when it does not exist yet."""
        api = self.api
        upload = functools.partial(
            api.upload_file,
            path_or_fileobj=text.encode(),
            path_in_repo=path,
            repo_id=self.repo_id,
            repo_type=self.repo_type,
            commit_message=message,
        )
        try:
            upload()
        except RepositoryNotFoundError:
            api.create_repo(self.repo_id, repo_type=self.repo_type, private=True, exist_ok=True)
            upload()

    def list_files(self, folder: str) -> list[str]:
        """Paths of the files directly inside `folder` on `main` (empty when the folder does not exist)."""
        try:
            entries = list(self.api.list_repo_tree(self.repo_id, folder, repo_type=self.repo_type))
        except RemoteEntryNotFoundError:
            return []
        return sorted(e.path for e in entries if isinstance(e, RepoFile))
