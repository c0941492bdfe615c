"""The build context: exactly the files the Dockerfile copies, the same for a local build and a Space.

What git tracks (or, outside a git checkout, the files under the tree), filtered by .dockerignore
(docker/certs/, docker/image_facts.py, runtime/), plus the rendered Dockerfile, the CA certificates
docker/certs/*.crt (ignored by git, public) and `--ca-cert`'s. Nothing is read through a link that leaves the
tree or enters `.git`, nor through a hard link; no nested `.git` or editor litter goes in; and a file whose name
looks secret (`.env*`, `id_*`, `*.key`, `.netrc`, `.npmrc`, `token`, `.docker/config.json`…, in any case) or whose
content holds a credential (a private key, a token of the services we talk to, a URL's password, a secret field
or variable written out: runtime.tokenshapes, the redactor's table too) stops the upload with one line naming it: a Space's files
and its image may be public. Both builders get one tar made the
same way, so a layer built here and the same layer built from a Space's files share the builder's cache.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import subprocess
import tarfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath

from runtime.tokenshapes import first_credential
from space import BuildError
from space.targets import ROOT

DOCKERFILE = "Dockerfile"  # where the rendered file sits in a context: the Space's root, like any repo
EXTRA_CA_IN_CONTEXT = "docker/certs/build-py-extra.crt"
# Names that hold credentials (a dotenv, an SSH or TLS private key, a secrets file, git's and curl's stored
# passwords, a key store), in any case (`.ENV`, `ID_RSA`): never uploaded.
SECRET_NAMES = (
    ".env",
    ".env.*",
    "id_*",
    "*.key",
    "*.pem",
    "secrets.*",
    ".netrc",
    "_netrc",
    ".git-credentials",
    ".pgpass",
    ".htpasswd",
    "credentials",
    "credentials.*",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.kdbx",
    "*.ppk",
    ".npmrc",  # a registry's auth token
    ".pypirc",  # PyPI's password or token
    "token",
    "*.token",
    "kubeconfig",
    ".dockercfg",
)
# Paths that hold credentials whatever their name says: a registry's logins, a cluster's token.
SECRET_PATHS = (".docker/config.json", "*/.docker/config.json", ".kube/config", "*/.kube/config")
CERTIFICATES = "docker/certs/*.crt"  # public CA certificates: what that folder is for
LITTER = (".DS_Store", "Thumbs.db", "*.swp", "*.swo", "*~", ".#*")  # an OS's or an editor's, never the project's


def context_files(
    dockerfile_text: str, ca_cert: Path | None = None, root: Path = ROOT, warn: Callable[[str], None] = print
) -> dict[str, bytes]:
    """Path in the context → content: the rendered Dockerfile, the project's files .dockerignore lets
    through, the extra CA; BuildError (one line) for a secret-looking name or a link out of the tree.
    `warn` hears of each file git does not track where the image takes files: it is left out."""
    copied = copied_by_the_dockerfile(root)
    for path in filter(copied, untracked_files(root)):
        warn(f"{path} is not tracked by git: left out of the image (`git add` it if the image needs it)")
    files = {}
    for path in filter(copied, project_files(root)):
        content = read_inside(root, path)  # a link out of the tree is said first, whatever its name
        if secret_name(path):
            raise BuildError(
                f"{path} looks like a secret (its name): it is not uploaded; move it out of the tree, "
                "or rename it if it holds nothing secret"
            )
        if content is not None:
            files[path] = refuse_credentials(path, content)
    files.update(certificates_to_trust(root))
    files[DOCKERFILE] = dockerfile_text.encode()
    if ca_cert:
        files[EXTRA_CA_IN_CONTEXT] = ca_cert.read_bytes()
    return files


def secret_name(path: str) -> bool:
    """Whether `path` names a credential (SECRET_NAMES, SECRET_PATHS, in any case); a CA certificate never does."""
    name, lowered = PurePosixPath(path).name.lower(), path.lower()
    return not fnmatch.fnmatch(path, CERTIFICATES) and (
        any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_NAMES)
        or any(fnmatch.fnmatchcase(lowered, pattern) for pattern in SECRET_PATHS)
    )


def certificates_to_trust(root: Path) -> dict[str, bytes]:
    """docker/certs/*.crt as they are on disk, tracked or not: git ignores them (a proxy's CA is the user's own), yet
    every image trusts them (a certificate is public: uploaded with the context); BuildError for one holding a key."""
    certificates = {}
    for path in sorted(p.relative_to(root).as_posix() for p in root.glob(CERTIFICATES)):
        content = read_inside(root, path)
        if content is None:
            continue
        if b"PRIVATE KEY" in content:
            raise BuildError(f"{path} holds a private key: it is not uploaded; keep only the CA certificate there")
        if b"-----BEGIN CERTIFICATE-----" not in content:  # update-ca-certificates reads PEM only
            raise BuildError(
                f"{path} is no PEM certificate (no BEGIN CERTIFICATE line): convert it "
                "(openssl x509 -inform der -in FILE -out FILE.crt) or remove it"
            )
        certificates[path] = content
    return certificates


def copied_by_the_dockerfile(root: Path) -> Callable[[str], bool]:
    """Whether a path goes in the context: .dockerignore lets it through and no OS or editor made it."""
    from docker.utils.build import PatternMatcher

    lines = (root / ".dockerignore").read_text().splitlines()
    ignored = PatternMatcher([line.strip() for line in lines if line.strip() and not line.startswith("#")])

    def copied(path: str) -> bool:
        name = PurePosixPath(path).name
        # .dockerignore itself: read by builders, copied by no build.
        return (
            path != ".dockerignore"
            and not ignored.matches(path)  # type: ignore[arg-type]  # the stub says PathLike; the code lower()s a str
            and not any(fnmatch.fnmatch(name, p) for p in LITTER)
        )

    return copied


def untracked_files(root: Path) -> list[str]:
    """Files of a git checkout that git does not track nor ignore (none outside a checkout)."""
    if not (root / ".git").exists():
        return []
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=root, capture_output=True, check=True
    ).stdout
    return [path for path in listed.decode().split("\0") if path]


def project_files(root: Path) -> Iterator[str]:
    """The project's files, relative: what git tracks in a checkout, else every file under `root`
    (a downloaded archive); no nested repository's `.git` either way."""
    if (root / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
        yield from (path for path in listed.decode().split("\0") if path)
        return
    for folder, subfolders, names in os.walk(root):  # links to folders are not followed
        subfolders[:] = sorted(d for d in subfolders if d != ".git")
        for name in sorted(names):
            yield Path(folder, name).relative_to(root).as_posix()


def read_inside(root: Path, path: str) -> bytes | None:
    """The file's bytes, read through links only while they stay in the tree and out of `.git`; None for what
    is not a regular file (a submodule, a folder); BuildError for a link that leaves the tree or enters `.git`
    (its config can carry a token), and for a hard link (its other name may be anywhere)."""
    where = root / path
    real = where.resolve()
    if not real.is_relative_to(root.resolve()):
        raise BuildError(
            f"{path} is a link out of the tree (to {real}): it is not uploaded; "
            "copy what it points to into the tree if the image needs it"
        )
    if ".git" in real.relative_to(root.resolve()).parts:
        raise BuildError(
            f"{path} is a link into git's own files ({real.relative_to(root.resolve())}): it is not "
            "uploaded (git's config can hold a token); remove the link"
        )
    if not real.is_file():
        return None
    if real.stat().st_nlink > 1:
        raise BuildError(
            f"{path} is a hard link ({real.stat().st_nlink} names): it is not uploaded (its other name "
            "can be anywhere, a credential among them); copy the file instead"
        )
    return real.read_bytes()


def refuse_credentials(path: str, content: bytes) -> bytes:
    """`content`, unless it holds a credential's shape (runtime.tokenshapes): BuildError naming the file, the
    kind and the line, never the value (a Space's files, and the image, may be public)."""
    if found := first_credential(content.decode(errors="replace")):
        what, line = found
        raise BuildError(
            f"{path} holds what looks like {what} (line {line}): it is not uploaded; remove it from "
            "the file (a pod reads its secrets from its environment)"
        )
    return content


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
