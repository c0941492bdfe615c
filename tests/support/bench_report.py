"""A `runtime bench` report as a pod with the notes' model on the notes' card would send it (figures near theirs)."""

from __future__ import annotations

from typing import Any

from runtime.client import bench


def nemotron_on_an_ada() -> dict[str, Any]:
    """The report's JSON, as `runtime bench` puts it to `/v1/pod/bench` (what it became on the pod left out)."""
    solo = [{"context": 3_050, "tokens": 256, "decode_tok_s": 199.4, "ttft_s": 0.21}]
    aggregate = [{"sessions": 8, "tokens": 2048, "aggregate_tok_s": 583.2, "slowest_session_tok_s": 70.0}]
    prefill = {
        name: {"prompt_tokens": 32_000, "cached_tokens": cached, "ttft_s": 1.5, "prefill_tok_s": 21_333.3}
        for name, cached in (("cold", 0), ("warm", 31_744))
    }
    report = bench.Report("nemotron", "NVIDIA RTX 6000 Ada Generation", solo, aggregate, prefill)
    report.reference = bench.compared(report)
    return report.sent()
