"""The build context: exactly the files the Dockerfile copies, the same for a local build and a Space.

.dockerignore decides what goes in (docker/certs/, docker/image_facts.py, runtime/); `--ca-cert`
adds a proxy's CA certificate. Both builders get one tar made the same way, so a layer built here
and the same layer built from a Space's files share the builder's cache.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Mapping
from pathlib import Path

from space.targets import ROOT

DOCKERFILE = "Dockerfile"  # where the rendered file sits in a context: the Space's root, like any repo
EXTRA_CA_IN_CONTEXT = "docker/certs/build-py-extra.crt"


def context_files(dockerfile_text: str, ca_cert: Path | None = None, root: Path = ROOT) -> dict[str, bytes]:
    """Path in the context → content: the rendered Dockerfile, what .dockerignore lets through, the extra CA."""
    from docker.utils.build import exclude_paths

    ignore = root / ".dockerignore"
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    listed = sorted(exclude_paths(str(root), patterns))  # it always lets .dockerignore in: no build copies it
    files = {path: (root / path).read_bytes() for path in listed if (root / path).is_file() and path != ignore.name}
    files[DOCKERFILE] = dockerfile_text.encode()
    if ca_cert:
        files[EXTRA_CA_IN_CONTEXT] = ca_cert.read_bytes()
    return files


def context_tar(files: Mapping[str, bytes]) -> io.BytesIO:
    """A tar of `files` with fixed owners, modes and times: the same files always make the same cache keys."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, content in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(content), 0o644, 0
            tar.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return buffer


def git_blob_id(content: bytes) -> str:
    """The id git (and so the Hub) gives a file's content: how a Space's files are compared with ours."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
