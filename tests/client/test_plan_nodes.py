"""`runtime plan` for a model no single card holds: how many nodes of which cluster card, and the split over their
GPUs (runtime/sizing/nodes.py): data parallel when a node's GPUs hold a replica (each replica holding its share of the
sessions), else tensor parallel inside each node and the pipeline across the nodes; what no cluster holds, said."""

from __future__ import annotations

import dataclasses
import json

import pytest

from runtime.cli import main
from runtime.runpod.api import RunPodError
from runtime.runpod.payloads import GpuType
from runtime.sizing.cards import BY_ID, CARDS
from runtime.sizing.choice import cluster_choices
from runtime.sizing.fit import Model
from runtime.sizing.nodes import GPUS_PER_NODE, Split, fewest_nodes, split_on
from runtime.sizing.offers import Offer
from runtime.sizing.verdicts import rows_for, verdict

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def model(weights_gib: float) -> Model:
    """A dense model of `weights_gib` with 64 KiB of KV a token, at 131,072 tokens (a 400B-class model in bf16)."""
    return Model(
        name="big",
        context=131_072,
        max_context=131_072,
        resident_gib=None,
        weights_gib=weights_gib,
        kv_bytes_per_token=65_536,
        utilization=0.92,
    )


def test_a_model_larger_than_a_node_is_pipelined_across_the_fewest_nodes_with_tp_inside_each() -> None:
    big = model(900)  # 16 H100s hold 1,170 GiB at 0.92: 900 of weights, 16 x 2.6 of overhead, the KV in the rest
    assert split_on(big, Offer(BY_ID[H100]), nodes=1) is None  # 8 x 79.6 GiB: not on one node, whatever the TP
    plan = fewest_nodes(big, Offer(BY_ID[H100]))
    assert plan is not None and (plan.nodes, plan.gpus_per_node, plan.split) == (2, GPUS_PER_NODE, Split(8, 2, 1))
    assert plan.split.mode == "pp" and plan.fit.kv_tokens is not None and plan.fit.kv_tokens >= 2 * 131_072
    assert plan.line() == (
        "2 nodes of 8 x H100 SXM: TP 8 x PP 2 (tensor parallel in each node, the pipeline across 2 nodes) (image sm90)"
    )


def test_a_model_one_node_holds_runs_replicas_of_the_fewest_gpus_each_pinned_data_parallel() -> None:
    plan = split_on(model(250), Offer(BY_ID[H100]), nodes=2)  # 250 GiB: 4 H100s hold it (with its KV), 2 do not
    assert plan is not None and plan.split == Split(4, 1, 4) and plan.split.mode == "dp"  # 2 replicas a node
    assert str(plan.split) == "TP 4 x DP 4 (4 replicas of 4 GPUs, each agent pinned)"


def test_data_parallel_replicas_each_hold_their_share_of_the_sessions() -> None:
    """64 sessions of a 1M window, 4 KiB of KV a token: 256 GiB of KV that no card holds; 16 H200s as 16 replicas,
    each agent pinned to one, hold 4 sessions apiece (a replica never sized for fewer than two)."""
    light = dataclasses.replace(model(20), context=1_048_576, max_context=1_048_576, kv_bytes_per_token=4096)
    assert not any(row.fit.fits for row in rows_for(light, [Offer(card) for card in CARDS], sessions=64))
    plan = split_on(light, Offer(BY_ID[H200]), nodes=2, sessions=64)
    assert plan is not None and plan.split == Split(1, 1, 16)
    assert plan.fit.kv_tokens is not None and plan.fit.kv_tokens >= 4 * 1_048_576


def test_the_verdict_names_the_nodes_the_card_and_the_command_and_what_no_cluster_holds() -> None:
    """1,400 GiB: one node of B200s (1,433 GiB) cannot hold it with its KV; two nodes of H200s (16 GPUs, as many as
    two of B200s, the smaller card) can: prices unknown, the fewest GPUs win, then the smaller card."""
    rows = rows_for(model(1400), [Offer(card) for card in CARDS], sessions=2)
    line = verdict(model(1400), rows, sessions=2)
    assert line == (
        "big at 131,072 tokens for 2 sessions: no single card holds it: 2 nodes of 8 x H200: TP 8 x PP 2 (tensor "
        "parallel in each node, the pipeline across 2 nodes) (image sm90) (python -m runtime pod up --nodes 2 --gpu "
        "'NVIDIA H200')"
    )
    h100 = next(row for row in rows if row.offer.card.id == H100)
    assert not h100.fit.fits and "; across GPUs: 3 nodes of 8 x H100 SXM: TP 8 x PP 3" in h100.why()
    assert next(row for row in rows if row.offer.card.name == "RTX 4090").nodes is None  # no cluster rents it
    huge = model(20_000)
    assert verdict(huge, rows_for(huge, [Offer(card) for card in CARDS], 2), 2).endswith(
        "fits none of these cards, nor 8 nodes of 8 of a cluster's cards"
    )


def test_plan_says_it_for_a_recipe_and_its_json_gives_each_cluster_card_s_nodes(capsys) -> None:
    """Nemotron's 1M window for 64 sessions at once: no card holds them; H100 nodes of pinned replicas do."""
    assert main(["plan", "--model", "nemotron", "--sessions", "64"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("nemotron at 1,048,576 tokens for 64 sessions: no single card holds it: one node of 8 x ")
    assert "python -m runtime pod up --nodes 2 --gpu" in first
    assert (
        main(["plan", "--model", "nemotron", "--sessions", "64", "--json", "--gpu", "H100 SXM", "--gpu", "L40S"]) == 0
    )
    rows = {row["gpu"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows[H100]["fits"] is False and rows["NVIDIA L40S"]["nodes"] is None
    nodes = rows[H100]["nodes"]
    assert nodes["nodes"] == 1 and nodes["gpus_per_node"] == 8 and nodes["pipeline_parallel"] == 1
    assert nodes["tensor_parallel"] * nodes["data_parallel"] == 8 and nodes["price_per_hour"] is None


def test_pod_up_nodes_tries_the_cluster_cards_of_the_template_s_architecture_whose_nodes_hold_its_model() -> None:
    """sm90: the H100 and the H200, cheapest first; two nodes of H100s cannot hold 1,400 GiB (three do: said), two
    of H200s can; an sm89 template has no card a cluster rents; a card of another architecture is refused as for a
    pod."""
    said: list[str] = []
    catalogue = [GpuType(id=H100, price={"secure": 2.99}), GpuType(id=H200, price={"secure": 3.99})]
    kept = cluster_choices(catalogue, "sm90", [], model(1400), 2, 8, None, say=said.append)
    assert [(choice.gpu, choice.split) for choice in kept] == [
        (H200, "TP 8 x PP 2 (tensor parallel in each node, the pipeline across 2 nodes)")
    ]
    assert said == [
        f"pod: {H100}: skipped: 2 nodes of 8 do not hold big at 131,072 tokens for 2 sessions (3 do: --nodes 3)"
    ]
    assert [c.gpu for c in cluster_choices(catalogue, "sm90", [], model(20), 2, 8, None, say=said.append)] == [
        H100,
        H200,
    ]  # cheapest first
    with pytest.raises(RunPodError, match="RunPod's clusters rent H100 SXM, H200, B200, A100 SXM 80 GB, none of"):
        cluster_choices(catalogue, "sm89", [], model(20), 2, 8, None)
    with pytest.raises(RunPodError, match="is an sm100 card and this template's image is for sm90"):
        cluster_choices(catalogue, "sm90", ["NVIDIA B200"], model(20), 2, 8, None)
