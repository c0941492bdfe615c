"""Past one card: how many nodes of which card hold a model, and how it is split over their GPUs, as `runtime plan`
says it for a model no single card holds and as `pod up --nodes` checks a cluster before creating it.

A node is what RunPod's Instant Clusters rent: `GPUS_PER_NODE` cards of one type (H100, H200, B200, A100). Within a
node the engine splits by tensor parallelism (TP: every layer over the node's GPUs, over NVLink); across nodes either
each node holds a whole replica (data parallel, DP: more sessions and tokens a second, each agent pinned to its
replica) when one node's GPUs hold the model, or one engine's layers are pipelined across the nodes (PP) with TP
inside each when none does. vLLM's own multi-node engine runs both (`--nnodes`, `--headless`; no Ray).

The fit is `fit`'s: the weights and the KV spread over every GPU of an engine, vLLM's overhead counted once per GPU,
the same margins as on one card.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.sizing.cards import BY_ID
from runtime.sizing.fit import OVERHEAD_GIB, SESSIONS, Fit, Model, fit
from runtime.sizing.offers import Offer

# The cards RunPod's Instant Clusters offer (its instant-clusters pages: H100, H200, B200, A100), by RunPod's ids.
CLUSTER_CARDS = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA B200", "NVIDIA A100-SXM4-80GB")
GPUS_PER_NODE = 8  # a cluster node is a whole machine: 8 GPUs on NVLink
MAX_NODES = 8  # how far the plan looks (64 GPUs); the API takes more nodes, a model that needs them is not our case
TP_SIZES = (1, 2, 4, 8)  # tensor parallelism splits attention heads: a power of two that divides them


@dataclass(frozen=True)
class Split:
    """How an engine's GPUs divide the model: TP within a node, PP stages across nodes, DP replicas in all."""

    tp: int
    pp: int
    dp: int

    def __str__(self) -> str:
        if self.pp > 1:
            return f"TP {self.tp} x PP {self.pp} (tensor parallel in each node, the pipeline across {self.pp} nodes)"
        replicas = f"{self.dp} replicas" if self.dp > 1 else "one replica"
        return f"TP {self.tp} x DP {self.dp} ({replicas} of {self.tp} GPU{'s' * (self.tp > 1)}, each agent pinned)"

    @property
    def mode(self) -> str:
        """`pp` (one engine across the nodes) or `dp` (a replica per TP group)."""
        return "pp" if self.pp > 1 else "dp"


@dataclass(frozen=True)
class NodePlan:
    """`nodes` nodes of `gpus_per_node` cards of one offer, the split over them, and the fit of one engine."""

    offer: Offer
    nodes: int
    gpus_per_node: int
    split: Split
    fit: Fit

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def price_per_hour(self) -> float | None:
        """Every GPU's price (the catalogue's, per GPU); None when it has none."""
        price = self.offer.price_per_hour
        return round(price * self.gpus, 2) if price else None

    def line(self) -> str:
        """`2 nodes of 8 x H100 SXM: TP 8 x PP 2 (…) (image sm90) at $55.84/h`."""
        where = f"{self.nodes} nodes" if self.nodes > 1 else "one node"
        image = f"image {self.offer.card.image}" if self.offer.card.image else "no image of ours"
        price = f" at ${self.price_per_hour:.2f}/h" if self.price_per_hour else ""
        return f"{where} of {self.gpus_per_node} x {self.offer.card.name}: {self.split} ({image}){price}"

    def as_json(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "tensor_parallel": self.split.tp,
            "pipeline_parallel": self.split.pp,
            "data_parallel": self.split.dp,
            "kv_tokens": self.fit.kv_tokens,
            "price_per_hour": self.price_per_hour,
        }


def on_gpus(model: Model, gpus: int) -> Model:
    """The model as one engine over `gpus` GPUs: a measured resident size keeps its weights and moves its overhead
    (counted once per GPU) to the new count."""
    resident = model.resident_gib
    if resident is not None:
        resident += OVERHEAD_GIB * (gpus - model.gpus)
    return dataclasses.replace(model, gpus=gpus, resident_gib=resident)


def split_on(
    model: Model, offer: Offer, nodes: int, gpus_per_node: int = GPUS_PER_NODE, sessions: int = SESSIONS
) -> NodePlan | None:
    """How `nodes` nodes of `gpus_per_node` of the offer's cards serve `sessions` full windows of the model at once:
    replicas of the fewest GPUs of a node that hold their share of the sessions (data parallel: each agent pinned to
    one, so a replica holds its own share only, never fewer than two), else one engine pipelined across all the
    nodes with TP over each node's GPUs; None when even that does not hold it."""
    for tp in (size for size in TP_SIZES if size <= gpus_per_node and gpus_per_node % size == 0):
        replicas = nodes * (gpus_per_node // tp)
        share = max(min(sessions, SESSIONS), math.ceil(sessions / replicas))
        verdict = fit(on_gpus(model, tp), offer.card, share)
        if verdict.fits:
            return NodePlan(offer, nodes, gpus_per_node, Split(tp, 1, replicas), verdict)
    if nodes < 2:
        return None
    verdict = fit(on_gpus(model, nodes * gpus_per_node), offer.card, sessions)
    if verdict.fits:
        return NodePlan(offer, nodes, gpus_per_node, Split(gpus_per_node, nodes, 1), verdict)
    return None


def fewest_nodes(
    model: Model, offer: Offer, sessions: int = SESSIONS, gpus_per_node: int = GPUS_PER_NODE, most: int = MAX_NODES
) -> NodePlan | None:
    """The fewest nodes of the offer's card that hold the model (one, when a node's GPUs hold a replica)."""
    return next(
        (plan for nodes in range(1, most + 1) if (plan := split_on(model, offer, nodes, gpus_per_node, sessions))),
        None,
    )


def cluster_offers(found: Iterable[Offer]) -> list[Offer]:
    """The offers of cards a cluster rents; the built-in table's, unpriced, when none is among `found`."""
    listed = [offer for offer in found if offer.card.id in CLUSTER_CARDS]
    return listed or [Offer(BY_ID[gpu]) for gpu in CLUSTER_CARDS]


def best_plan(plans: Sequence[NodePlan]) -> NodePlan | None:
    """The plan to rent: one an image of ours serves, the cheapest (the fewest GPUs when prices are unknown)."""
    usable = [plan for plan in plans if plan.offer.card.image]
    return min(
        usable,
        key=lambda p: (p.price_per_hour is None, p.price_per_hour or 0.0, p.gpus, p.offer.card.memory_mib),
        default=None,
    )
