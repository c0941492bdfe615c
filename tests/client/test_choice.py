"""`pod up`'s choice of GPU types under `--max-price` (runtime/sizing/choice.py): a cap caps. A card RunPod gave no
price for (its catalogue could not be read: `pod up` then falls back to the usual cards, unpriced) is never taken
under a cap; it was taken, every one of them, whatever the cap said."""

from __future__ import annotations

import pytest

from runtime.runpod.api import RunPodError
from runtime.runpod.payloads import GpuType
from runtime.sizing.cards import DEFAULT_GPUS
from runtime.sizing.choice import choices

UNPRICED = [GpuType(id=gpu) for gpu in DEFAULT_GPUS["sm89"]]  # what `pod up` reads when RunPod cannot say
PRICED = [
    GpuType(id="NVIDIA L40S", memory=48, price={"secure": 0.86, "community": 0.6}),
    GpuType(id="NVIDIA GeForce RTX 4090", memory=24, price={"secure": 0.69, "community": 0.34}),
]


def test_a_price_cap_takes_no_card_whose_price_is_unknown_and_says_why() -> None:
    said: list[str] = []
    with pytest.raises(RunPodError, match=r"within --max-price 2"):
        choices(UNPRICED, "sm89", [], None, 2.0, say=said.append)
    assert said == [f"pod: {gpu}: skipped: RunPod gave no price for it, so --max-price 2 cannot hold" for gpu in
                    DEFAULT_GPUS["sm89"]]  # fmt: skip
    assert [choice.gpu for choice in choices(UNPRICED, "sm89", [], None, None, say=said.append)] == list(
        DEFAULT_GPUS["sm89"]
    )  # without a cap, the usual cards are tried as ever


def test_a_price_cap_keeps_the_priced_cards_within_it_cheapest_first() -> None:
    said: list[str] = []
    kept = choices(PRICED, "sm89", [], None, 0.8, say=said.append)
    assert [(choice.gpu, choice.price_per_hour) for choice in kept] == [("NVIDIA GeForce RTX 4090", 0.69)]
    assert said == ["pod: NVIDIA L40S: skipped: $0.86/h is over --max-price 0.8"]
