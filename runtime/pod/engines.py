"""The pod's engines and their one owner, `Engines`: the plan in force, the settings as configured, the GPU, one
change at a time, the swap's phases, and the one verb that changes what the engines run, `change_to`.

Three things change the engines: the start (`prepare`), a Hub file (`settle_on`, from runtime.pod.changes) and a
swap (runtime.pod.swapper, through the swap's events below). All go through `change_to`, so all drain alike: each
engine in turn is withdrawn from the router (when there is one), left to finish what it runs (at most
ENGINE_DRAIN_S), restarted, waited for until healthy, and readmitted. A newer change takes over from one still under
way. A change that cannot be prepared, or that would change the number of engines, is refused and leaves the plan,
the settings and the swap's phase as they were. The swap's state is written only through its events (`serving`,
`preparing`, `swapped`, `swap_failed`…), each a move the phase table allows.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from runtime.engine.command import EngineCommand
from runtime.engine.install import InstallError
from runtime.engine.prepare import prepare_engine
from runtime.engine.weights import WeightsError
from runtime.gpu import inspect_gpu
from runtime.pod.replicas import ENGINE_DRAIN_S, Replica, drained, plan_replicas
from runtime.pod.router import RouterControl, router_url
from runtime.pod.supervisor import ChildSpec, Supervisor, until
from runtime.settings import Scope, Settings, SettingsError
from runtime.state.swap import NEXT, Phase, SwapState, swap_table, write_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """What the engines run: the settings in force, the engine's command, and the engines (one, or several behind
    the router; none on a gateway)."""

    settings: Settings
    command: EngineCommand | None = None
    replicas: tuple[Replica, ...] = ()


class ChangeRefused(Exception):
    """A change the engines cannot take; its one line says why, and the plan in force is untouched."""


def check_swap(settings: Settings, engines: int) -> None:
    """VL_SWAP swaps one engine: several (VL_REPLICAS, VL_DP) would each need the swap at once, refused here, once
    the GPUs say how many engines there are (settings.check_together refuses what the settings alone tell)."""
    if settings.swap and engines > 1:
        raise SettingsError(
            "VL_SWAP",
            ",".join(settings.swap),
            f"empty on a pod of {engines} engines (a swap "
            "restarts one engine; serve each model from its own pod behind a gateway)",
        )


class Engines:
    """The engines' owner. `spec` makes an engine's child (its command, environment and health probe)."""

    def __init__(self, settings: Settings, supervisor: Supervisor, spec: Callable[[Replica], ChildSpec]) -> None:
        self._configured = settings  # as the environment and the Hub file say, whatever a swap loaded since
        self.plan = Plan(settings)
        self.supervisor, self.spec = supervisor, spec
        self.state_dir = Path(settings.state_dir)
        self.accelerator, self.gpus = "cpu", 0
        self.engine_env: Mapping[str, str] = {}
        self.changing = asyncio.Lock()  # held while a change is decided: a Hub file's, a swap's
        self.rolling: asyncio.Task[None] | None = None  # the restarts of the change under way
        self._swap = SwapState(loaded=settings.model, since=time.time())  # VL_SWAP: what the bridge reads

    @property
    def configured(self) -> Settings:
        """The settings as the environment and the Hub file say (the model among them, whatever a swap loaded)."""
        return self._configured

    @property
    def swap(self) -> SwapState:
        """What the bridge last read of the swap; it moves only through the events below."""
        return self._swap

    @property
    def gateway(self) -> bool:
        return self.settings.role == "gateway"

    @property
    def routed(self) -> bool:
        """Whether the router runs: in front of several engines, or of a gateway's pods."""
        return len(self.replicas) > 1 or self.gateway

    @property
    def settings(self) -> Settings:
        """The settings in force (the configured ones, on the swapped model after a swap)."""
        return self.plan.settings

    @property
    def command(self) -> EngineCommand | None:
        return self.plan.command

    @property
    def replicas(self) -> tuple[Replica, ...]:
        return self.plan.replicas

    def prepare(self, environ: Mapping[str, str], slow_work_begins: Callable[[], None]) -> None:
        """The first plan, before vLLM's launch: the GPU checked, the engine installed (unless prebaked), the weights
        downloaded, the engines planned on the GPUs."""
        settings = self.settings
        gpu = inspect_gpu(settings, environ, probe=True)  # a sick host refused before its engine starts
        self.accelerator, self.engine_env = gpu.accelerator, gpu.engine_env(environ)
        self.gpus = len(gpu.host.gpus)
        command = prepare_engine(settings, self.accelerator, self.engine_env, slow_work_begins, self.gpus)
        self.plan = Plan(settings, command, plan_replicas(settings, command, self.accelerator, self.gpus))
        check_swap(settings, len(self.replicas))

    async def change_to(
        self,
        settings: Settings,
        why: str,
        target: str | None = None,
        downloading: Callable[[], None] | None = None,
        before: Callable[[], Awaitable[None]] | None = None,
        after: Callable[[], None] | None = None,
    ) -> asyncio.Task[None]:
        """Prepare `settings`' engine (a download included: the engines in force serve meanwhile), plan it, then
        restart the engines on it one at a time, as a task that ends once each serves again (a swap's `target` has
        its phases written; `before` runs first and `after` last, e.g. the bridge stopped to free the public port,
        or started once vLLM has left it). Called with `changing` held; ChangeRefused leaves the plan in force."""
        assert self.changing.locked(), "one change at a time: hold Engines.changing"
        try:
            command = await asyncio.to_thread(
                prepare_engine, settings, self.accelerator, self.engine_env, downloading or (lambda: None), self.gpus
            )
        except (SettingsError, InstallError, WeightsError) as error:
            raise ChangeRefused(str(error)) from None
        replicas = plan_replicas(settings, command, self.accelerator, self.gpus)
        if len(replicas) != len(self.replicas):
            raise ChangeRefused(
                f"it would make {len(replicas)} engines of this pod's {len(self.replicas)} "
                "(set VL_TP and VL_REPLICAS in the pod's environment)"
            )
        if self.rolling is not None:
            self.rolling.cancel()  # a newer change takes over from one still under way
        previous, self.plan = self.plan, Plan(settings, command, replicas)
        self.rolling = asyncio.create_task(self.restart_each(previous.replicas, why, target, before, after))
        self.rolling.add_done_callback(lambda task: task.cancelled() or task.exception())  # a Hub change awaits none
        return self.rolling

    async def restart_each(
        self,
        previous: tuple[Replica, ...],
        why: str,
        target: str | None = None,
        before: Callable[[], Awaitable[None]] | None = None,
        after: Callable[[], None] | None = None,
    ) -> None:
        """Each engine in turn: withdrawn from the router (when there is one), left to finish what it runs (at most
        ENGINE_DRAIN_S: then what it still runs is cut), restarted, healthy and readmitted before the next: the others
        answer meanwhile, and an engine the change breaks (left stopped by its start limit) stops the change with the
        rest still serving: ChangeRefused says why."""
        if before is not None:
            await before()
        router = RouterControl(router_url(self.settings)) if len(self.replicas) > 1 else None
        for old, replica in zip(previous, self.replicas, strict=True):
            steps = []  # what this engine went through, said in one line: the same for every kind of change
            if router is not None:
                steps.append("withdrawn" if await router.withdraw(old.command.base_url) else "still routed")
            if target is not None:
                self._write_swap(Phase.STOPPING, target)
            steps.append(
                "drained" if await drained(old.command, ENGINE_DRAIN_S) else f"cut after {ENGINE_DRAIN_S:.0f} s"
            )
            launch = self.supervisor.children[replica.name].launches
            if target is not None:
                self._write_swap(Phase.STARTING, target)
            self.supervisor.restart(replica.name, why, self.spec(replica))
            await until(functools.partial(self.settled, replica.name, launch))
            if (given_up := self.supervisor.given_up(replica.name)) is not None:
                raise ChangeRefused(f"{replica.name} {given_up}")  # the others keep the old settings
            steps += ["restarted", "healthy"]
            if router is not None:
                steps.append("readmitted" if await router.admit(replica.command.base_url) else "not readmitted in time")
            log.info("%s serves the new settings: %s (%s)", replica.name, ", ".join(steps), why)
        if after is not None:
            after()

    def settled(self, name: str, launch: int) -> bool:
        """Whether engine `name`, launched again since its launch number `launch`, is healthy or left stopped."""
        return self.supervisor.is_healthy_after(name, launch) or self.supervisor.given_up(name) is not None

    async def until_serving(self) -> None:
        """Until an engine of the pod is healthy (its first answer, as the supervisor probes it)."""
        await until(lambda: any(self.supervisor.is_healthy(replica.name) for replica in self.replicas), every_s=1.0)

    def on_recipe(self, settings: Settings, recipe: str) -> Settings:
        """`settings` serving `recipe`: VL_REPO, another checkpoint of the pod's own recipe, only with that recipe."""
        repo = self._configured.repo if recipe == self._configured.model else None
        return Settings({**settings.raw(), "model": recipe, "repo": repo}, {**settings.sources, "model": "swap"})

    # --- a Hub file's settings ---

    async def settle_on(
        self,
        configured: Settings,
        source: str,
        before: Callable[[], Awaitable[None]] | None = None,
        after: Callable[[], None] | None = None,
    ) -> set[Scope]:
        """Take a Hub file's settings: the engines restarted when theirs changed (a swapped model kept when the file
        left the model alone), else the settings in force replaced; the scopes that changed. Called with `changing`
        held; ChangeRefused leaves the plan, the configured settings and the swap's phase as they were."""
        assert self.changing.locked(), "one change at a time: hold Engines.changing"
        try:
            check_swap(configured, len(self.replicas))
        except SettingsError as error:
            raise ChangeRefused(str(error)) from None
        new = configured
        if self.settings.model != configured.model == self._configured.model:
            new = self.on_recipe(
                configured, self.settings.model
            )  # the file left the model alone: the swapped one stays
        scopes = self.settings.changed_scopes(new)
        if self.gateway and Scope.ENGINE in scopes:
            log.info("engine settings from %s are ignored: a gateway has no engine (its workers do)", source)
            scopes.discard(Scope.ENGINE)
        if Scope.ENGINE in scopes:
            await self.change_to(new, "its settings changed", before=before, after=after)
        elif scopes:
            self.plan = replace(self.plan, settings=new)
        self._configured = configured
        if not scopes:
            return scopes
        log.info("new settings from %s: restarting %s", source, " and ".join(sorted(s.value for s in scopes)))
        if Scope.ENGINE in scopes:
            self._write_swap(Phase.SERVING)  # another recipe
        elif Scope.BRIDGE in scopes:
            self._write_swap(self._swap.phase, self._swap.target)  # another VL_SWAP: a swap's phase as it is
        return scopes

    # --- the swap's events, each written where the bridge reads them (VL_SWAP) ---

    def serving(self) -> None:
        """The loaded model serves, nothing asked (the start, a swap given up or taken over)."""
        self._write_swap(Phase.SERVING)

    def served_since_now(self) -> None:
        """The loaded model answered: VL_SWAP_MIN_S counts from now."""
        self._swap = replace(self._swap, since=time.time())
        self._write_swap(Phase.SERVING)

    def waiting_for(self, recipe: str) -> None:
        """A swap to `recipe` asked, held back until the loaded model has had its VL_SWAP_MIN_S."""
        self._write_swap(Phase.WAITING, recipe)

    def preparing(self, recipe: str) -> None:
        self._write_swap(Phase.PREPARING, recipe)

    def downloading(self, recipe: str) -> None:
        self._write_swap(Phase.DOWNLOADING, recipe)

    def swapped(self, old: str, recipe: str, seconds: float) -> None:
        """`recipe` serves in place of `old`: the last swap, and VL_SWAP_MIN_S counted from now."""
        last = {"from": old, "to": recipe, "seconds": round(seconds, 1)}
        self._swap = replace(self._swap, last=last, since=time.time())
        self._write_swap(Phase.SERVING)

    def swap_failed(self, recipe: str, reason: str) -> None:
        """A swap that could not be prepared, or whose engine could not start: kept for the requests waiting for it."""
        self._swap = replace(self._swap, failed={"recipe": recipe, "reason": reason, "at": time.time()})
        self._write_swap(Phase.SERVING)

    def swap_due_in(self) -> float:
        """Seconds before the loaded recipe has had its VL_SWAP_MIN_S (a swap away from it waits that long)."""
        return self._swap.since + self.settings.swap_min_s - time.time()

    def _write_swap(self, phase: Phase, target: str | None = None) -> None:
        """Write what the bridge reads of the swap (/health, the console, a waiting request), with VL_SWAP only;
        the phase moves as NEXT allows. While a swap runs the old recipe stays the loaded one (the plan already
        names the new one once it starts): "from -> to" reads right in every phase."""
        from runtime.engine.recipes import load_recipe  # pydantic: a stock image's bare python loads this module

        command, swap = self.command, self._swap
        if command is None:  # a gateway: no engine, no swap
            return
        if phase not in NEXT[swap.phase]:
            raise RuntimeError(f"the swap cannot go from {swap.phase} to {phase}")
        recipes = {recipe: load_recipe(recipe) for recipe in swap_table(self.settings.swap).values()}
        recipes[command.recipe.name] = command.recipe
        loaded = self.settings.model if target is None else swap.loaded
        since = swap.since if swap.loaded == loaded else time.time()  # a Hub file's model (a swap sets its own)
        self._swap = replace(
            swap,
            loaded=loaded,
            since=since,
            phase=phase,
            target=target,
            recipe_names={r: list(c.names) for r, c in recipes.items()},
            thinks_unasked=command.recipe.thinks_unasked if target is None else swap.thinks_unasked,
            windows={**{r: c.default_window for r, c in recipes.items()}, self.settings.model: command.window},
            phase_since=time.time() if phase != swap.phase else swap.phase_since,
        )
        if self.settings.swap:
            write_state(self.state_dir, self._swap)
