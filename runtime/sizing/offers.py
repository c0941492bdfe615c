"""The cards on offer: RunPod's catalogue with prices and stock when RUNPOD_API_KEY is set, else the built-in table,
unpriced; a card found by RunPod's id or the name the tables show."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from runtime.runpod.api import KEY_VARIABLE, RunPodClient
from runtime.runpod.payloads import GpuType
from runtime.settings import quoted
from runtime.sizing.cards import CARDS, Card, card_of
from runtime.sizing.errors import NotAllowed


@dataclass(frozen=True)
class Offer:
    """A card as RunPod rents it now (its catalogue), or as the built-in table knows it (no price, no stock)."""

    card: Card
    price_per_hour: float | None = None
    stock: str | None = None  # RunPod's availability: HIGH, MEDIUM, LOW, NONE


def offers(gpus: Sequence[str], environ: Mapping[str, str] = os.environ) -> tuple[list[Offer], str]:
    """The cards to size: RunPod's catalogue with prices and stock when RUNPOD_API_KEY is set, else the built-in
    table; narrowed to `gpus` (RunPod's ids or the cards' names) when given. Also a line saying which."""
    key = environ.get(KEY_VARIABLE, "")
    if key:
        with RunPodClient(key) as api:
            found = [offer_of(entry) for entry in api.gpu_types()]
        said = "RunPod's catalogue (secure cloud prices)"
    else:
        found = [Offer(card) for card in CARDS]
        said = f"the built-in table of common cards (prices with {KEY_VARIABLE})"
    if gpus:
        found = [asked_offer(gpu, found, bool(key)) for gpu in gpus]
    return found, said


def named_offer(asked: str, found: Iterable[Offer]) -> Offer | None:
    """The offer whose card `asked` names (its id or its name, in any case): one of `found`, else a card of the
    built-in table, unpriced (one the catalogue does not list now); None when no card answers to it."""
    listed = [*found, *(Offer(card) for card in CARDS)]
    return next((offer for offer in listed if offer.card.answers_to(asked)), None)


def asked_offer(asked: str, found: Sequence[Offer], catalogue: bool) -> Offer:
    """The offer `asked` names; NotAllowed listing the names otherwise, since an unknown card sized as 0 GiB would
    be refused for a reason that is not true."""
    offer = named_offer(asked, found)
    if offer is None:
        where = "RunPod's catalogue" if catalogue else f"the built-in table (RunPod's catalogue with {KEY_VARIABLE})"
        names = ", ".join(listed.card.name for listed in found)
        raise NotAllowed(f"--gpu {quoted(asked)} is not allowed: expected the id or name of a card in {where}: {names}")
    return offer


def offer_of(entry: GpuType, cloud: str = "secure") -> Offer:
    """An entry of RunPod's `GET /v2/catalog/gpus` (its schema GpuType), priced in `cloud`."""
    prices = entry.get("price") or {}
    price = prices.get("community") if cloud == "community" else prices.get("secure")
    card = card_of(str(entry["id"]), float(entry.get("memory") or 0), str(entry.get("name") or ""))
    return Offer(card, float(price) if price else None, entry.get("availability"))
