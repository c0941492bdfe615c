"""`python -m runtime bench` as a user runs it, against the session's bridge in front of real vLLM with the tiny model
(which, asked to count, talks until it is cut off): every figure measured, every answer run to its length, the warm
prefill read from the cache; and the ratio to the field notes' figures where the model and the card match."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from runtime.client import bench
from tests.support.bridge import Process

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_quick_bench_measures_the_tiny_model_through_the_bridge(bridge: Process) -> None:
    """On an open pod, without --key (an empty `Bearer ` header made every command that checks an endpoint fail)."""
    ran = subprocess.run(
        [sys.executable, "-m", "runtime", "bench", bridge.url, "--quick", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(ran.stdout)  # the figures on the tiny model, for the record (-s)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["model"] == "tiny" and report["reference"] is None  # the notes never measured the tiny model
    assert report["kept"] == "kept on the pod: its console and `runtime status` show it"  # an open pod: an admin's
    plan = bench.QUICK
    # Each solo prompt as long as asked (the salt and the chat template around it), each answer cut at its length.
    assert [round(row["context"], -3) for row in report["solo"]] == list(plan.contexts)
    for row in report["solo"]:
        assert row["tokens"] == plan.decode_tokens and row["decode_tok_s"] > 0 and row["ttft_s"] > 0
    assert [row["sessions"] for row in report["aggregate"]] == list(plan.sessions)
    for row in report["aggregate"]:
        assert row["tokens"] == row["sessions"] * plan.decode_tokens and row["aggregate_tok_s"] > 0
        assert row["slowest_session_tok_s"] > 0
    cold, warm = report["prefill"]["cold"], report["prefill"]["warm"]
    assert round(cold["prompt_tokens"], -3) == plan.prefill_tokens and cold["prefill_tok_s"] > 0
    assert cold["cached_tokens"] < 0.1 * cold["prompt_tokens"]  # salted: nothing of it was cached before
    assert warm["prompt_tokens"] == cold["prompt_tokens"] and warm["cached_tokens"] >= 0.9 * warm["prompt_tokens"]
    printed = "\n".join(
        [
            bench.solo_table(report["solo"]),
            bench.aggregate_table(report["aggregate"]),
            bench.prefill_table(report["prefill"]),
        ]
    )
    assert "decode tok/s" in printed and "aggregate tok/s" in printed and "cold" in printed


def test_a_pod_is_compared_with_the_notes_where_they_measured_its_model_on_its_card() -> None:
    solo = [{"context": 3_050, "tokens": 256, "decode_tok_s": 199.4, "ttft_s": 0.2}]
    aggregate = [{"sessions": 8, "tokens": 2048, "aggregate_tok_s": 583.2, "slowest_session_tok_s": 70.0}]
    report = bench.Report("nemotron", "NVIDIA RTX 6000 Ada Generation", solo, aggregate)
    assert bench.compared(report) == {
        "card": "RTX 6000 Ada",
        "solo_tok_s": 209.9,
        "aggregate_at_8_tok_s": 648.0,
        "solo_ratio": 0.95,
        "aggregate_at_8_ratio": 0.9,
    }
    assert "solo 0.95 of their 209.9 tok/s, 8 sessions 0.9 of their 648.0 tok/s" in bench.reference_line(
        bench.compared(report) or {}
    )
    assert bench.compared(bench.Report("nemotron", "NVIDIA H200", solo, aggregate)) is None  # not measured there
    assert bench.compared(bench.Report("nemotron", None, solo, aggregate)) is None  # a pod without a GPU reading
