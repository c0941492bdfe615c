"""Every card's verdict for a model (`Row`: the fit, whether an image of ours serves the card, and on a cluster's card
that does not hold it alone, the fewest nodes of it that do), the usable ones first, and the one line that says which
card to rent, how many nodes of which card when no single card holds it (`nodes`), or why none will do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.engine.offload import auto_offload_gib
from runtime.sizing.cards import GIB, OURS, RUNPOD_RAM_GB_PER_GPU, Card, runpod_ram_gib
from runtime.sizing.fit import Fit, Model, fit
from runtime.sizing.nodes import (
    CLUSTER_CARDS,
    GPUS_PER_NODE,
    MAX_NODES,
    NodePlan,
    best_plan,
    cluster_offers,
    fewest_nodes,
)
from runtime.sizing.offers import Offer


@dataclass(frozen=True)
class Row:
    offer: Offer
    fit: Fit
    nodes: NodePlan | None = None  # a cluster's card that does not hold the model alone: the fewest nodes that do

    @property
    def usable(self) -> bool:
        """Fits, and an image of ours serves its architecture."""
        return self.fit.fits and self.offer.card.image is not None

    def as_json(self, model: Model) -> dict[str, Any]:
        card = self.offer.card
        return {
            "gpu": card.id,
            "memory_gb": round(card.memory_gib, 2),
            "architecture": card.arch,
            "fits": self.fit.fits,
            "why": self.why(),
            "max_context": self.fit.max_context,
            "kv_tokens": self.fit.kv_tokens,
            "concurrency": self.fit.concurrency,
            "kv_offload_gib": self.fit.offload_gib,
            "kv_offload_auto": auto_offload(model, card),
            "price_per_hour": self.offer.price_per_hour,
            "stock": self.offer.stock,
            "image": card.image,
            "measured": dict(model.speeds).get(card.id),
            "nodes": self.nodes.as_json() if self.nodes else None,
        }

    def why(self) -> str:
        if self.fit.fits and self.offer.card.image is None:
            return f"{self.fit.why}; no image of ours serves {self.offer.card.arch} (ours: {OURS})"
        if self.nodes:
            return f"{self.fit.why}; across GPUs: {self.nodes.line()}"
        return self.fit.why


def auto_offload(model: Model, card: Card) -> dict[str, int] | None:
    """What VL_KV_OFFLOAD=auto gives one engine of `model` on a RunPod pod of `card` (its RAM as cards.py assumes):
    the GiB, and the prefix tokens they keep beyond the GPU's KV; None when the card's RAM is not known, the model
    does not fit, is hybrid (auto is off) or its KV per token is unknown."""
    ram = runpod_ram_gib(card, model.gpus)
    if ram is None or model.hybrid or not model.kv_bytes_per_token:
        return None
    gib = auto_offload_gib(ram, model.host_ram_gib)
    return {"gib": gib, "tokens": gib * GIB // model.kv_bytes_per_token} if gib else None


def offload_line(model: Model, rows: Sequence[Row]) -> str | None:
    """One line: the prefix tokens VL_KV_OFFLOAD=auto keeps beyond each card's KV, for the cards whose RunPod RAM
    is known (or why auto is off for this model); None when no such card is among the rows."""
    known = [row for row in rows if runpod_ram_gib(row.offer.card) is not None]
    if not known:
        return None
    head = f"VL_KV_OFFLOAD=auto (RunPod's RAM taken as {RUNPOD_RAM_GB_PER_GPU} GB a GPU)"
    if model.hybrid:
        return f"{head}: off for {model.name}, a hybrid (Mamba) model"
    said = []
    for row in known:
        auto = auto_offload(model, row.offer.card)
        if auto is not None and row.fit.kv_tokens:
            said.append(
                f"{row.offer.card.name}: {auto['gib']} GiB, {auto['tokens']:,} prefix tokens beyond "
                f"the GPU's {row.fit.kv_tokens:,}"
            )
    return f"{head}: {'; '.join(said)}" if said else None


def rows_for(model: Model, found: Iterable[Offer], sessions: int) -> list[Row]:
    """Every card's verdict, the usable ones first (cheapest, or smallest when prices are unknown)."""
    rows = []
    for offer in found:
        alone = fit(model, offer.card, sessions)
        across = fewest_nodes(model, offer, sessions) if not alone.fits and offer.card.id in CLUSTER_CARDS else None
        rows.append(Row(offer, alone, across))
    return sorted(rows, key=lambda r: (not r.usable, r.offer.price_per_hour or 0.0, r.offer.card.memory_mib))


def verdict(model: Model, rows: Sequence[Row], sessions: int) -> str:
    """The first line: the card to rent, or why none will do."""
    head = f"{model.name} at {model.context:,} tokens for {sessions} session{'s' * (sessions > 1)}"
    if model.kv_bytes_per_token is None:
        return f"{head}: cannot say: a token's KV size is unknown (neither measured nor read from the Hub)"
    usable = [row for row in rows if row.usable]
    host = f"; the host needs {model.host_ram_gib:g} GB of RAM besides" if model.host_ram_gib else ""
    if usable:
        best = usable[0]
        price = f" at ${best.offer.price_per_hour:.2f}/h" if best.offer.price_per_hour else ""
        which = "cheapest" if best.offer.price_per_hour else "smallest"
        name = f"{model.gpus} x {best.offer.card.name}" if model.gpus > 1 else best.offer.card.name
        return f"{head}: {which} card that fits: {name}{price} (image {best.offer.card.image}){host}"
    fitting = [row.offer.card.name for row in rows if row.fit.fits]
    if fitting:
        return f"{head}: fits {', '.join(fitting)}, but no image of ours serves them (ours: {OURS})"
    across = best_plan(
        [plan for offer in cluster_offers(row.offer for row in rows) if (plan := fewest_nodes(model, offer, sessions))]
    )
    if across is None:
        return f"{head}: fits none of these cards, nor {MAX_NODES} nodes of {GPUS_PER_NODE} of a cluster's cards"
    command = f"python -m runtime pod up --nodes {max(2, across.nodes)} --gpu '{across.offer.card.id}'"
    return f"{head}: no single card holds it: {across.line()}{host} ({command})"
