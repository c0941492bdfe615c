"""The bridge's Prometheus metrics; `/metrics` serves them followed by vLLM's own.

Usage is counted per key label (a name or a hash, see `auth`), never per key. Counters move once
per request, not per token: the hot path stays free of locks. Each series is looked up once
(`prometheus_client`'s `labels` validates and locks on every call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from runtime.bridge.guard import WHOLE_FILE_WRITES
from runtime.telemetry import GpuReading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 2**20


class Metrics:
    def __init__(self, upstream_in_use: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Every metric of the bridge's lives in its own registry (the engines' are merged in after).
        counter, gauge = partial(Counter, registry=self.registry), partial(Gauge, registry=self.registry)
        self.requests = counter(
            "bridge_requests",
            "Requests answered, by route, HTTP status, Anthropic error type and key label.",
            ["route", "status", "error_type", "key"],
        )
        self.tokens = counter(
            "bridge_tokens",
            "Tokens by key label and kind (input excludes cached, as Anthropic counts).",
            ["key", "kind"],
        )
        self.by_class = counter(
            "bridge_requests_by_class",
            "Generation requests by Claude Code's request class (`none`: not said; "
            "`other`: a class we do not know) and key label.",
            ["request_class", "key"],
        )
        self.tokens_by_class = counter(
            "bridge_tokens_by_class",
            "Tokens of generation requests by Claude Code's request class and kind.",
            ["request_class", "kind"],
        )
        self.by_hint = counter(
            "bridge_requests_by_hint",
            "Generation requests by Claude Code's other hint headers: `1p` (x-claude-1p-request-class, what "
            "Anthropic's API is told of the request) and `auxiliary` (x-claude-code-auxiliary-type, a memory pass); "
            "`other`: a value we do not know.",
            ["hint", "value"],
        )
        self.ttft = Histogram(
            "bridge_time_to_first_token_seconds",
            "From request to the first content token, for /v1/messages.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=self.registry,
        )
        self.open_streams = gauge("bridge_open_streams", "Responses being streamed now.")
        self.guard_blocked = counter(
            "bridge_guard_blocked",
            "Whole-file writes blocked by VL_GUARD (their content elided the file), by tool.",
            ["tool"],
        )
        for label in WHOLE_FILE_WRITES.values():  # each at 0 from the start: a rate can be read from the first
            self.guard_blocked.labels(label)
        in_use = gauge("bridge_upstream_connections_in_use", "Upstream requests in flight (the bounded pool's use).")
        in_use.set_function(upstream_in_use)
        gpu = ["gpu", "name"]  # the index nvidia-smi gives, and the product name
        self.gpu_utilization = gauge("vlpod_gpu_utilization_percent", "GPU utilization (nvidia-smi, every 2 s).", gpu)
        self.gpu_memory_used = gauge("vlpod_gpu_memory_used_bytes", "GPU memory in use.", gpu)
        self.gpu_memory_total = gauge("vlpod_gpu_memory_total_bytes", "GPU memory in all.", gpu)
        self.gpu_temperature = gauge("vlpod_gpu_temperature_celsius", "GPU temperature, where reported.", gpu)
        self.gpu_power = gauge("vlpod_gpu_power_watts", "GPU power draw, where reported.", gpu)

        # The counters' series by labels, as `labels` made them: as many as the labels' bounded values.
        self.series: dict[tuple[Counter, tuple[str, ...]], Any] = {}

    def counter(self, metric: Counter, *labels: str) -> Any:
        """`metric`'s series for these labels, made on first use."""
        found = self.series.get((metric, labels))
        if found is None:
            found = self.series[(metric, labels)] = metric.labels(*labels)
        return found

    def count_request(self, route: str, status: int, error_type: str, key: str) -> None:
        self.counter(self.requests, route, str(status), error_type, key).inc()

    def count_tokens(self, key: str, input_tokens: int, cached_tokens: int, output_tokens: int) -> None:
        self.add_tokens(self.tokens, key, (input_tokens, cached_tokens, output_tokens))

    def count_class(
        self, request_class: str, key: str, input_tokens: int, cached_tokens: int, output_tokens: int
    ) -> None:
        """One generation of `request_class` (one of sessions.REQUEST_CLASSES, `other` or `none`: bounded)."""
        self.counter(self.by_class, request_class, key).inc()
        self.add_tokens(self.tokens_by_class, request_class, (input_tokens, cached_tokens, output_tokens))

    def count_hints(self, first_party_class: str, auxiliary_type: str) -> None:
        """What the request's other hints said (each one of a bounded set, or `other`); nothing when it said none."""
        for hint, value in (("1p", first_party_class), ("auxiliary", auxiliary_type)):
            if value != "none":
                self.counter(self.by_hint, hint, value).inc()

    def count_blocked_write(self, tool: str) -> None:
        """One write blocked by VL_GUARD; `tool` is its label (one of guard.WHOLE_FILE_WRITES': bounded)."""
        self.counter(self.guard_blocked, tool).inc()

    def writes_blocked(self) -> int:
        """The writes VL_GUARD blocked since the bridge started, all tools together (the console's count)."""
        samples = next(iter(self.guard_blocked.collect())).samples
        return int(sum(sample.value for sample in samples if sample.name.endswith("_total")))

    def add_tokens(self, counter: Counter, label: str, tokens: tuple[int, int, int]) -> None:
        """Input, cached and output tokens onto `counter`'s (label, kind) series; none for a zero."""
        for kind, value in zip(("input", "cached", "output"), tokens, strict=True):
            if value:
                self.counter(counter, label, kind).inc(value)

    def show_gpus(self, gpus: Sequence[GpuReading]) -> None:
        """The GPU gauges hold the latest sample only: a GPU no longer read has no series any more."""
        gauges = (
            self.gpu_utilization,
            self.gpu_memory_used,
            self.gpu_memory_total,
            self.gpu_temperature,
            self.gpu_power,
        )
        for gauge in gauges:
            gauge.clear()
        for gpu in gpus:
            labels = (str(gpu.index), gpu.name)
            values = (
                gpu.utilization_pct,
                gpu.memory_used_mib * MIB,
                gpu.memory_total_mib * MIB,
                gpu.temperature_c,
                gpu.power_w,
            )
            for gauge, value in zip(gauges, values, strict=True):
                if value is not None:
                    gauge.labels(*labels).set(value)

    def streams_open(self) -> int:
        return int(next(iter(self.open_streams.collect())).samples[0].value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
