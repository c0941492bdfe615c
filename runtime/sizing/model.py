"""A model as the sizing sees it (`Model`): a recipe's facts with a pod's settings applied as the pod applies them
(VL_UTIL, VL_KVBYTES, VL_TP, VL_KV, VL_SPEC's memory cap…), else its repository's files on the Hub."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from runtime.engine.command import VLLM_DEFAULT_UTIL, tuned_options
from runtime.engine.offload import is_hybrid
from runtime.engine.recipes import Recipe, load_recipe
from runtime.settings import Settings, load_settings, quoted, recipe_names
from runtime.sizing.errors import NotAllowed, PlanError
from runtime.sizing.fit import Model
from runtime.sizing.repo import BYTES, read_repo

# The settings that change what a pod holds, read from a template (pod up) or the shell (plan) as the pod reads them;
# only these, so that another variable's value (a template's secret reference) cannot stop the sizing.
SIZING = ("VL_MODEL", "VL_CTX", "VL_UTIL", "VL_KVBYTES", "VL_KV", "VL_TP", "VL_SPEC", "VL_SPEC_N", "VL_KV_OFFLOAD")


def sizing_settings(environ: Mapping[str, str]) -> Settings:
    """The pod's settings as far as sizing goes; SettingsError (one line) for a bad value."""
    return load_settings({name: environ[name] for name in SIZING if environ.get(name)})


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
        "hybrid": is_hybrid(options),
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
    if not window:  # a window of 0 tokens sizes nothing (and divided by zero)
        raise PlanError(f"{repo}'s config.json names no max_position_embeddings: give the window (--context N)")
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


def sized_model(name: str, context: int | None, settings: Settings) -> Model:
    """A recipe's name (with the VL_* tuning set here applied, as on a pod), else a Hub repository's."""
    if name in recipe_names():
        return model_of_recipe(load_recipe(name), context, settings=settings)
    if "/" not in name:
        expected = f"a recipe ({', '.join(recipe_names())}) or a Hub repo owner/name"
        raise NotAllowed(f"--model {quoted(name)} is not allowed: expected {expected}")
    return model_of_repo(name, context)
