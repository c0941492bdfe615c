"""The bridge tests' shared fixtures: the Anthropic SDK in front of the session's bridge, and both answer modes."""

from __future__ import annotations

import pytest

from tests.support.bridge import Process
from tests.support.sdk import anthropic


@pytest.fixture(scope="module")
def client(bridge: Process) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=bridge.url, api_key="unused", max_retries=0)


@pytest.fixture(params=[False, True], ids=["whole", "streamed"])
def stream(request: pytest.FixtureRequest) -> bool:
    return request.param
