"""Which GPU types `pod up` tries, in which order, and in which data centres: only cards an image of ours serves at
the template's architecture and on which its model fits at its context (runtime plan's verdict), cheapest first,
each in the data centres RunPod says have stock, best first."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from runtime.engine.recipes import RecipeError, load_recipe
from runtime.runpod.api import RunPodError
from runtime.runpod.payloads import GpuType
from runtime.settings import SettingsError
from runtime.sizing.cards import CARDS, OURS, Card, card_of
from runtime.sizing.errors import PlanError
from runtime.sizing.fit import SESSIONS, Model, fit
from runtime.sizing.model import model_of_recipe, sizing_settings
from runtime.sizing.offers import Offer, named_offer, offer_of

STOCK_ORDER = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}  # NONE: not tried


@dataclass(frozen=True)
class Choice:
    """A GPU type to try, and the data centres to try it in (none: let RunPod's scheduler choose)."""

    gpu: str
    centres: tuple[str, ...] = ()
    price_per_hour: float | None = None


def template_model(env: Mapping[str, str]) -> Model | None:
    """The model a template's pod serves (its VL_MODEL at its VL_CTX), sized as `runtime plan` sizes it; None when
    the template names something `plan` cannot size offline (a refusal would then be a guess)."""
    try:
        settings = sizing_settings(env)
        return model_of_recipe(load_recipe(settings.model), environ={}, settings=settings)
    except (RecipeError, PlanError, SettingsError):
        return None


def choices(
    catalogue: Sequence[GpuType],
    target: str | None,
    asked: Sequence[str],
    model: Model | None,
    max_price: float | None,
    cloud: str = "secure",
    say: Callable[[str], None] = print,
) -> list[Choice]:
    """The GPU types to try: `asked` in the user's order, else every catalogue type of the target's architecture,
    cheapest first; each one an image of ours serves here, on which the model fits, within `max_price` (a card
    without a price is not: RunPod's catalogue could not be read). RunPodError in one line when none is left, naming
    the smallest card that would do."""
    entries = {str(entry["id"]): entry for entry in catalogue}
    if asked:
        candidates = [offer_for(gpu, entries, cloud) for gpu in asked]
        wrong = [offer.card for offer in candidates if target and offer.card.arch != target]
        if wrong:
            raise RunPodError(mismatch(wrong[0], target or ""))
    else:
        candidates = [offer_for(gpu, entries, cloud) for gpu in entries if not target or card_of(gpu).arch == target]
        candidates.sort(key=lambda offer: (offer.price_per_hour is None, offer.price_per_hour or 0.0))
    kept = []
    for offer in candidates:
        if model is not None and not (verdict := fit(model, offer.card)).fits:
            say(f"pod: {offer.card.id}: skipped: {verdict.why}")
        elif max_price is not None and offer.price_per_hour is None:  # a cap passes no card it cannot check
            say(f"pod: {offer.card.id}: skipped: RunPod gave no price for it, so --max-price {max_price:g} cannot hold")
        elif max_price is not None and offer.price_per_hour is not None and offer.price_per_hour > max_price:
            say(f"pod: {offer.card.id}: skipped: ${offer.price_per_hour:.2f}/h is over --max-price {max_price:g}")
        else:
            kept.append(Choice(offer.card.id, centres(entries.get(offer.card.id)), offer.price_per_hour))
    if not kept:
        raise RunPodError(nothing_fits(model, [offer.card for offer in candidates], max_price))
    return kept


def offer_for(gpu: str, entries: Mapping[str, GpuType], cloud: str) -> Offer:
    """The offer `gpu` names, by RunPod's id or the card's name ("RTX 4090", as `plan` shows it): the catalogue's,
    else the built-in table's, unpriced; else a card of unknown memory that its architecture's check refuses."""
    if gpu in entries:
        return offer_of(entries[gpu], cloud)
    return named_offer(gpu, [offer_of(entry, cloud) for entry in entries.values()]) or Offer(card_of(gpu))


def centres(entry: GpuType | None) -> tuple[str, ...]:
    """The data centres RunPod lists stock in for a GPU type, most first (the notes: naming dataCenterIds is
    usually enough to be placed)."""
    listed = [c for c in (entry or GpuType(id="")).get("dataCenters") or [] if c["availability"] in STOCK_ORDER]
    return tuple(c["id"] for c in sorted(listed, key=lambda c: STOCK_ORDER[c["availability"]]))


def mismatch(card: Card, target: str) -> str:
    """An image never goes on a card of another architecture: which image would serve it."""
    serves = card.image
    if serves:
        other = f"the {serves} image serves it (build.py --arch {serves} --push --runpod)"
    else:
        other = f"no image of ours serves {card.arch} (ours: {OURS})"
    return f"{card.id} is an {card.arch} card and this template's image is for {target}: {other}"


def nothing_fits(model: Model | None, tried: Sequence[Card], max_price: float | None) -> str:
    """The refusal when no card is left: what was asked, and the smallest card that would hold it."""
    what = f"{model.name} at {model.context:,} tokens for {SESSIONS} sessions" if model else "the pod"
    price = f" within --max-price {max_price:g}" if max_price is not None else ""
    smallest = next(
        (c for c in sorted(CARDS, key=lambda c: c.memory_mib) if model and fit(model, c).fits and c.image), None
    )
    hint = (
        f": the smallest card that holds it is the {smallest.name} ({smallest.id}, image {smallest.image})"
        if smallest
        else ""
    )
    names = ", ".join(card.name for card in tried) or "no card"
    return f"{what} fits none of {names}{price}{hint}"
