"""`pod gpus`: RunPod's GPU types as `pod up` sees them (memory, architecture, our image, prices, stock); without a
key, the built-in table, unpriced."""

from __future__ import annotations

from runtime.client.columns import print_columns
from runtime.client.pods.facade import Pods
from runtime.runpod.api import KEY_VARIABLE
from runtime.runpod.payloads import GpuType
from runtime.sizing.cards import CARDS, card_of


def gpus(pods: Pods | None) -> int:
    """RunPod's GPU types, as `pod up` sees them (the notes' `pod.py stock`); without a key (None), the built-in
    table `plan` sizes without one, unpriced, since a first look at the cards needs no account."""
    if pods is None:
        print(f"(the built-in table of common cards: prices and stock need {KEY_VARIABLE})")
    # The table's cards as catalogue entries: card_of finds each by its id; "memory" only orders them.
    catalogue = pods.api.gpu_types() if pods else [GpuType(id=card.id, memory=card.memory_gib) for card in CARDS]
    rows = [("id", "GiB", "arch", "image", "secure $/h", "community $/h", "stock")]
    for entry in sorted(catalogue, key=lambda e: (e.get("memory") or 0, str(e["id"]))):
        card = card_of(str(entry["id"]), float(entry.get("memory") or 0), str(entry.get("name") or ""))
        price = entry.get("price") or {}
        secure, community = (f"{cost:.2f}" if (cost := price.get(c)) else "-" for c in ("secure", "community"))
        stock = str(entry.get("availability") or "-")
        rows.append((card.id, f"{card.memory_gib:.1f}", card.arch, card.image or "-", secure, community, stock))
    print_columns(rows)
    return 0
