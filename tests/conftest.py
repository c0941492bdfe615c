"""Shared pytest setup: fixtures live in tests/support/ and are registered here as plugins.

A test that uses the session's vLLM (directly or through a fixture built on it) is marked `vllm` here;
a test that starts engines of its own says so itself. `scripts/test --quick` runs the rest.
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.support.vllm_server",  # `vllm_server`: one real vLLM serving the tiny scripted model per session
    "tests.support.hub_server",  # `hub_server`: a strict local Hub for the real huggingface_hub client
    "tests.support.registry",  # `registry`: a real OCI registry (Debian's docker-registry) on loopback, per session
    "tests.support.images",  # `image_engine`, `image_base`, `cpu_image`: one Docker engine and cpu build per session
    "tests.support.runpod_server",  # `runpod_server`: RunPod's REST API v2, checked against its OpenAPI file
    "tests.support.bridge",  # `bridge`: the bridge in front of that vLLM; `start_bridge` for special ones
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)
