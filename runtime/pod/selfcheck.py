"""The pod proves its own model (VL_SELFCHECK): once the model first serves, `runtime check` against the pod's own
bridge, one check at a time and each once no user request is in flight; every outcome to the Hub log and
selfcheck.json, which `pod up` waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from runtime.health import health_url, serves_model
from runtime.pod.engines import Engines
from runtime.pod.replicas import ENGINE_DRAIN_S, drained
from runtime.state.selfcheck import checked, forget_selfcheck, read_selfcheck, write_selfcheck

log = logging.getLogger(__name__)

BRIDGE_CATCH_UP_S = 120.0  # the self-check waits this long for the bridge to name the model its engine serves


class SelfCheck:
    """`runtime check` run by the pod on itself, with the bridge's own key `key`; `say` publishes a line."""

    def __init__(self, engines: Engines, key: str, say: Callable[[str], None]) -> None:
        self.engines, self.key, self.say = engines, key, say
        self.state_dir = engines.state_dir

    @property
    def wanted(self) -> bool:
        """VL_SELFCHECK: on, or auto on a GPU; through the bridge, so never on a gateway or with VL_BRIDGE=off."""
        settings = self.engines.settings
        on = settings.selfcheck == "on" or (settings.selfcheck == "auto" and self.engines.accelerator == "cuda")
        return on and settings.bridge and self.engines.command is not None

    async def run(self) -> None:
        from runtime.checks.asking import Outcome  # httpx: not on the light path to vLLM's launch
        from runtime.checks.endpoint import EndpointError
        from runtime.checks.suite import CHECKS, run_checks

        forget_selfcheck(self.state_dir)  # a previous start's
        command = self.engines.command
        if not self.wanted or command is None:
            return
        outcomes: list[dict[str, str]] = []
        write_selfcheck(self.state_dir, "running", outcomes)  # from the start: `pod up` waits for a verdict, not "off"
        await self.engines.until_serving()

        def said(outcome: Outcome) -> None:
            outcomes.append({"name": outcome.name, "status": outcome.status, "detail": outcome.detail})
            write_selfcheck(self.state_dir, "running", outcomes)
            self.say(f"self-check {outcome.name}: {outcome.status}: {outcome.detail}")

        async def users_first() -> None:
            while not await drained(command, ENGINE_DRAIN_S):
                pass

        settings = self.engines.settings
        url = health_url(settings.listen, settings.port).removesuffix("/health")
        await bridge_serves(url, self.key, BRIDGE_CATCH_UP_S)
        try:
            await run_checks(url, self.key, list(CHECKS), said, command.served_names[0], users_first)
        except EndpointError as error:
            said(Outcome("endpoint", "failed", str(error)))
        failed = any(outcome["status"] == "failed" for outcome in outcomes)
        write_selfcheck(self.state_dir, "failed" if failed else "passed", outcomes)
        line = f"self-check: {checked(read_selfcheck(self.state_dir))}"
        log.log(logging.WARNING if failed else logging.INFO, "%s", line)
        self.say(line)


async def bridge_serves(url: str, key: str, within_s: float) -> None:
    """Returns once the bridge at `url` names the model its engine serves (it learns it by asking the engine, a
    little after the engine is healthy), or after `within_s`: the self-check then fails honestly at its endpoint."""
    import httpx  # not on the light path to vLLM's launch

    deadline = time.monotonic() + within_s
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"{url}/health", headers={"x-api-key": key})
                if serves_model(answer.status_code, answer.content):
                    return
            await asyncio.sleep(1.0)  # polling the pod's own bridge: it has no notification to wait on
