"""The engine's packages for each kind of image, from docker/versions.toml: one table for all installers.

build.py renders the image's pip layers from it, runtime/install.py installs a stock image's engine
from it and scripts/setup the tests' one. Standard library only: build.py and scripts/setup run it
before any virtual environment exists.
"""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path

VERSIONS_TOML = Path(__file__).resolve().parent.parent / "docker" / "versions.toml"
KINDS = ("gpu", "cpu")


@dataclasses.dataclass(frozen=True)
class EnginePackages:
    """Exact pins (`name==version`) of the torch layer and the engine layer, and what to remove after."""

    torch: tuple[str, ...]
    engine: tuple[str, ...]
    remove: tuple[str, ...]

    @property
    def requirements(self) -> list[str]:
        """Every pin, torch's first: what a plain `pip install` of the whole engine takes."""
        return [*self.torch, *self.engine]


def read_versions(path: Path = VERSIONS_TOML) -> dict:
    with path.open("rb") as file:
        return tomllib.load(file)


def engine_packages(kind: str, versions: dict | None = None) -> EnginePackages:
    """The pinned engine packages of a `gpu` or `cpu` image."""
    versions = versions or read_versions()
    table, pins = versions["packages"][kind], versions["engine"]
    return EnginePackages(
        torch=tuple(f"{name}=={pins[name]}" for name in table["torch"]),
        engine=tuple(f"{name}=={pins[name]}" for name in table["engine"]),
        remove=tuple(table["remove"]),
    )


if __name__ == "__main__":  # scripts/setup: `python3 runtime/packages.py cpu engine|remove`
    kind, part = sys.argv[1:3]
    print(" ".join(getattr(engine_packages(kind), part)))
