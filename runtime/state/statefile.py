"""The small JSON files one process of the pod writes and another reads (the engines' health, the swap, the
preload): replaced whole through a rename, so that a reader never sees half of one, and read as None when absent
or unreadable, so that a reader never fails on a writer's account. A secret one hands a child (sshd's environment,
the desktop's password) is written private from its first byte instead."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def write_atomically(path: Path, text: str) -> None:
    """Write `path` through a partial file and a rename; each writer (process and thread) has its own partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read, never readable by others even for a moment: what a child of the pod
    reads and nobody else may (sshd's environment, tokens included; the desktop's password)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), 0o600)  # an older file of another mode keeps its mode through O_CREAT
        file.write(data)


def write_json(path: Path, data: Any) -> None:
    write_atomically(path, json.dumps(data))


def read_json(path: Path) -> Any | None:
    """What `path` holds, or None when it is absent or no JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class Watched(Generic[T]):
    """A state file read again only when it was replaced (another inode, time or size: each write is a rename), so
    that a reader asking on every request pays one `stat`, not a read and a parse."""

    def __init__(self, path: Path, convert: Callable[[Any], T | None]) -> None:
        self.path, self.convert = path, convert
        self.stamp: tuple[int, int, int] | None = None
        self.value: T | None = None

    def read(self) -> T | None:
        """What the file holds now (its JSON through `convert`; None when absent), kept while it is unchanged."""
        try:
            status = os.stat(self.path)
        except OSError:
            self.stamp, self.value = None, None
            return None
        stamp = (status.st_ino, status.st_mtime_ns, status.st_size)
        if stamp != self.stamp:
            self.stamp, self.value = stamp, self.convert(read_json(self.path))
        return self.value
