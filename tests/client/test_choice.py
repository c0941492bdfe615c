"""`pod up`'s choice of GPU types under `--max-price` (runtime/sizing/choice.py): a cap caps. A card RunPod gave no
price for (its catalogue could not be read: `pod up` then falls back to the usual cards, unpriced) is never taken
under a cap; it was taken, every one of them, whatever the cap said."""

from __future__ import annotations

import pytest

from runtime.runpod.api import RunPodError
from runtime.runpod.payloads import GpuType
from runtime.sizing.cards import DEFAULT_GPUS
from runtime.sizing.choice import choices, template_model
from tests.support.net import free_port

UNPRICED = [GpuType(id=gpu) for gpu in DEFAULT_GPUS["sm89"]]  # what `pod up` reads when RunPod cannot say
PRICED = [
    GpuType(id="NVIDIA L40S", memory=48, price={"secure": 0.86, "community": 0.6}),
    GpuType(id="NVIDIA GeForce RTX 4090", memory=24, price={"secure": 0.69, "community": 0.34}),
]


def test_a_price_cap_that_no_price_can_check_is_refused_in_one_line() -> None:
    """RunPod's catalogue could not be read: no card has a price, so the cap cannot be applied; once each card was
    skipped in a line of its own and the refusal said no card fit "within --max-price" (before that, every card
    was taken)."""
    said: list[str] = []
    with pytest.raises(RunPodError) as refused:
        choices(UNPRICED, "sm89", [], None, 2.0, say=said.append)
    assert str(refused.value) == (
        "--max-price 2 cannot be applied: RunPod gave no price for any card (its catalogue could not be read): "
        "try again later, or go without --max-price"
    )
    assert said == []
    with pytest.raises(RunPodError, match="cannot be applied"):
        choices(UNPRICED, "sm89", ["NVIDIA L40S"], None, 2.0, say=said.append)  # the cards asked for: the same
    assert [choice.gpu for choice in choices(UNPRICED, "sm89", [], None, None, say=said.append)] == list(
        DEFAULT_GPUS["sm89"]
    )  # without a cap, the usual cards are tried as ever


def test_a_card_without_a_price_in_a_catalogue_that_prices_others_is_skipped_under_a_cap() -> None:
    said: list[str] = []
    catalogue = [*PRICED, GpuType(id="NVIDIA L40", memory=48)]
    kept = choices(catalogue, "sm89", [], None, 2.0, say=said.append)
    assert [choice.gpu for choice in kept] == ["NVIDIA GeForce RTX 4090", "NVIDIA L40S"]
    assert said == ["pod: NVIDIA L40: skipped: RunPod gave no price for it, so --max-price 2 cannot hold"]


def test_a_price_cap_keeps_the_priced_cards_within_it_cheapest_first() -> None:
    said: list[str] = []
    kept = choices(PRICED, "sm89", [], None, 0.8, say=said.append)
    assert [(choice.gpu, choice.price_per_hour) for choice in kept] == [("NVIDIA GeForce RTX 4090", 0.69)]
    assert said == ["pod: NVIDIA L40S: skipped: $0.86/h is over --max-price 0.8"]


CATALOGUE = [
    *PRICED,
    GpuType(id="NVIDIA RTX 6000 Ada Generation", memory=48, price={"secure": 0.77}),
    GpuType(id="NVIDIA GeForce RTX 5090", memory=32, price={"secure": 0.89}),  # sm120: not the target's
]


def test_a_model_whose_kv_cannot_be_sized_starts_from_the_cards_that_hold_its_weights_and_says_so() -> None:
    """kimi's KV size is read from its repository's config.json: without the Hub, every card was refused ("its bytes
    per token are unknown"); a recipe with no facts at all (qwen38) was tried on every card, 24 GB ones included,
    without a word. Now the Hub is asked (the user's HF_ENDPOINT), and when it cannot say, a line says so and the
    cards that hold the weights are tried, largest first."""
    nowhere = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # a Hub that does not answer
    kimi = template_model({"VL_MODEL": "kimi"}, nowhere)
    assert kimi is not None and kimi.kv_bytes_per_token is None and kimi.weights_gib == pytest.approx(28.4)
    said: list[str] = []
    kept = choices(CATALOGUE, "sm89", [], kimi, None, say=said.append)
    assert [choice.gpu for choice in kept] == ["NVIDIA RTX 6000 Ada Generation", "NVIDIA L40S"]  # 48 GB, largest first
    assert said[0].startswith("pod: cannot size kimi's KV (") and said[0].endswith(
        "trying the cards that hold its weights (28.4 GiB), largest first"
    )
    assert said[1].startswith("pod: NVIDIA GeForce RTX 4090: skipped: 31.0 GiB held besides the KV is more than")
    qwen38 = template_model({"VL_MODEL": "qwen38"}, nowhere)
    assert qwen38 is not None and (qwen38.weights_gib, qwen38.context) == (None, 262144)
    said.clear()
    kept = choices(CATALOGUE, "sm89", [], qwen38, None, say=said.append)
    assert [choice.gpu for choice in kept][-1] == "NVIDIA GeForce RTX 4090"  # held to the end, not tried first
    assert said == [f"pod: cannot size qwen38's KV ({qwen38.source}): trying the cards that hold its weights (size "
                    "unknown), largest first"]  # fmt: skip
    assert "cannot read Qwen/Qwen3.8-27B-W4A16 on the Hub" in qwen38.source
