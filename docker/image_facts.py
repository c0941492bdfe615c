"""Check an image's installed versions against its pins, then write its build facts as JSON.

Run by the Dockerfile (standard library only) after the last install step; the runtime reads the
result, `/opt/.image_prebaked`, to know that nothing needs installing at start. Versions come from
`importlib.metadata`: importing vLLM or running `vllm --version` dies on a builder without a GPU.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path

LOADER_CONFIG = (Path("/etc/ld.so.conf"), *sorted(Path("/etc/ld.so.conf.d").glob("*.conf")))


def parse_pin(text: str) -> tuple[str, str]:
    name, separator, version = text.partition("==")
    if not separator or not name or not version:
        raise argparse.ArgumentTypeError(f"expected NAME==VERSION, got {text!r}")
    return name, version


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problems(pins: dict[str, str], installed: dict[str, str | None]) -> list[str]:
    """One line per pinned distribution whose installed version is not exactly its pin."""
    return [
        f"{name}: pinned {pin}, installed {installed[name] or 'nothing'}"
        for name, pin in pins.items()
        if installed[name] != pin
    ]


def enabled_compat_paths() -> list[str]:
    """Where a CUDA forward-compatibility directory is on the loader path (the runtime gates it)."""
    places = [
        f"LD_LIBRARY_PATH={entry}" for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":") if "compat" in entry
    ]
    for config in LOADER_CONFIG:
        if config.is_file():
            places += [
                f"{config}: {line.strip()}"
                for line in config.read_text().splitlines()
                if "compat" in line and not line.lstrip().startswith("#")
            ]
    return places


def facts(args: argparse.Namespace, installed: dict[str, str | None]) -> dict[str, object]:
    return {
        "target": args.target,
        "cuda_arch": args.cuda_arch or None,
        "base_image": args.base_image,
        "revision": args.revision,
        "date": args.date,
        "python": platform.python_version(),
        "cuda": os.environ.get("CUDA_VERSION") or None,  # the nvidia/cuda base's; runtime.gpu compares it
        "versions": installed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--cuda-arch", default="")
    parser.add_argument("--base-image", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--date", required=True)
    parser.add_argument("--pin", type=parse_pin, action="append", default=[], metavar="NAME==VERSION")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)

    pins = dict(args.pin)
    installed = {name: installed_version(name) for name in pins}
    problems = version_problems(pins, installed)
    problems += [
        f"CUDA forward compatibility must not be enabled in the image: {place}" for place in enabled_compat_paths()
    ]
    for problem in problems:
        print(f"image_facts: {problem}", file=sys.stderr)
    if problems:
        return 1
    text = json.dumps(facts(args, installed), indent=2, sort_keys=True) + "\n"
    args.output.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
