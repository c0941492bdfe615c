"""Shared pytest setup: fixtures live in tests/support/ and are registered here as plugins."""

pytest_plugins = [
    "tests.support.vllm_server",  # `vllm_server`: one real vLLM serving the tiny scripted model per session
    "tests.support.hub_server",  # `hub_server`: a strict local Hub for the real huggingface_hub client
    "tests.support.bridge",  # `bridge`: the bridge in front of that vLLM; `start_bridge` for special ones
]
