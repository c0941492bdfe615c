"""Each kind of image's pip layers, from docker/versions.toml: one table for all installers.

build.py renders the image's pip layers from it, runtime/engine/install.py installs a stock image's runtime
and engine from it and scripts/setup the tests' engine. Standard library only: build.py, scripts/setup
and a stock image's bare python run it before any virtual environment exists.
"""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path
from typing import Any

VERSIONS_TOML = Path(__file__).resolve().parent.parent / "docker" / "versions.toml"
KINDS = ("gpu", "cpu")


class PackagesError(ValueError):
    """The package table cannot be read or contradicts itself; `str()` says so on one line."""


@dataclasses.dataclass(frozen=True)
class ImagePackages:
    """An image's pip layers in the Dockerfile's order: torch (exact pins with the local variant, from
    `torch_index`), the engine, what to uninstall after it, then the runtime's own dependencies."""

    torch_index: str
    torch: tuple[str, ...]
    engine: tuple[str, ...]
    remove: tuple[str, ...]
    runtime: tuple[str, ...]


def read_versions(path: Path = VERSIONS_TOML) -> dict[str, Any]:
    """The parsed table; PackagesError when it is absent (runtime/ copied alone) or malformed."""
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise PackagesError(
            f"{path} is missing: copy the checkout's runtime/ and docker/versions.toml "
            "together (docker/versions.toml holds the pins to install)"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise PackagesError(f"{path}: {error}") from None


def torch_variant(kind: str, versions: dict[str, Any]) -> str:
    """PyTorch's local version tag for a kind of image: `cpu`, or `cu130` for the GPU base's CUDA 13.0.x,
    which the torch index must serve (a wrong index would install a torch that cannot see the GPU)."""
    if kind == "cpu":
        return "cpu"
    major, minor = versions["cuda"]["version"].split(".")[:2]
    variant = f"cu{major}{minor}"
    index = versions["torch-index"][kind]
    if not index.rstrip("/").endswith(variant):
        raise PackagesError(
            f"versions.toml: torch-index {kind}={index!r} does not serve {variant} (CUDA {major}.{minor})"
        )
    return variant


def image_packages(kind: str, versions: dict[str, Any] | None = None) -> ImagePackages:
    """The pip layers of a `gpu` or `cpu` image."""
    versions = versions or read_versions()
    table, pins = versions["packages"][kind], versions["engine"]
    variant = torch_variant(kind, versions)
    return ImagePackages(
        torch_index=versions["torch-index"][kind],
        torch=tuple(f"{name}=={pins[name]}+{variant}" for name in table["torch"]),
        engine=tuple(f"{name}=={pins[name]}" for name in table["engine"]),
        remove=tuple(table["remove"]),
        runtime=runtime_pins(versions),
    )


def runtime_pins(versions: dict[str, Any] | None = None) -> tuple[str, ...]:
    """The runtime's own dependencies (`[runtime]`), the same in every kind of image."""
    versions = versions or read_versions()
    return tuple(f"{name}=={pin}" for name, pin in versions["runtime"].items())


if __name__ == "__main__":  # scripts/setup: `python3 runtime/packages.py cpu engine|remove`
    kind, part = sys.argv[1:3]
    print(" ".join(getattr(image_packages(kind), part)))
