"""The engine health probe (runtime.health) against a real vLLM serving the tiny model: a real one-token generation,
which tells a live engine from one whose API server still answers /v1/models."""

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psutil

from runtime.health import pod_health_url, probe_engine, serves_model
from tests.support.net import free_port


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


def test_the_healthcheck_asks_the_public_port_by_loopback_when_the_pod_listens_everywhere():
    assert pod_health_url({}) == "http://127.0.0.1:8080/health"
    assert pod_health_url({"VL_PORT": "9000", "VL_LISTEN": "::"}) == "http://127.0.0.1:9000/health"
    assert pod_health_url({"VL_LISTEN": "::1"}) == "http://[::1]:8080/health"
    assert pod_health_url({"VL_LISTEN": "10.0.0.7"}) == "http://10.0.0.7:8080/health"


def test_the_pod_serves_once_its_health_names_a_model_or_is_vllms_own():
    assert serves_model(200, b'{"status": "ok", "model": "tiny", "context_window": 2048}')
    assert serves_model(200, b"")  # vLLM's own /health (VL_BRIDGE=off)
    assert not serves_model(200, b'{"status": "ok", "model": null, "context_window": null}')
    assert not serves_model(503, b"")
    assert not serves_model(200, b"<html>a proxy's page</html>")
    for condition in ("ok", "degraded", "swapping"):  # what /health says to anyone without a key
        assert serves_model(200, b'{"status": "%s"}' % condition.encode())
    assert not serves_model(200, b'{"status": "starting"}')
    assert not serves_model(200, b'{"status": "stopped"}')  # every engine left stopped by its start limit
    assert not serves_model(200, b'{"status": "stopped", "model": "tiny", "stopped": {"engine": "sick"}}')  # to keys
