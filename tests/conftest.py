"""Shared pytest setup: fixtures live in tests/support/ and are registered here as plugins.

A test that uses the session's vLLM (directly or through a fixture built on it) is marked `vllm` here;
a test that starts engines of its own says so itself. A test marked `slow` (servers or processes of its
own: seconds each) runs only with `--runslow`, which `scripts/test` passes but for `--quick`: so the
quick layer, `-m "not vllm and not docker"`, is a loop of seconds however pytest is called.
"""

from __future__ import annotations

import pytest

LEFT_OUT = pytest.StashKey[int]()

pytest_plugins = [
    "tests.support.vllm_server",  # `vllm_server`: one real vLLM serving the tiny scripted model per session
    "tests.support.hub_server",  # `hub_server`: a strict local Hub for the real huggingface_hub client
    "tests.support.registry",  # `registry`: a real OCI registry (Debian's docker-registry) on loopback, per session
    "tests.support.images",  # `image_engine`, `image_base`, `cpu_image`: one Docker engine and cpu build per session
    "tests.support.runpod_server",  # `runpod_server`: RunPod's REST API v2, checked against its OpenAPI file
    "tests.support.bridge",  # `bridge`: the bridge in front of that vLLM; `start_bridge` for special ones
    "tests.support.browser",  # `browser`: a headless Chromium per module (the console, the desktop)
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run the tests marked slow (scripts/test does)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.vllm)
    if config.getoption("--runslow"):
        return
    slow = [item for item in items if "slow" in item.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if "slow" not in item.keywords]
        config.stash[LEFT_OUT] = len(slow)


def pytest_report_collectionfinish(config: pytest.Config) -> str | None:
    left_out = config.stash.get(LEFT_OUT, 0)
    return f"{left_out} tests marked slow left out: --runslow (or scripts/test) runs them" if left_out else None
