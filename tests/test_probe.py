"""The engine health probe against a real vLLM serving the tiny model: a real one-token generation,
which tells a live engine from one whose API server still answers /v1/models."""

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil

from runtime.probe import probe_engine
from tests.support.vllm_server import free_port


def test_a_live_engine_is_healthy(vllm_server):
    health = probe_engine(vllm_server.url, vllm_server.model)
    assert health and health.reason.startswith("generated a token in ")


def test_a_model_the_engine_does_not_serve_is_unhealthy_with_the_engines_answer(vllm_server):
    health = probe_engine(vllm_server.url, "no-such-model")
    assert not health and health.reason.startswith("HTTP 404: ") and "no-such-model" in health.reason


def test_nothing_listening_is_unhealthy():
    health = probe_engine(f"http://127.0.0.1:{free_port()}", "tiny", timeout=5)
    assert not health and health.reason.startswith("unreachable: ")


@contextmanager
def engine_core_stopped(url: str) -> Iterator[None]:
    """SIGSTOP the engine core behind the API server listening at `url` (a hung engine), then SIGCONT."""
    port = int(url.rsplit(":", 1)[1])
    server = next(
        psutil.Process(c.pid)
        for c in psutil.net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
    )
    cores = [p for p in server.children(recursive=True) if "EngineCore" in " ".join([p.name(), *p.cmdline()])]
    assert cores, f"no engine core under {server.cmdline()}"
    for core in cores:
        os.kill(core.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for core in cores:
            os.kill(core.pid, signal.SIGCONT)


def test_a_hung_engine_still_lists_its_models_but_the_probe_says_unhealthy(vllm_server):
    with engine_core_stopped(vllm_server.url):
        assert httpx.get(f"{vllm_server.url}/v1/models", timeout=10).status_code == 200
        health = probe_engine(vllm_server.url, vllm_server.model, timeout=3)
        assert not health and health.reason == "no token within 3 s"
    assert probe_engine(vllm_server.url, vllm_server.model, timeout=60)  # and it recovers
