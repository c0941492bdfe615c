"""`python -m runtime plan [--model RECIPE|HF_REPO] [--context N] [--sessions K] [--gpu ID…] [--json]`: does this
model fit this card at this context, for K sessions at once, what does it leave, what does it cost, and which image
serves it, before anything is rented. A recipe is sized offline from its facts; a Hub repository from its files."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.client.cards import CARDS, GIB, OURS, Card, card_of
from runtime.client.sizing import SESSIONS, Fit, Model, fit
from runtime.engine.command import VLLM_DEFAULT_UTIL, tuned_options
from runtime.engine.recipes import Recipe, RecipeError, load_recipe
from runtime.runpod.api import KEY_VARIABLE, RunPodClient, RunPodError
from runtime.runpod.payloads import GpuType
from runtime.settings import Parser, Settings, SettingsError, integer, load_settings, quoted, recipe_names

BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
ATTENTION = ("full_attention", "attention", "sliding_attention", "mla")  # config.json's layer_types that hold KV
# One try at the Hub, this long: huggingface_hub's tree listing retried for 24 s on a Hub that was down, while the
# built-in recipes need no Hub at all; a user asking for a plan is better told at once.
HUB_TRY_S = 10.0
SESSIONS_ALLOWED = integer(1, unit="sessions")
CONTEXT_ALLOWED = integer(256, unit="tokens")  # VL_CTX's bound: the window a pod would accept
# `runtime.cli`: with --json, a refusal of the arguments is also {"error": ...} on stdout, as run's failures are.
JSON_ERRORS = True


# The settings that change what a pod holds, read from a template (pod up) or the shell (plan) as the pod reads them;
# only these, so that another variable's value (a template's secret reference) cannot stop the sizing.
SIZING = ("VL_MODEL", "VL_CTX", "VL_UTIL", "VL_KVBYTES", "VL_KV", "VL_TP", "VL_SPEC", "VL_SPEC_N", "VL_KV_OFFLOAD")


def sizing_settings(environ: Mapping[str, str]) -> Settings:
    """The pod's settings as far as sizing goes; SettingsError (one line) for a bad value."""
    return load_settings({name: environ[name] for name in SIZING if environ.get(name)})


class PlanError(Exception):
    """Why a model cannot be sized: one line."""


class NotAllowed(PlanError):
    """A value the user passed that names nothing `plan` knows: one line saying what is allowed, exit 2 (as
    argparse's own refusals), since it is the command line to fix, not the world."""


@dataclass(frozen=True)
class Offer:
    """A card as RunPod rents it now (its catalogue), or as the built-in table knows it (no price, no stock)."""

    card: Card
    price_per_hour: float | None = None
    stock: str | None = None  # RunPod's availability: HIGH, MEDIUM, LOW, NONE


# --- the model ---------------------------------------------------------------------------------------------


def model_of_recipe(
    recipe: Recipe,
    context: int | None = None,
    environ: Mapping[str, str] = os.environ,
    settings: Settings | None = None,
) -> Model:
    """A recipe as `plan` sizes it, with a pod's settings applied as the pod applies them (VL_UTIL, VL_KVBYTES,
    VL_TP, VL_KV, VL_SPEC's memory cap…): its facts (offline), else its repository's files on the Hub."""
    settings = settings or load_settings({})
    options, window = tuned_options(settings, recipe)
    window = context or window
    fixed = options.get("kv-cache-memory-bytes")
    common: dict[str, Any] = {
        "name": recipe.name,
        "context": window,
        "max_context": recipe.max_context,
        "utilization": float(str(options.get("gpu-memory-utilization", VLLM_DEFAULT_UTIL))),
        "kv_fixed_bytes": int(fixed) if isinstance(fixed, int) else None,
        "gpus": int(str(options.get("tensor-parallel-size", 1))),
    }
    facts = recipe.facts
    kv_dtype = str(options.get("kv-cache-dtype", "auto"))
    if facts is not None and facts.kv_bytes_per_token is not None:
        per_token, source = facts.kv_bytes_per_token, facts.source
        measured = str(recipe.vllm.get("kv-cache-dtype", "auto"))
        if BYTES.get(kv_dtype, 2) != BYTES.get(measured, 2):  # VL_KV: the same cache in another element size
            per_token = per_token * BYTES.get(kv_dtype, 2) // BYTES.get(measured, 2)
            source += f"; KV scaled from {measured} to {kv_dtype} (VL_KV)"
        return Model(
            **common,
            resident_gib=facts.resident_gib,
            weights_gib=facts.weights_gib,
            kv_bytes_per_token=per_token,
            host_ram_gib=facts.host_ram_gib,
            source=source,
            speeds=tuple(facts.speeds.items()),
        )
    try:
        read = read_repo(recipe.repo, kv_dtype, environ)
    except PlanError as error:
        if facts is None:
            raise
        source = f"{facts.source}; {error}"
        return Model(**common, resident_gib=None, weights_gib=facts.weights_gib, kv_bytes_per_token=None, source=source)
    weights = facts.weights_gib if facts is not None and facts.weights_gib is not None else read.weights_gib
    source = (f"{facts.source}; " if facts else "") + read.source
    return Model(
        **common, resident_gib=None, weights_gib=weights, kv_bytes_per_token=read.kv_bytes_per_token, source=source
    )


def model_of_repo(repo: str, context: int | None, environ: Mapping[str, str] = os.environ) -> Model:
    """A Hub repository no recipe names, sized from its files (bf16 KV, vLLM's default utilization, one GPU); when
    the Hub cannot say, PlanError names the recipes sized without it."""
    try:
        read = read_repo(repo, "auto", environ)
    except PlanError as error:
        offline = ", ".join(offline_recipes())
        raise PlanError(f"{error}; the built-in recipes are sized offline: --model {offline}") from None
    window = context or read.max_context
    return Model(
        name=repo,
        context=window,
        max_context=read.max_context,
        resident_gib=None,
        weights_gib=read.weights_gib,
        kv_bytes_per_token=read.kv_bytes_per_token,
        utilization=VLLM_DEFAULT_UTIL,
        source=read.source,
    )


def offline_recipes() -> list[str]:
    """The recipes `plan` sizes without the Hub: those whose facts carry a token's KV size (the others read their
    repository's config.json)."""
    facts = {name: load_recipe(name).facts for name in recipe_names()}
    return [name for name, known in facts.items() if known is not None and known.kv_bytes_per_token is not None]


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


# --- the cards -----------------------------------------------------------------------------------------------


def offers(gpus: Sequence[str], environ: Mapping[str, str] = os.environ) -> tuple[list[Offer], str]:
    """The cards to size: RunPod's catalogue with prices and stock when RUNPOD_API_KEY is set, else the built-in
    table; narrowed to `gpus` (RunPod's ids or the cards' names) when given. Also a line saying which."""
    key = environ.get(KEY_VARIABLE, "")
    if key:
        with RunPodClient(key) as api:
            found = [offer_of(entry) for entry in api.gpu_types()]
        said = "RunPod's catalogue (secure cloud prices)"
    else:
        found = [Offer(card) for card in CARDS]
        said = f"the built-in table of common cards (prices with {KEY_VARIABLE})"
    if gpus:
        found = [asked_offer(gpu, found, bool(key)) for gpu in gpus]
    return found, said


def named_offer(asked: str, found: Iterable[Offer]) -> Offer | None:
    """The offer whose card `asked` names (its id or its name, in any case): one of `found`, else a card of the
    built-in table, unpriced (one the catalogue does not list now); None when no card answers to it."""
    listed = [*found, *(Offer(card) for card in CARDS)]
    return next((offer for offer in listed if offer.card.answers_to(asked)), None)


def asked_offer(asked: str, found: Sequence[Offer], catalogue: bool) -> Offer:
    """The offer `asked` names; NotAllowed listing the names otherwise, since an unknown card sized as 0 GiB would
    be refused for a reason that is not true."""
    offer = named_offer(asked, found)
    if offer is None:
        where = "RunPod's catalogue" if catalogue else f"the built-in table (RunPod's catalogue with {KEY_VARIABLE})"
        names = ", ".join(listed.card.name for listed in found)
        raise NotAllowed(f"--gpu {quoted(asked)} is not allowed: expected the id or name of a card in {where}: {names}")
    return offer


def offer_of(entry: GpuType, cloud: str = "secure") -> Offer:
    """An entry of RunPod's `GET /v2/catalog/gpus` (its schema GpuType), priced in `cloud`."""
    prices = entry.get("price") or {}
    price = prices.get("community") if cloud == "community" else prices.get("secure")
    card = card_of(str(entry["id"]), float(entry.get("memory") or 0), str(entry.get("name") or ""))
    return Offer(card, float(price) if price else None, entry.get("availability"))


# --- the verdicts --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    offer: Offer
    fit: Fit

    @property
    def usable(self) -> bool:
        """Fits, and an image of ours serves its architecture."""
        return self.fit.fits and self.offer.card.image is not None

    def as_json(self, model: Model) -> dict[str, Any]:
        card = self.offer.card
        return {
            "gpu": card.id,
            "memory_gb": round(card.memory_gib, 2),
            "architecture": card.arch,
            "fits": self.fit.fits,
            "why": self.why(),
            "max_context": self.fit.max_context,
            "kv_tokens": self.fit.kv_tokens,
            "concurrency": self.fit.concurrency,
            "kv_offload_gib": self.fit.offload_gib,
            "price_per_hour": self.offer.price_per_hour,
            "stock": self.offer.stock,
            "image": card.image,
            "measured": dict(model.speeds).get(card.id),
        }

    def why(self) -> str:
        if self.fit.fits and self.offer.card.image is None:
            return f"{self.fit.why}; no image of ours serves {self.offer.card.arch} (ours: {OURS})"
        return self.fit.why


def rows_for(model: Model, found: Iterable[Offer], sessions: int) -> list[Row]:
    """Every card's verdict, the usable ones first (cheapest, or smallest when prices are unknown)."""
    rows = [Row(offer, fit(model, offer.card, sessions)) for offer in found]
    return sorted(rows, key=lambda r: (not r.usable, r.offer.price_per_hour or 0.0, r.offer.card.memory_mib))


def verdict(model: Model, rows: Sequence[Row], sessions: int) -> str:
    """The first line: the card to rent, or why none will do."""
    head = f"{model.name} at {model.context:,} tokens for {sessions} session{'s' * (sessions > 1)}"
    if model.kv_bytes_per_token is None:
        return f"{head}: cannot say: a token's KV size is unknown (neither measured nor read from the Hub)"
    usable = [row for row in rows if row.usable]
    host = f"; the host needs {model.host_ram_gib:g} GB of RAM besides" if model.host_ram_gib else ""
    if usable:
        best = usable[0]
        price = f" at ${best.offer.price_per_hour:.2f}/h" if best.offer.price_per_hour else ""
        which = "cheapest" if best.offer.price_per_hour else "smallest"
        name = f"{model.gpus} x {best.offer.card.name}" if model.gpus > 1 else best.offer.card.name
        return f"{head}: {which} card that fits: {name}{price} (image {best.offer.card.image}){host}"
    fitting = [row.offer.card.name for row in rows if row.fit.fits]
    if fitting:
        return f"{head}: fits {', '.join(fitting)}, but no image of ours serves them (ours: {OURS})"
    return f"{head}: fits none of these cards"


# --- the command ---------------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="nemotron", help="a recipe (default nemotron), or a Hub repo owner/name")
    parser.add_argument(
        "--context", type=allowed(CONTEXT_ALLOWED), metavar="N", help="the window (default: the recipe's)"
    )
    parser.add_argument(
        "--sessions",
        type=allowed(SESSIONS_ALLOWED),
        default=SESSIONS,
        metavar="K",
        help=f"full-window requests at once (default {SESSIONS}: never size for one)",
    )
    parser.add_argument(
        "--gpu", action="append", default=[], metavar="ID", help="a RunPod GPU id or its name (RTX 4090); repeatable"
    )
    parser.add_argument(
        "--json", action="store_true", help='one JSON list, a card per entry (on a failure: {"error": LINE})'
    )


def allowed(rule: Parser) -> Callable[[str], int]:
    """An option's type from a setting's rule: its refusal names the value and what is allowed, in the words the
    settings use for theirs (argparse prefixes the option's name and exits 2)."""

    def parse(text: str) -> int:
        try:
            return int(rule.parse(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{quoted(text)} is not allowed: expected {rule.allowed}") from None

    return parse


def run(args: argparse.Namespace) -> int:
    try:
        model = sized_model(args.model, args.context, sizing_settings(os.environ))
        found, said = offers(args.gpu)
    except (PlanError, RecipeError, RunPodError, SettingsError) as error:
        return failed(str(error), 2 if isinstance(error, NotAllowed) else 1, args.json)
    rows = rows_for(model, found, args.sessions)
    if args.json:
        print(json.dumps([row.as_json(model) for row in rows], indent=1))
        return 0
    print(verdict(model, rows, args.sessions))
    print(f"(cards: {said}; figures: {model.source})")
    print_table(rows, model)
    return 0


def failed(line: str, status: int, as_json: bool) -> int:
    """A failure's one line on stderr, and with --json as {"error": line} on stdout too: a script reading the
    JSON gets a JSON answer whatever went wrong."""
    print(f"plan: {line}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": line}))
    return status


def sized_model(name: str, context: int | None, settings: Settings) -> Model:
    """A recipe's name (with the VL_* tuning set here applied, as on a pod), else a Hub repository's."""
    if name in recipe_names():
        return model_of_recipe(load_recipe(name), context, settings=settings)
    if "/" not in name:
        expected = f"a recipe ({', '.join(recipe_names())}) or a Hub repo owner/name"
        raise NotAllowed(f"--model {quoted(name)} is not allowed: expected {expected}")
    return model_of_repo(name, context)


def print_table(rows: Sequence[Row], model: Model) -> None:
    table = [("card", "GiB", "arch", "image", "$/h", "fits", "KV tokens", "why / measured")]
    for row in rows:
        card, measured = row.offer.card, dict(model.speeds).get(row.offer.card.id)
        price = f"{row.offer.price_per_hour:.2f}" if row.offer.price_per_hour else "-"
        tokens = f"{row.fit.kv_tokens:,}" if row.fit.kv_tokens else "-"
        why = row.why() + (f" · the notes: {measured}" if measured else "")
        fits = "yes" if row.fit.fits else "no"
        name = f"{model.gpus} x {card.name}" if model.gpus > 1 else card.name
        table.append((name, f"{card.memory_gib:.1f}", card.arch, card.image or "-", price, fits, tokens, why))
    print_columns(table)


def print_columns(rows: Sequence[Sequence[str]]) -> None:
    """Rows as columns two spaces apart, the last one unpadded: the table commands' one layout."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
