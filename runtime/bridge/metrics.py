"""The bridge's Prometheus metrics; `/metrics` serves them followed by vLLM's own.

Usage is counted per key label (a name or a hash, see `auth`), never per key. Counters move once
per request, not per token: the hot path stays free of locks.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self, upstream_in_use: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "bridge_requests", "Requests answered, by route, HTTP status, Anthropic error type and key label.",
            ["route", "status", "error_type", "key"], registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter(
            "bridge_tokens", "Tokens by key label and kind (input excludes cached, as Anthropic counts).",
            ["key", "kind"], registry=self.registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "bridge_time_to_first_token_seconds", "From request to the first content token, for /v1/messages.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600), registry=self.registry,
        )  # fmt: skip
        self.open_streams = Gauge("bridge_open_streams", "Responses being streamed now.", registry=self.registry)
        in_use = Gauge("bridge_upstream_connections_in_use", "Upstream requests in flight (the bounded pool's use).",
                       registry=self.registry)  # fmt: skip
        in_use.set_function(upstream_in_use)

    def count_request(self, route: str, status: int, error_type: str, key: str) -> None:
        self.requests.labels(route, str(status), error_type, key).inc()

    def count_tokens(self, key: str, input_tokens: int, cached_tokens: int, output_tokens: int) -> None:
        for kind, value in (("input", input_tokens), ("cached", cached_tokens), ("output", output_tokens)):
            if value:
                self.tokens.labels(key, kind).inc(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
