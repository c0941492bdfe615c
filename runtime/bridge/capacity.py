"""Why is it slow: the engines' capacity, read from vLLM's own `/metrics` as the field notes read it.

The latest sample says the state (KV cache use, requests running, waiting and why); two samples some
time apart give rates (prompt tokens computed and tokens generated per second, the prefix cache's
hits, preemptions, where requests spent their time). One line names the case in the notes' terms.
Every line read here is on the cpu engine's exposition too (tests/data/vllm-metrics): none is GPU-only.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from runtime.bridge.enginemetrics import families
from runtime.bridge.upstream import Upstream

# vLLM 0.32's names; a counter's family may be named with or without `_total`, a histogram's by its base.
GAUGES = {"running": "vllm:num_requests_running", "kv_use": "vllm:kv_cache_usage_perc"}
WAITING = "vllm:num_requests_waiting_by_reason"  # reason="capacity" (no room: KV or max-num-seqs) or "deferred"
COUNTERS = {
    "prompt_tokens": "vllm:prompt_tokens",
    "cached_prompt_tokens": "vllm:prompt_tokens_cached",
    "generation_tokens": "vllm:generation_tokens",
    "preemptions": "vllm:num_preemptions",
    "prefix_hits": "vllm:prefix_cache_hits",
    "prefix_queries": "vllm:prefix_cache_queries",
}
SUMS = {  # of histograms: seconds finished requests spent in each phase, and how many finished
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
    "decode_s": "vllm:request_decode_time_seconds_sum",
    "finished": "vllm:request_prompt_tokens_count",
    "finished_prompt_tokens": "vllm:request_prompt_tokens_sum",
}
WINDOW_S = 300.0  # preemptions are counted over this, and samples kept this long
RATE_WINDOW_S = 60.0  # rates are read over about this: long enough to hold a few turns, short enough to follow
SAMPLE_EVERY_S = 15.0  # besides each status call: rates are there when someone first looks
# A waiting request needs room for its whole prompt at once: with long prompts a cache half used
# already turns the next one away (recorded: 7 waiting for capacity at 60 % KV use, one running).
KV_FULL_SHARE = 0.5
PREFILL_BOUND_RATIO = 10.0  # prompt tokens computed per token generated, when no request finished to time them


@dataclass(frozen=True)
class Sample:
    """The engines' metrics at one moment, summed over the engines (KV use: the fullest engine's)."""

    at: float
    running: int = 0
    waiting_capacity: int = 0
    waiting_deferred: int = 0
    kv_use: float = 0.0
    prompt_tokens: float = 0.0
    cached_prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    preemptions: float = 0.0
    prefix_hits: float = 0.0
    prefix_queries: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finished: float = 0.0
    finished_prompt_tokens: float = 0.0

    @classmethod
    def of(cls, texts: Sequence[bytes | None], at: float) -> Sample | None:
        """None when no engine's metrics could be read."""
        values: dict[str, float] = {}
        read = False
        for text in texts:
            if text is None:
                continue
            read = True
            for family in families(text):
                for sample in family.samples:
                    field = field_of(family.name, sample.name, sample.labels)
                    if field == "kv_use":
                        values[field] = max(values.get(field, 0.0), sample.value)
                    elif field is not None:
                        values[field] = values.get(field, 0.0) + sample.value
        if not read:
            return None
        found: dict[str, Any] = values | {
            name: int(values.get(name, 0)) for name in ("running", "waiting_capacity", "waiting_deferred")
        }
        return cls(at, **found)


def field_of(family: str, sample: str, labels: dict[str, str]) -> str | None:
    """Which Sample field a sample of vLLM's adds to, if any."""
    for field, name in GAUGES.items():
        if sample == name:
            return field
    if sample == WAITING:
        return {"capacity": "waiting_capacity", "deferred": "waiting_deferred"}.get(labels.get("reason", ""))
    for field, name in COUNTERS.items():
        if sample in (name, f"{name}_total") and family in (name, f"{name}_total"):
            return field
    for field, name in SUMS.items():
        if sample == name:
            return field
    return None


def grown(earlier: Sample, later: Sample, name: str) -> float:
    """How much a counter grew; an engine that restarted counts from zero again (Prometheus' rule)."""
    before, after = getattr(earlier, name), getattr(later, name)
    return float(after - before if after >= before else after)


COUNTED = tuple(
    f.name for f in fields(Sample) if f.name not in ("at", "running", "waiting_capacity", "waiting_deferred", "kv_use")
)


def capacity(earlier: Sample | None, later: Sample, preempted: float | None = None) -> dict[str, Any]:
    """The panel: the state now, rates since `earlier` (None without it), and the verdict."""
    span = later.at - earlier.at if earlier is not None else 0.0
    delta = {name: grown(earlier, later, name) for name in COUNTED} if earlier is not None and span > 0 else None
    computed = None if delta is None else delta["prompt_tokens"] - delta["cached_prompt_tokens"]
    queried = delta["prefix_queries"] if delta is not None else 0.0
    state: dict[str, Any] = {
        "running": later.running,
        "waiting": later.waiting_capacity + later.waiting_deferred,
        "waiting_for_capacity": later.waiting_capacity,
        "kv_use": round(later.kv_use, 4),
        "over_s": round(span, 1) if delta is not None else None,
        "prefill_tokens_per_s": None if computed is None else round(computed / span, 1),
        "decode_tokens_per_s": None if delta is None else round(delta["generation_tokens"] / span, 1),
        "prefix_cache_hit_rate": round(delta["prefix_hits"] / queried, 4) if delta is not None and queried else None,
        "preemptions": preempted if preempted is not None else (None if delta is None else delta["preemptions"]),
    }
    state["verdict"] = verdict(state, delta)
    return state


def verdict(state: dict[str, Any], delta: dict[str, float] | None) -> str:
    """One line, in the field notes' terms, of what limits the engine now."""
    running, waiting, kv = state["running"], state["waiting"], state["kv_use"]
    preempted = state["preemptions"] or 0
    if state["waiting_for_capacity"] and (kv >= KV_FULL_SHARE or preempted):
        return f"KV full: {waiting} requests waiting for cache space behind {running} running (KV cache {kv:.0%})"
    if preempted:
        return f"KV full: {preempted:.0f} requests preempted in the last minutes (their prompts computed again)"
    if waiting:
        return f"queue: {waiting} requests waiting behind {running} running (the engine's --max-num-seqs)"
    if delta is None:
        return "idle" if not running else f"decoding: {running} streams"
    prefill, decode = state["prefill_tokens_per_s"], state["decode_tokens_per_s"]
    if not running and not prefill and not decode:
        return "idle"
    finished = delta["finished"]
    timed = finished > 0 and delta["prefill_s"] + delta["decode_s"] > 0
    if (delta["prefill_s"] > delta["decode_s"]) if timed else prefill > PREFILL_BOUND_RATIO * max(decode, 1.0):
        context = delta["finished_prompt_tokens"] / finished if finished else None
        who = f"{finished:.0f} requests re-reading {context / 1000:,.1f}k-token contexts" if context else "long prompts"
        hit = state["prefix_cache_hit_rate"]
        cached = f", {hit:.0%} from the prefix cache" if hit is not None else ""
        return f"prefill-bound: {who}{cached} ({prefill:,.0f} prompt tokens/s computed, {decode:,.0f} generated)"
    return f"decoding: {running} streams now, {decode:,.0f} tokens/s over the last {state['over_s']:.0f} s"


class CapacityWatch:
    """The samples of the last WINDOW_S: taken at each status call, and every SAMPLE_EVERY_S."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.samples: deque[Sample] = deque(maxlen=512)

    def add(self, texts: Sequence[bytes | None]) -> Sample | None:
        now = self.clock()
        sample = Sample.of(texts, now)
        if sample is not None:
            self.samples.append(sample)
        while self.samples and self.samples[0].at < now - WINDOW_S:
            self.samples.popleft()
        return sample

    def view(self) -> dict[str, Any] | None:
        """The panel from the latest sample; None while there is none."""
        if not self.samples:
            return None
        latest = self.samples[-1]
        earlier = [s for s in list(self.samples)[:-1] if s.at >= latest.at - RATE_WINDOW_S] or list(self.samples)[-2:-1]
        oldest = self.samples[0]
        preempted = grown(oldest, latest, "preemptions") if oldest is not latest else None
        return capacity(earlier[0] if earlier else None, latest, preempted)

    async def sample(self, upstream: Upstream, timeout_s: float) -> list[tuple[bool, bytes | None]]:
        """Each engine's `/metrics` answer (whether it answered, its body), added as a sample."""
        answers = await upstream.fetch_each("/metrics", timeout_s)
        self.add([body for _, body in answers])
        return answers

    async def keep_sampling(self, upstream: Upstream, timeout_s: float) -> None:
        """Sample every SAMPLE_EVERY_S (runs until cancelled)."""
        while True:
            await self.sample(upstream, timeout_s)
            await asyncio.sleep(SAMPLE_EVERY_S)
