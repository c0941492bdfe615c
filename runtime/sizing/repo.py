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
# The bounds of config.json's numbers (a hostile one named 10^15 layers, or negative sizes): far above any model's.
MAX_LAYERS = 100_000
MAX_HEADS = 65_536
MAX_WIDTH = 1 << 20  # a head's size, MLA's latent
MAX_HIDDEN = 1 << 24
MAX_CONTEXT = 1 << 32  # tokens
MAX_FILE_BYTES = 1 << 45  # 32 TiB: one weights file


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
    if not isinstance(config, dict):
        raise PlanError(f"{repo}'s config.json is not a JSON object: {shown(config)}")
    weights = weight_sizes(files, ".safetensors") or weight_sizes(files, ".bin")
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise PlanError(f"{repo}'s config.json: text_config is {shown(text)}: expected a JSON object")
    try:
        per_token, how = kv_bytes(text, BYTES.get(kv_dtype, 2))
        context = count(text, "max_position_embeddings", MAX_CONTEXT, 0) or count(
            config, "max_position_embeddings", MAX_CONTEXT, 0
        )
    except PlanError as error:
        raise PlanError(f"{repo}'s config.json: {error}") from None
    source = f"{repo}: {sum(weights) / GIB:.2f} GiB of weights, KV {how}"
    return RepoFacts(sum(weights) / GIB, per_token, context or 0, source)


def shown(value: object, limit: int = 60) -> str:
    """A value from a file of the Hub's as a message shows it: its repr (every control escaped), cut."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def count(config: Mapping[str, Any], field: str, high: int, low: int = 1) -> int | None:
    """config.json's `field` as a whole number in low..high; None when it is absent (or null); PlanError naming the
    field and its value for anything else (a string, a negative or huge number, a fraction, a boolean)."""
    value = config.get(field)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError(f"{field} is {shown(value)}: expected a whole number in {low}..{high:,}")
    return value


def weight_sizes(files: list[Any], suffix: str) -> list[int]:
    """The sizes of the repository's files named *`suffix`, each a whole number of bytes in 0..MAX_FILE_BYTES
    (PlanError naming the file otherwise: a negative size would make any model fit any card)."""
    sizes = []
    for file in files:
        name = str(getattr(file, "rfilename", ""))
        if name.endswith(suffix):
            size = file.size or 0
            if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
                raise PlanError(
                    f"the Hub gives {shown(name)} a size of {shown(size)}: expected 0..{MAX_FILE_BYTES:,} bytes"
                )
            sizes.append(size)
    return sizes


def kv_bytes(config: Mapping[str, Any], dtype_bytes: int) -> tuple[int | None, str]:
    """A token's KV bytes from a config's shape: attention layers x KV heads x head size x K and V x the dtype's
    bytes; a hybrid's attention layers only (its other layers keep a state per sequence); MLA's one latent. Each number
    is read within its bounds (`count`: PlanError naming the field otherwise) and the layers are counted by
    arithmetic, never one by one."""
    layers = count(config, "num_hidden_layers", MAX_LAYERS)
    if not layers:
        return None, "unknown (config.json names no num_hidden_layers)"
    attention = attention_layers(config, layers)
    if not attention:
        return None, f"unknown (none of its {layers} layers holds a KV cache)"
    if config.get("kv_lora_rank") is not None:  # MLA: one compressed latent and its rotary part a layer, not K and V
        width = (count(config, "kv_lora_rank", MAX_WIDTH) or 0) + (count(config, "qk_rope_head_dim", MAX_WIDTH, 0) or 0)
        return attention * width * dtype_bytes, f"MLA, {attention} layers of {width}"
    query_heads = count(config, "num_attention_heads", MAX_HEADS)
    heads = count(config, "num_key_value_heads", MAX_HEADS) or query_heads
    size = count(config, "head_dim", MAX_WIDTH)
    if size is None and query_heads:
        size = (count(config, "hidden_size", MAX_HIDDEN) or 0) // query_heads
    if not heads or not size:
        return None, "unknown (config.json names no KV heads or head size)"
    what = f"{attention} attention layers of {layers}" if attention != layers else f"{layers} layers"
    return attention * heads * size * 2 * dtype_bytes, f"{what}, {heads} KV heads of {size}, {dtype_bytes}-byte"


def attention_layers(config: Mapping[str, Any], layers: int) -> int:
    """How many layers hold a KV cache: all, or a hybrid's attention layers (layer_types, Nemotron-H's pattern,
    Qwen3-Next's interval, Jamba's period), by arithmetic (never a loop over the layers)."""
    if isinstance(config.get("layer_types"), list):
        kinds = config["layer_types"]
        if len(kinds) > MAX_LAYERS:
            raise PlanError(f"layer_types names {len(kinds):,} layers: expected at most {MAX_LAYERS:,}")
        return sum(isinstance(kind, str) and kind in ATTENTION for kind in kinds)
    if isinstance(config.get("hybrid_override_pattern"), str):
        pattern = str(config["hybrid_override_pattern"])
        if len(pattern) > MAX_LAYERS:
            raise PlanError(f"hybrid_override_pattern has {len(pattern):,} layers: expected at most {MAX_LAYERS:,}")
        return pattern.count("*")
    if config.get("full_attention_interval"):
        return layers // (count(config, "full_attention_interval", MAX_LAYERS) or 1)
    if config.get("attn_layer_period"):
        period = count(config, "attn_layer_period", MAX_LAYERS) or 1
        offset = count(config, "attn_layer_offset", period - 1, 0) or 0
        return len(range(offset, layers, period))  # the layers at `offset` modulo `period`: a length, not a loop
    return layers
