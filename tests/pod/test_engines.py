"""The engines' owner (runtime.pod.engines) without vLLM: a refused change leaves the plan, the settings and the swap's
phase as they were; the phases move only as their table allows; a Hub file, a swap and a roll (a Hub file on two
engines) drain each engine through one sequence, on engines that are sleeping processes, healthy at once, behind a
stand-in of the router's worker list. Real engines run the same changes in test_start.py, test_swap.py and
test_replicas.py."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from runtime.engine.command import engine_command
from runtime.pod.diagnosis import explain
from runtime.pod.engines import ChangeRefused, Engines, Plan
from runtime.pod.replicas import Replica, plan_replicas
from runtime.pod.supervisor import Backoff, ChildSpec, Health, StartLimit, Supervisor
from runtime.pod.swapper import Swapper
from runtime.settings import load_settings
from runtime.state.swap import STARTING, STOPPING, read_state
from tests.support.environ import outer_environ
from tests.support.net import Served, free_port

KEYS = {"VL_API_KEYS": "owner:sk-owner-0123456789abcdef"}


def pod_env(root: Path, **extra: str) -> dict[str, str]:
    return outer_environ() | {
        "VL_MODEL": "tiny", "VL_STATE_DIR": str(root), "VL_CACHE_DIR": str(root / "cache"), "VL_VENV": sys.prefix,
    } | extra  # fmt: skip


def no_restart(replica: object) -> ChildSpec:
    raise AssertionError("a refused change restarts nothing")


def engines_on(env: dict[str, str]) -> Engines:
    """The owner of one planned engine (tiny, on the CPU), as Engines.prepare leaves it."""
    settings = load_settings(env)
    engines = Engines(settings, Supervisor(Path(settings.state_dir)), no_restart)
    command = engine_command(settings, environ=env)
    engines.plan = Plan(settings, command, plan_replicas(settings, command, "cpu", 0))
    return engines


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"VL_CTX": "10000000"}, r"^VL_CTX='10000000' is not allowed: expected at most "),  # refused as prepared
        pytest.param({"VL_REPLICAS": "2", "VL_CTX": "4096"},
                     r"^it would make 2 engines of this pod's 1 \(set VL_TP and VL_REPLICAS",
                     marks=pytest.mark.slow),  # prepared first: the tiny model written (seconds)
    ],
    ids=["cannot-be-prepared", "another-number-of-engines"],
)  # fmt: skip
def test_a_refused_change_leaves_the_plan_in_force(tmp_path: Path, change: dict[str, str], refusal: str) -> None:
    env = pod_env(tmp_path)
    engines = engines_on(env)
    before = engines.plan

    async def changed() -> None:
        async with engines.changing:
            await engines.change_to(load_settings(env | change), "a Hub file")

    with pytest.raises(ChangeRefused, match=refusal):
        asyncio.run(changed())
    assert engines.plan is before and engines.rolling is None


def test_a_change_is_decided_one_at_a_time(tmp_path: Path) -> None:
    engines = engines_on(pod_env(tmp_path))
    with pytest.raises(AssertionError, match="one change at a time"):
        asyncio.run(engines.change_to(engines.settings, "unlocked"))


def test_the_swap_moves_only_as_its_table_allows_and_the_old_model_stays_loaded_until_the_new_serves(
    tmp_path: Path,
) -> None:
    engines = engines_on(pod_env(tmp_path, VL_SWAP="tiny:tiny tiny2:tiny2", **KEYS))
    engines.serving()
    engines.preparing("tiny2")
    with pytest.raises(RuntimeError, match="the swap cannot go from preparing to waiting"):
        engines.waiting_for("tiny2")
    engines._write_swap(STOPPING, "tiny2")  # as a change's restarts write it
    engines.plan = engines_on(pod_env(tmp_path, VL_MODEL="tiny2", VL_SWAP="tiny:tiny tiny2:tiny2", **KEYS)).plan
    engines._write_swap(STARTING, "tiny2")  # the plan names tiny2 now; the file still says tiny is loaded
    state = read_state(tmp_path)
    assert state is not None and (state.loaded, state.phase, state.target) == ("tiny", "starting", "tiny2")
    with pytest.raises(RuntimeError, match="the swap cannot go from starting to preparing"):
        engines.preparing("tiny2")
    engines.serving()
    state = read_state(tmp_path)
    assert state is not None and (state.loaded, state.phase, state.target) == ("tiny2", "serving", None)


@pytest.mark.slow
def test_a_change_whose_engine_cannot_start_ends_with_the_reason_instead_of_waiting_for_ever(tmp_path: Path) -> None:
    env = pod_env(tmp_path)
    refusing = [sys.executable, "-c", "print('error: unrecognized arguments: --no-such-flag'); raise SystemExit(2)"]

    async def change() -> None:
        supervisor = Supervisor(tmp_path, backoff=Backoff(first_s=0.05, most_s=0.1))
        engines = engines_on(env)
        engines.supervisor = supervisor
        engines.spec = lambda replica: ChildSpec(replica.name, refusing, start_limit=StartLimit(2, explain))
        supervisor.start(ChildSpec(engines.replicas[0].name, [sys.executable, "-c", "import time; time.sleep(600)"]))
        try:
            async with engines.changing:
                restarts = await engines.change_to(load_settings(env | {"VL_CTX": "4096"}), "a Hub file")
            await restarts
        finally:
            await supervisor.stop()

    with pytest.raises(ChangeRefused, match=r"^engine exited with code 2; not restarted after 2 failed starts in a row: "
                       r"vLLM refused its command line \(--no-such-flag\)"):  # fmt: skip
        asyncio.run(change())


# --- one drain sequence for every kind of change ---------------------------------------------------------------

SEQUENCE = ["withdrawn", "drained", "restarted", "healthy", "readmitted"]  # each engine's, in this order
STEPS = re.compile(r"^(\S+) serves the new settings: (.*) \((.*)\)$")


class StandInRouter:
    """smg's worker list as RouterControl uses it (GET, POST, DELETE /workers): who was withdrawn and admitted."""

    def __init__(self) -> None:
        self.workers: dict[str, str] = {}  # id → url
        self.calls: list[str] = []
        self.app = Starlette(
            routes=[Route("/workers", self.listed, methods=["GET"]), Route("/workers", self.added, methods=["POST"]),
                    Route("/workers/{id}", self.removed, methods=["DELETE"])]
        )  # fmt: skip

    async def listed(self, request: Request) -> JSONResponse:
        workers = [{"id": i, "url": url, "is_healthy": True} for i, url in self.workers.items()]
        return JSONResponse({"workers": workers})

    async def added(self, request: Request) -> JSONResponse:
        url = (await request.json())["url"]
        self.workers[f"admitted-{len(self.calls)}"] = url
        self.calls.append(f"admit {url}")
        return JSONResponse({}, status_code=202)

    async def removed(self, request: Request) -> JSONResponse:
        url = self.workers.pop(request.path_params["id"])
        self.calls.append(f"withdraw {url}")
        return JSONResponse({})


def sleeping(replica: Replica) -> ChildSpec:
    """An engine's child that lives and is healthy at once (its health probe answers yes)."""

    async def healthy() -> bool:
        return True

    health = Health(healthy, interval_s=0.05, timeout_s=5.0, failures_before_restart=3, starting_interval_s=0.05)
    return ChildSpec(replica.name, [sys.executable, "-c", "import time; time.sleep(600)"], health=health)


async def changed(kind: str, env: dict[str, str], state_dir: Path) -> tuple[Engines, list[str]]:
    """The engines after one change of `kind` (a Hub file's, a swap's, a Hub file's on two engines: a roll), and
    the phases the swap's file went through meanwhile."""
    settings = load_settings(env)
    engines = Engines(settings, Supervisor(state_dir), sleeping)
    command = engine_command(settings, environ=env)
    engines.plan = Plan(settings, command, plan_replicas(settings, command, "cpu", 2))
    for replica in engines.replicas:
        engines.supervisor.start(sleeping(replica))
    phases: list[str] = []

    def look() -> None:
        state = read_state(state_dir)
        if state is not None and (not phases or phases[-1] != state.phase):
            phases.append(state.phase)

    async def watch_phases() -> None:
        while True:
            look()
            await asyncio.sleep(0.01)

    watching = asyncio.create_task(watch_phases())
    try:
        if kind == "swap":
            engines.serving()  # as the swapper's loop begins
            await asyncio.wait_for(Swapper(engines, lambda line: None, lambda: None).swap_to("tiny2"), 120)
        else:
            async with engines.changing:
                await engines.settle_on(load_settings(env | {"VL_CTX": "4096"}), "a Hub file")
            assert engines.rolling is not None
            await asyncio.wait_for(engines.rolling, 120)
    finally:
        watching.cancel()
        look()  # the last word
        await engines.supervisor.stop()
    return engines, phases


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["hub-file", "swap", "roll"])
async def test_a_hub_change_a_swap_and_a_roll_drain_each_engine_alike(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    router = StandInRouter()
    with Served(router.app, "router") as served:
        env = pod_env(tmp_path, VL_ENGINE_PORT=str(free_port()), VL_ROUTER_PORT=served.url.rpartition(":")[2])
        env |= {"swap": {"VL_SWAP": "tiny:tiny tiny2:tiny2", "VL_SWAP_MIN_S": "0", **KEYS},
                "roll": {"VL_REPLICAS": "2"}}.get(kind, {})  # fmt: skip
        router.workers = {str(i): f"http://127.0.0.1:{int(env['VL_ENGINE_PORT']) + i}" for i in range(2)}
        caplog.set_level(logging.INFO, logger="runtime.pod.engines")
        engines, phases = await changed(kind, env, tmp_path)

    steps = [STEPS.match(r.getMessage()) for r in caplog.records if r.name == "runtime.pod.engines"]
    done = [(m[1], m[2].split(", "), m[3]) for m in steps if m is not None]
    routed = kind == "roll"
    expected = [step for step in SEQUENCE if routed or step not in ("withdrawn", "readmitted")]
    assert [(name, said) for name, said, _ in done] == [(r.name, expected) for r in engines.replicas]
    assert len(engines.replicas) == (2 if routed else 1)
    if routed:  # one engine at a time: withdrawn, then readmitted before the next is withdrawn
        urls = [r.command.base_url for r in engines.replicas]
        assert router.calls == [f"{verb} {url}" for url in urls for verb in ("withdraw", "admit")]
    if kind == "swap":
        assert {why for _, _, why in done} == {"swapping the model to tiny2"}
        assert phases == ["serving", "preparing", "stopping", "starting", "serving"]
        assert (engines.swap.loaded, engines.swap.last and engines.swap.last["to"]) == ("tiny2", "tiny2")
    else:
        assert {why for _, _, why in done} == {"its settings changed"} and engines.settings.ctx == 4096


@pytest.mark.parametrize(
    ("change", "two_engines"),
    [({"VL_CTX": "10000000"}, False), ({"VL_CTX": "4096"}, True)],
    ids=["cannot-be-prepared", "a-swap-on-two-engines"],
)
def test_a_refused_hub_change_leaves_the_plan_the_settings_and_the_phase_untouched(
    tmp_path: Path, change: dict[str, str], two_engines: bool
) -> None:
    env = pod_env(tmp_path, VL_SWAP="tiny:tiny tiny2:tiny2", **KEYS)
    engines = engines_on(env)
    engines.serving()
    plan, configured, swap, written = engines.plan, engines.configured, engines.swap, read_state(tmp_path)
    if two_engines:  # the GPUs said two engines: a swap cannot restart both at once
        engines.plan = replace(plan, replicas=(plan.replicas[0], plan.replicas[0]))
        plan = engines.plan

    async def settle() -> None:
        async with engines.changing:
            await engines.settle_on(load_settings(env | change), "a Hub file")

    with pytest.raises(ChangeRefused):
        asyncio.run(settle())
    assert (engines.plan, engines.configured, engines.swap) == (plan, configured, swap)
    assert read_state(tmp_path) == written and engines.rolling is None
