"""The cpu image run as a pod of two engines (VL_REPLICAS=2): its own entrypoint starts two vLLM engines,
the router the image's engine layer installed (smg) and the bridge. Two Claude Code-shaped sessions each
stay on one engine, with their later turns read from its prefix cache; one engine killed leaves the
other serving, the pod degraded (its own HEALTHCHECK says which engine), then healthy again.
Slow (the cpu image, two vLLM starts in one container): marked `docker`, run as its own step of .ci/run.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from docker.models.containers import Container

from tests.support.conversations import Conversation, Endpoint, grown, where_sessions_land
from tests.support.images import Engine, report
from tests.support.net import free_port
from tests.support.polling import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

STATE_DIR = "/var/lib/vlpod"  # the image's VL_STATE_DIR
START_S = 1200.0  # two engines cold in one container, on cores the other CI step shares


@dataclass
class Pod(Endpoint):
    container: Container

    def health_checks(self) -> list[dict]:
        """The HEALTHCHECK's last results as Docker keeps them (`ExitCode`, `Output`)."""
        self.container.reload()
        return self.container.attrs["State"]["Health"]["Log"]


@pytest.fixture(scope="module")
def pod(image_engine: Engine, cpu_image: str, request: pytest.FixtureRequest) -> Iterator[Pod]:
    key, port, engine, router = f"sk-pod-{secrets.token_hex(20)}", free_port(), free_port(), free_port()
    environment = {
        "RUNPOD_POD_ID": "replicas-under-test", "VL_API_KEYS": key, "VL_REPLICAS": "2", "VL_SSH": "off",
        "VL_LISTEN": "127.0.0.1", "VL_PORT": str(port), "VL_ENGINE_PORT": str(engine), "VL_ROUTER_PORT": str(router),
    }  # fmt: skip
    started = time.monotonic()
    container = image_engine[1].containers.run(cpu_image, detach=True, network_mode="host", environment=environment,
                                               shm_size="2g")  # fmt: skip  # the default 64 MiB kills vLLM's CPU engine
    running = Pod(f"http://127.0.0.1:{port}", key, (engine, engine + 1), router, container)
    try:
        wait_until(lambda: alive(container) and running.routes_to_all(), "both engines behind the router", START_S,
                   every_s=1.0)  # fmt: skip
        report(request, f"two-engine pod container start → both routed: {time.monotonic() - started:.0f} s")
        yield running
    except AssertionError as error:
        raise AssertionError(f"{error}\n{container.logs(tail=80).decode(errors='replace')}") from None
    finally:
        container.remove(force=True)


def passed_saying(pod: Pod, text: str) -> bool:
    """Whether one of Docker's last checks of the pod passed and said `text`."""
    return any(check["ExitCode"] == 0 and text in check["Output"] for check in pod.health_checks())


def alive(container: Container) -> bool:
    container.reload()
    assert container.status == "running", container.logs(tail=80).decode(errors="replace")
    return True


def test_each_session_stays_on_one_engine_and_hits_its_prefix_cache(pod: Pod) -> None:
    where_sessions_land(
        pod.client(), pod.engines, ("c0ffee00-0000-4000-8000-00000000000a", "c0ffee00-0000-4000-8000-00000000000b")
    )


def test_a_killed_engine_degrades_the_pod_the_other_serves_and_it_comes_back(pod: Pod) -> None:
    conversation, client = Conversation("c0ffee00-0000-4000-8000-00000000000c"), pod.client()
    before = pod.served()
    conversation.turn(client, 1)
    home = grown(before, pod.served()).index(1)
    code, output = pod.container.exec_run(["sh", "-c", f"kill -9 $(cat {STATE_DIR}/engine-{home}.pid)"])
    assert code == 0, output
    wait_until(lambda: pod.health()["status"] == "degraded", "/health to say degraded", 60.0, every_s=0.2)
    for n in range(2, 5):  # its conversation moves to the other engine: nothing fails
        conversation.turn(client, n)
    saying = f"degraded: engine-{home} down"
    # A check that passes and says which engine is down: degraded still serves. Waited for, not read once: on
    # two shared cores a check can overrun its 10 s (a failure Docker ignores in the start period).
    try:
        wait_until(lambda: passed_saying(pod, saying), "a HEALTHCHECK that passes and says so", 120.0, every_s=1.0)
    except AssertionError as error:
        raise AssertionError(f"{error}; Docker's last checks: {pod.health_checks()}") from None
    assert pod.container.attrs["State"]["Health"]["Status"] == "healthy"
    wait_until(lambda: pod.health()["status"] == "ok", "the killed engine back", START_S, every_s=1.0)
