"""`VL_KV_OFFLOAD=auto`: the host RAM vLLM's native CPU offloading may keep prefixes evicted from the GPU in, sized from
the pod's RAM once the start knows its accelerator. `auto_offload_gib` is the rule (pure: `plan` sizes a RunPod card's
pod with it too); `resolve` applies it to a start's settings, with the one line the boot log says about it.

RunPod gives a pod 125-283 GB of RAM per H100/H200/B200. vLLM pins the whole buffer (`--kv-offloading-size`, the
total over one engine's tensor-parallel ranks) at start, so the rule keeps free what the rest of the pod needs: the OS,
the runtime, vLLM's own processes (API server, engine core, a worker per GPU) and what the recipe itself holds in host
RAM (Flash-Next's offloaded weights, `host_ram_gib`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.settings import Settings

if TYPE_CHECKING:
    from runtime.engine.recipes import Recipe

AUTO = "auto"
KEEP_FREE_GIB = 32.0  # the OS, the runtime, vLLM's processes: at least this much of the pod's RAM stays free...
KEEP_FREE_SHARE = 0.25  # ...or this share of it, whichever is more
MIN_GIB, MAX_GIB = 1, 4096  # VL_KV_OFFLOAD's own bounds: below 1 GiB the buffer is not worth pinning
MEMINFO = Path("/proc/meminfo")
# The container's own limit (cgroup v2, then v1): /proc/meminfo shows the whole machine's RAM inside a container.
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
GIB = 2**30


def auto_offload_gib(ram_gib: float, besides_gib: float = 0.0, share: float = 1.0) -> int | None:
    """GiB for one engine's `--kv-offloading-size` on a host of `ram_gib`: what is left once max(32 GiB, 25%) and
    `besides_gib` (the recipe's own host RAM) are kept free, times the engine's `share` of the host's GPUs, in whole
    GiB capped at 4096; None when under 1 GiB is left."""
    if not (math.isfinite(ram_gib) and math.isfinite(besides_gib) and 0 < share <= 1):
        return None
    spare = ram_gib - max(KEEP_FREE_GIB, KEEP_FREE_SHARE * ram_gib) - max(0.0, besides_gib)
    gib = min(MAX_GIB, math.floor(spare * share))
    return gib if gib >= MIN_GIB else None


def is_hybrid(options: dict[str, object]) -> bool:
    """A hybrid (Mamba) model, by its vLLM options: the notes found offloading closed by Mamba's block alignment."""
    return "mamba-cache-mode" in options


def resolve(
    settings: Settings, recipe: Recipe, options: dict[str, object], accelerator: str, gpus: int, ram_gib: float | None
) -> tuple[float | None, str]:
    """VL_KV_OFFLOAD=auto for this start: the GiB to pass vLLM (None: off) and the boot log's line saying why.

    `options` are the recipe's vLLM options with the settings applied (runtime.engine.command.tuned_options),
    `gpus` the host's, `ram_gib` its RAM (host_ram_gib(); None: unreadable)."""
    assert settings.kv_offload == AUTO, "resolve sizes VL_KV_OFFLOAD=auto only"
    if accelerator != "cuda":
        return None, "VL_KV_OFFLOAD=auto: off: no GPU here, and vLLM's CPU build refuses KV offloading"
    if is_hybrid(options):
        return None, (
            f"VL_KV_OFFLOAD=auto: off: {recipe.name} is a hybrid (Mamba) model, whose block alignment closed "
            "KV offloading on Flash-Next"
        )
    if ram_gib is None:
        return None, f"VL_KV_OFFLOAD=auto: off: the host's RAM could not be read ({MEMINFO})"
    tp = int(str(options.get("tensor-parallel-size", 1)))
    share = min(1.0, tp / gpus) if gpus > 0 else 1.0
    besides = recipe.facts.host_ram_gib if recipe.facts is not None else 0.0
    gib = auto_offload_gib(ram_gib, besides, share)
    kept = f"max({KEEP_FREE_GIB:g} GiB, {KEEP_FREE_SHARE:.0%}) kept free"
    kept += f" and {besides:g} GiB for the recipe" if besides else ""
    if gib is None:
        return None, f"VL_KV_OFFLOAD=auto: off: {ram_gib:.0f} GiB of RAM leave under {MIN_GIB} GiB once {kept}"
    of = f" (this engine's {tp} of {gpus} GPUs)" if share < 1 else ""
    return float(gib), f"VL_KV_OFFLOAD=auto: {gib} GiB of host RAM for evicted prefixes{of}: {ram_gib:.0f} GiB, {kept}"


def host_ram_gib(meminfo: Path = MEMINFO, limits: tuple[Path, ...] = CGROUP_LIMITS) -> float | None:
    """The RAM this container may use, in GiB: /proc/meminfo's MemTotal, or the cgroup's limit when lower; None when
    MemTotal cannot be read."""
    try:
        line = next(line for line in meminfo.read_text().splitlines() if line.startswith("MemTotal:"))
        total = int(line.split()[1]) * 1024  # kB
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    for path in limits:
        try:
            limit = int(path.read_text().strip())  # cgroup v2's "max": no limit (ValueError)
        except (OSError, ValueError):
            continue
        if 0 < limit < total:
            total = limit
        break
    return total / GIB


def for_this_host(
    settings: Settings, recipe: Recipe, options: dict[str, object], accelerator: str, gpus: int
) -> tuple[Settings, str]:
    """`settings` with VL_KV_OFFLOAD=auto replaced by what it resolves to on this host (its RAM read here), and the
    line that says so; called where the start knows the accelerator (runtime.engine.prepare, `engine-args`)."""
    ram = host_ram_gib() if accelerator == "cuda" else None
    resolved, line = resolve(settings, recipe, options, accelerator, gpus, ram)
    return Settings({**settings.raw(), "kv_offload": resolved}, settings.sources), line
