"""Which GPU types `pod up` tries, in which order, and in which data centres: only cards an image of ours serves at
the template's architecture and on which its model fits at its context (runtime plan's verdict), cheapest first,
each in the data centres RunPod says have stock, best first."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from runtime.engine.command import VLLM_DEFAULT_UTIL, tuned_options
from runtime.engine.recipes import RecipeError, load_recipe
from runtime.runpod.api import RunPodError
from runtime.runpod.payloads import GpuType
from runtime.settings import SettingsError
from runtime.sizing.cards import CARDS, OURS, Card, card_of
from runtime.sizing.errors import PlanError
from runtime.sizing.fit import SESSIONS, Fit, Model, fit
from runtime.sizing.model import model_of_recipe, sizing_settings
from runtime.sizing.nodes import CLUSTER_CARDS, fewest_nodes, split_on
from runtime.sizing.offers import Offer, named_offer, offer_of

STOCK_ORDER = {"HIGH": 0, "MEDIUM": 1, "LOW": 2}  # NONE: not tried


@dataclass(frozen=True)
class Choice:
    """A GPU type to try, and the data centres to try it in (none: let RunPod's scheduler choose)."""

    gpu: str
    centres: tuple[str, ...] = ()
    price_per_hour: float | None = None
    split: str = ""  # a cluster's: how its nodes' GPUs divide the model (runtime/sizing/nodes.py)


def template_model(env: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> Model | None:
    """The model a template's pod serves (its VL_MODEL at its VL_CTX), sized as `runtime plan` sizes it: offline from
    its recipe's facts, else from its repository on the Hub (`pod up` has the network; the user's HF_ENDPOINT and
    HF_TOKEN); what neither tells is unknown (`unsized`: no KV size, perhaps no weights). None for a template whose
    settings are wrong (a verdict would then be a guess)."""
    hub = {name: environ[name] for name in ("HF_ENDPOINT", "HF_TOKEN") if environ.get(name)}
    try:
        settings = sizing_settings(env)
        recipe = load_recipe(settings.model)
    except (RecipeError, SettingsError):
        return None
    try:
        return model_of_recipe(recipe, environ=hub, settings=settings)
    except PlanError as error:
        options, window = tuned_options(settings, recipe)
        utilization = float(str(options.get("gpu-memory-utilization", VLLM_DEFAULT_UTIL)))
        return Model(recipe.name, window, recipe.max_context, None, None, None, utilization, source=str(error))
    except SettingsError:
        return None


def unsized(model: Model | None) -> bool:
    """Whether `plan` could not tell the KV a token of the model takes (neither measured nor read from the Hub)."""
    return model is not None and model.kv_bytes_per_token is None and model.kv_fixed_bytes is None


def holds_weights(model: Model, card: Card) -> Fit:
    """A card's verdict on what vLLM holds besides the KV (the weights, the overhead), the KV's size left aside."""
    return fit(replace(model, kv_bytes_per_token=1, context=1, max_context=1), card)


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
    candidates = candidate_offers(entries, asked, target, cloud, entries)
    if max_price is not None and candidates and all(offer.price_per_hour is None for offer in candidates):
        raise RunPodError(
            f"--max-price {max_price:g} cannot be applied: RunPod gave no price for any card (its catalogue could not "
            "be read): try again later, or go without --max-price"
        )
    if unsized(model) and model is not None:  # tried from the cards that hold its weights, said once
        weights = f"its weights ({model.weights_gib:.1f} GiB)" if model.weights_gib else "its weights (size unknown)"
        say(f"pod: cannot size {model.name}'s KV ({model.source}): trying the cards that hold {weights}, largest first")
        if not asked:
            candidates.sort(key=lambda offer: -offer.card.memory_mib)
    kept = []
    for offer in candidates:
        check = holds_weights if unsized(model) else fit
        if model is not None and not (verdict := check(model, offer.card)).fits:
            say(f"pod: {offer.card.id}: skipped: {verdict.why}")
        elif over := priced_out(offer, max_price):
            say(f"pod: {offer.card.id}: skipped: {over}")
        else:
            kept.append(Choice(offer.card.id, centres(entries.get(offer.card.id)), offer.price_per_hour))
    if not kept:
        raise RunPodError(nothing_fits(model, [offer.card for offer in candidates], max_price))
    return kept


def candidate_offers(
    entries: Mapping[str, GpuType], asked: Sequence[str], target: str | None, cloud: str, gpus: Iterable[str]
) -> list[Offer]:
    """`asked` in the user's order (each of the target's architecture, else RunPodError in one line), or those of
    `gpus` of the target's architecture, cheapest first."""
    if asked:
        offers = [offer_for(gpu, entries, cloud) for gpu in asked]
        wrong = [offer.card for offer in offers if target and offer.card.arch != target]
        if wrong:
            raise RunPodError(mismatch(wrong[0], target or ""))
        return offers
    offers = [offer_for(gpu, entries, cloud) for gpu in gpus if not target or card_of(gpu).arch == target]
    return sorted(offers, key=lambda offer: (offer.price_per_hour is None, offer.price_per_hour or 0.0))


def priced_out(offer: Offer, max_price: float | None) -> str | None:
    """Why `--max-price` leaves the offer out (a cap passes no card it cannot check); None when it does not."""
    if max_price is not None and offer.price_per_hour is None:
        return f"RunPod gave no price for it, so --max-price {max_price:g} cannot hold"
    if max_price is not None and offer.price_per_hour is not None and offer.price_per_hour > max_price:
        return f"${offer.price_per_hour:.2f}/h is over --max-price {max_price:g}"
    return None


def cluster_choices(
    catalogue: Sequence[GpuType],
    target: str | None,
    asked: Sequence[str],
    model: Model | None,
    nodes: int,
    gpus_per_node: int,
    max_price: float | None,
    cloud: str = "secure",
    say: Callable[[str], None] = print,
) -> list[Choice]:
    """The GPU types to try for a cluster of `nodes` nodes of `gpus_per_node` GPUs: `asked` in the user's order, else
    the cards RunPod's clusters rent of the target's architecture, cheapest first; each one an image of ours serves
    here, whose nodes hold the model (its split said), within `max_price` (a GPU's price an hour). RunPodError in one
    line when none is left."""
    entries = {str(entry["id"]): entry for entry in catalogue}
    candidates = candidate_offers(entries, asked, target, cloud, CLUSTER_CARDS)
    if not candidates:
        rented = ", ".join(card_of(gpu).name for gpu in CLUSTER_CARDS)
        raise RunPodError(
            f"RunPod's clusters rent {rented}, none of them an {target} card: use a template of the sm90, sm100 or "
            "sm80 image, or pass --gpu TYPE"
        )
    kept = []
    for offer in candidates:
        plan = split_on(model, offer, nodes, gpus_per_node) if model is not None else None
        if model is not None and plan is None:
            fewest = fewest_nodes(model, offer, gpus_per_node=gpus_per_node)
            more = f" ({fewest.nodes} do: --nodes {fewest.nodes})" if fewest else ""
            say(
                f"pod: {offer.card.id}: skipped: {nodes} nodes of {gpus_per_node} do not hold {model.name} at "
                f"{model.context:,} tokens for {SESSIONS} sessions{more}"
            )
        elif over := priced_out(offer, max_price):
            say(f"pod: {offer.card.id}: skipped: {over}")
        else:
            kept.append(Choice(offer.card.id, (), offer.price_per_hour, str(plan.split) if plan else ""))
    if not kept:
        names = ", ".join(offer.card.name for offer in candidates)
        raise RunPodError(f"no cluster of {nodes} nodes of {gpus_per_node} x {names} will do (each said above)")
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
