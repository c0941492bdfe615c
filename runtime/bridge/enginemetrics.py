"""The pod's engines as the bridge sees them (one, or several behind the router): what each one's
`/metrics` says of its queue, KV use and prefix cache, and all their metrics under one `/metrics`.

vLLM labels its own samples `engine` (its data-parallel rank): a replica of the pod is `replica`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

REPLICA_LABEL = "replica"
SUMMED = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "hits": "vllm:prefix_cache_hits",
    "queries": "vllm:prefix_cache_queries",
    "kv_use": "vllm:kv_cache_usage_perc",
}


@dataclass(frozen=True)
class EngineView:
    """One engine's state for the console: None where its metrics did not say (or it did not answer)."""

    answering: bool
    running: int | None = None
    waiting: int | None = None
    kv_use: float | None = None  # 0..1
    prefix_hit_rate: float | None = None  # 0..1, since the engine started

    def as_json(self, index: int) -> dict[str, object]:
        return {
            "replica": index,
            "state": "healthy" if self.answering else "down",
            "running": self.running,
            "waiting": self.waiting,
            "kv_use": self.kv_use,
            "prefix_hit_rate": self.prefix_hit_rate,
        }


def families(text: bytes) -> list[Metric]:
    """The metric families of a Prometheus text exposition; none when it cannot be parsed."""
    try:
        return list(text_string_to_metric_families(text.decode("utf-8", "replace")))
    except ValueError:
        return []


def engine_view(answer: tuple[bool, bytes | None]) -> EngineView:
    """What an engine's `/metrics` answer says: (whether it answered, its body when it could be read)."""
    answering, text = answer
    if text is None:
        return EngineView(answering)
    sums: dict[str, float] = {}
    for family in families(text):
        for field, name in SUMMED.items():
            wanted = {name, f"{name}_total"}  # a counter's family is named either way, as its TYPE line says
            if family.name in wanted:
                sums[field] = sums.get(field, 0.0) + sum(s.value for s in family.samples if s.name in wanted)
    queries = sums.get("queries")
    return EngineView(
        True,
        int(sums["running"]) if "running" in sums else None,
        int(sums["waiting"]) if "waiting" in sums else None,
        round(sums["kv_use"], 4) if "kv_use" in sums else None,
        round(sums.get("hits", 0.0) / queries, 4) if queries else None,
    )


class Merged:
    """A collector that yields every engine's families, each sample labelled with its replica."""

    def __init__(self, texts: Sequence[bytes | None]) -> None:
        self.texts = texts

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        for index, text in enumerate(self.texts):
            for family in families(text) if text is not None else []:
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type, family.unit)
                )
                for sample in family.samples:
                    labels = {**sample.labels, REPLICA_LABEL: str(index)}
                    into.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
        yield from merged.values()


def merged_metrics(texts: Sequence[bytes | None]) -> bytes:
    """One exposition of several engines' metrics; one engine's is passed on as it is."""
    if len(texts) == 1:
        return texts[0] or b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Merged(texts))
    return generate_latest(registry)
