"""Whether a model fits a card at a context, for K sessions at once: the KV cache a card leaves a model, from the
memory vLLM holds besides it and the KV's bytes per token, with the field notes' margins, each with its reason."""

from __future__ import annotations

import math
from dataclasses import dataclass

from runtime.sizing.cards import GIB, Card

# What vLLM holds inside its budget besides weights and KV (activations, CUDA graphs, buffers): Ornith NVFP4 on an
# RTX 6000 Ada (21.94 GiB of weights, 2,103,356 fp8 tokens at 0.93, 10,240 bytes each) left 2.6 GiB; vLLM's own
# profiled activation peak is 1.55 GiB of it (Flash-Next). Counted once per GPU.
OVERHEAD_GIB = 2.6
# Two concurrent full-window prefills take ~3.2 GiB transient; vLLM's profiled peak (1.55 GiB, inside its budget)
# covers one: the second's 1.65 GiB must fit in what the budget leaves (the notes: never validate on one request).
SECOND_PREFILL_GIB = 3.2 - 1.55
# With a fixed KV size (--kv-cache-memory-bytes) vLLM profiles nothing. Flash-Next, 15 GiB of KV: nvidia-smi showed
# 96,612 of 97,887 MiB, 2.7 GiB above what the 0.93 budget held besides KV (the activation peak and CUDA's own)...
OUTSIDE_BUDGET_GIB = 2.7
# ...and the 1.25 GiB left free held two full prefills, where 17 GiB of KV (0.75 GiB short) died under them.
FIXED_KV_HEADROOM_GIB = 1.25
SESSIONS = 2  # never size for one request: two sessions at the full window are the smallest honest load


@dataclass(frozen=True)
class Model:
    """A model as `plan` sizes it: its name, and what one engine (of `gpus` cards) holds."""

    name: str
    context: int  # the window asked for
    max_context: int  # the longest it can serve (native, or stretched by YaRN)
    resident_gib: float | None  # inside vLLM's budget besides KV, over the engine's GPUs (None: weights + overhead)
    weights_gib: float | None
    kv_bytes_per_token: int | None  # None: unknown (no shape, no measurement)
    utilization: float  # --gpu-memory-utilization
    kv_fixed_bytes: int | None = None  # --kv-cache-memory-bytes (per GPU), which replaces the utilization
    gpus: int = 1  # --tensor-parallel-size
    host_ram_gib: float = 0.0
    hybrid: bool = False  # Mamba layers (vLLM's mamba-cache-mode): VL_KV_OFFLOAD=auto is off
    source: str = ""
    speeds: tuple[tuple[str, str], ...] = ()

    def held_gib(self) -> float:
        """What vLLM holds besides the KV cache, over the engine's GPUs."""
        if self.resident_gib is not None:
            return self.resident_gib
        return (self.weights_gib or 0.0) + OVERHEAD_GIB * self.gpus


@dataclass(frozen=True)
class Fit:
    """The verdict for one card: whether K sessions at the context fit, why not in words, and what it leaves."""

    card: Card
    fits: bool
    why: str  # what decides it, in words
    kv_tokens: int | None
    max_context: int | None  # the longest context that K sessions get at once (capped at the model's)
    concurrency: float | None  # full-window requests the KV holds at once
    offload_gib: int | None = None  # host RAM that would keep the rest of the sessions' prefixes (VL_KV_OFFLOAD)


def fit(model: Model, card: Card, sessions: int = SESSIONS) -> Fit:
    """Whether `sessions` requests at `model.context` fit one engine on `model.gpus` cards of `card`'s kind."""
    total = card.memory_gib * model.gpus
    held = model.held_gib()
    on = f"{model.gpus} x {card.name}" if model.gpus > 1 else card.name
    if model.kv_fixed_bytes is not None:
        kv_gib = model.kv_fixed_bytes * model.gpus / GIB
        needs = held + (OUTSIDE_BUDGET_GIB + FIXED_KV_HEADROOM_GIB) * model.gpus + kv_gib
        if needs > total:
            why = (
                f"{held:.1f} GiB held, {kv_gib:.1f} GiB of fixed KV and {OUTSIDE_BUDGET_GIB + FIXED_KV_HEADROOM_GIB:.2f} "
                f"GiB for CUDA and two prefills need {needs:.1f} GiB; {on} has {total:.1f}"
            )
            return Fit(card, False, why, None, None, None)
    else:
        budget = model.utilization * total
        kv_gib = budget - held
        if kv_gib <= 0:
            why = f"{held:.1f} GiB held besides the KV is more than {model.utilization:g} of {on}'s {total:.1f} GiB"
            return Fit(card, False, why, None, None, None)
        spare = total - budget
        if spare < SECOND_PREFILL_GIB * model.gpus:
            why = (
                f"{model.utilization:g} of {total:.1f} GiB leaves {spare:.2f} GiB outside vLLM's budget: a second "
                f"concurrent full prefill needs {SECOND_PREFILL_GIB:.2f}"
            )
            return Fit(card, False, why, None, None, None)
    if model.kv_bytes_per_token is None:
        why = f"{kv_gib:.1f} GiB for the KV cache; its bytes per token are unknown (no shape, no measurement)"
        return Fit(card, False, why, None, None, None)
    tokens = int(kv_gib * GIB / model.kv_bytes_per_token)
    longest = min(model.max_context, tokens // sessions)
    concurrency = round(tokens / model.context, 2)
    needed = model.context * sessions
    if tokens < needed:
        offload = math.ceil((needed - tokens) * model.kv_bytes_per_token / GIB)
        why = (
            f"KV holds {tokens:,} tokens; {sessions} sessions at {model.context:,} need {needed:,} "
            f"(the longest context for {sessions}: {longest:,}; VL_KV_OFFLOAD={offload} would keep the rest of "
            f"their prefixes in {offload} GiB of host RAM, to be re-read, not re-computed)"
        )
        return Fit(card, False, why, tokens, longest, concurrency, offload)
    why = f"KV holds {tokens:,} tokens: {concurrency:g}x the {model.context:,}-token window"
    return Fit(card, True, why, tokens, longest, concurrency)
