"""One request's trace: what its handlers learn of it (the model, its tokens, its first token, how it ended),
written by the exchange, the relay, the answer and the refusals, read once at its end by the accounting for the
trace line and the metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Trace:
    """A field left None (or, for the tokens, never counted) is one the request never reached: the trace line
    leaves it out."""

    id: str = "-"  # the bridge's own id for the request (msg_…, relay_…)
    model: str | None = None  # as the client named it
    stream: bool | None = None
    tokens_counted: bool = False
    input: int = 0  # uncached prompt tokens
    cached: int = 0
    output: int = 0
    ttft_s: float | None = None
    swap_wait_s: float | None = None  # VL_SWAP: how long it waited for its model to be loaded
    stop: str | None = None  # the model's stop reason, or how the client left (client_gone, client_stalled)
    error_type: str | None = None  # the Anthropic error type it was answered with
    guard: str | None = None  # VL_GUARD's verdict (blocked:Write,…)
    cache_miss: str | None = None  # why the prompt missed the cache (runtime.bridge.cachemiss)
    prompt: str | None = None  # the last user text, with VL_LOG_PROMPTS only

    def count_tokens(self, input_tokens: int, cached: int, output: int) -> None:
        self.tokens_counted = True
        self.input, self.cached, self.output = input_tokens, cached, output
