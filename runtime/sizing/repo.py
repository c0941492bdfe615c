"""A Hub repository's size as the sizing reads it: its weights (safetensors, else .bin files) and a token's KV bytes
from config.json's shape (attention layers, KV heads, head size; a hybrid's attention layers; MLA's latent)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.sizing.cards import GIB
from runtime.sizing.errors import PlanError

BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
ATTENTION = ("full_attention", "attention", "sliding_attention", "mla")  # config.json's layer_types that hold KV
# One try at the Hub, this long: huggingface_hub's tree listing retried for 24 s on a Hub that was down, while the
# built-in recipes need no Hub at all; a user asking for a plan is better told at once.
HUB_TRY_S = 10.0


@dataclass(frozen=True)
class RepoFacts:
    weights_gib: float
    kv_bytes_per_token: int | None
    max_context: int
    source: str


def read_repo(repo: str, kv_dtype: str, environ: Mapping[str, str]) -> RepoFacts:
    """The weights' size (its safetensors files, else its .bin ones) and config.json's shape, read from the Hub with
    `HF_ENDPOINT` and `HF_TOKEN` as the pod reads them; PlanError in one line when it cannot."""
    from huggingface_hub.errors import HfHubHTTPError  # a Hub read only: not on `plan`'s offline path

    from runtime.hub.repo import HubRepo

    try:
        hub = HubRepo.from_environ(repo, environ)
        # The first request is the one try (model_info is never retried): a Hub that is down fails it at once.
        files = hub.api.model_info(hub.repo_id, files_metadata=True, timeout=HUB_TRY_S).siblings or []
        config = json.loads(hub.read_text("config.json", hub.version("config.json")))
    except HfHubHTTPError as error:
        raise PlanError(f"cannot read {repo} on the Hub: {str(error).splitlines()[0]}") from None
    except Exception as error:  # network down, a timeout, not a Hub at that address, a malformed config.json
        raise PlanError(f"cannot read {repo} on the Hub: {type(error).__name__}: {error}") from None
    weights = [f.size or 0 for f in files if f.rfilename.endswith(".safetensors")] or [
        f.size or 0 for f in files if f.rfilename.endswith(".bin")
    ]
    text = config.get("text_config") or config
    per_token, how = kv_bytes(text, BYTES.get(kv_dtype, 2))
    context = int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or 0)
    source = f"{repo}: {sum(weights) / GIB:.2f} GiB of weights, KV {how}"
    return RepoFacts(sum(weights) / GIB, per_token, context, source)


def kv_bytes(config: Mapping[str, Any], dtype_bytes: int) -> tuple[int | None, str]:
    """A token's KV bytes from a config's shape: attention layers x KV heads x head size x K and V x the dtype's
    bytes; a hybrid's attention layers only (its other layers keep a state per sequence); MLA's one latent."""
    layers = int(config.get("num_hidden_layers") or 0)
    if not layers:
        return None, "unknown (config.json names no num_hidden_layers)"
    attention = attention_layers(config, layers)
    if "kv_lora_rank" in config:  # MLA: one compressed latent and its rotary part a layer, not K and V
        width = int(config["kv_lora_rank"]) + int(config.get("qk_rope_head_dim") or 0)
        return attention * width * dtype_bytes, f"MLA, {attention} layers of {width}"
    query_heads = int(config.get("num_attention_heads") or 0)
    heads = int(config.get("num_key_value_heads") or query_heads)
    size = int(config.get("head_dim") or (int(config.get("hidden_size") or 0) // query_heads if query_heads else 0))
    if not heads or not size:
        return None, "unknown (config.json names no KV heads or head size)"
    what = f"{attention} attention layers of {layers}" if attention != layers else f"{layers} layers"
    return attention * heads * size * 2 * dtype_bytes, f"{what}, {heads} KV heads of {size}, {dtype_bytes}-byte"


def attention_layers(config: Mapping[str, Any], layers: int) -> int:
    """How many layers hold a KV cache: all, or a hybrid's attention layers (layer_types, Nemotron-H's pattern,
    Qwen3-Next's interval, Jamba's period)."""
    if isinstance(config.get("layer_types"), list):
        return sum(kind in ATTENTION for kind in config["layer_types"])
    if isinstance(config.get("hybrid_override_pattern"), str):
        return str(config["hybrid_override_pattern"]).count("*")
    if config.get("full_attention_interval"):
        return layers // int(config["full_attention_interval"])
    if config.get("attn_layer_period"):
        period, offset = int(config["attn_layer_period"]), int(config.get("attn_layer_offset") or 0)
        return sum(1 for layer in range(layers) if layer % period == offset)
    return layers
