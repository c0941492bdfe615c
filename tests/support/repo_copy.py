"""A throwaway copy of this repository, for tests that edit files or build from a changed tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def copy_repo(destination: Path) -> Path:
    """Copy the files git tracks or would track (no .git, .venv, caches) to destination."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for relative in filter(None, listed):
        source = ROOT / relative
        if source.is_file():
            target = destination / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def git_checkout(destination: Path) -> Path:
    """`copy_repo` made a git checkout of its own, everything committed: what a user's clone looks like."""
    copy_repo(destination)
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.test"]
    for command in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-qm", "the tree"]):
        subprocess.run(["git", *command], cwd=destination, check=True, capture_output=True)
    return destination
