"""The engines' owner (runtime.pod.engines) without an engine running: a refused change leaves the plan in force, and
the swap's phases move only as their table allows. Each change's drain-and-health sequence, the same for a Hub
file, a swap and a roll, is asserted where real engines run it: test_start.py, test_swap.py, test_replicas.py."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from runtime.engine.command import engine_command
from runtime.pod.diagnosis import explain
from runtime.pod.engines import ChangeRefused, Engines, Plan
from runtime.pod.replicas import plan_replicas
from runtime.pod.supervisor import Backoff, ChildSpec, StartLimit, Supervisor
from runtime.settings import load_settings
from runtime.state.swap import PREPARING, SERVING, STARTING, STOPPING, WAITING, read_state
from tests.support.environ import outer_environ

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
    engines.tell(SERVING)
    engines.tell(PREPARING, "tiny2")
    with pytest.raises(RuntimeError, match="the swap cannot go from preparing to waiting"):
        engines.tell(WAITING, "tiny2")
    engines.tell(STOPPING, "tiny2")
    engines.plan = engines_on(pod_env(tmp_path, VL_MODEL="tiny2", VL_SWAP="tiny:tiny tiny2:tiny2", **KEYS)).plan
    engines.tell(STARTING, "tiny2")  # the plan names tiny2 now; the file still says tiny is loaded
    state = read_state(tmp_path)
    assert state is not None and (state.loaded, state.phase, state.target) == ("tiny", "starting", "tiny2")
    with pytest.raises(RuntimeError, match="the swap cannot go from starting to preparing"):
        engines.tell(PREPARING, "tiny2")
    engines.tell(SERVING)
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
