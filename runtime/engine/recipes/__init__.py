"""Model recipes as data: one TOML file per model in this directory, validated when loaded.

A recipe says what vLLM needs to serve one model well: repository, names, native window, parsers,
required flags and environment, and which speculation methods it supports. The seeds' measured
lessons live in the TOML files as defaults, each with its reason in a comment.
"""

from __future__ import annotations

import tomllib
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from runtime.settings import RECIPES_DIR, recipe_names

# A vLLM option's value in a recipe: true → `--flag`, false → `--no-flag`, a table → compact JSON,
# a list → one argument per item, anything else → its text.
OptionValue = bool | int | float | str | list[str] | dict[str, Any]


class RecipeError(ValueError):
    """A recipe file is malformed; `str()` names the file and the problem on one line."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Speculation(Strict):
    """Speculative decoding methods the model supports, as vLLM `--speculative-config` tables."""

    default: str = "off"
    methods: dict[str, dict[str, Any]] = {}

    @model_validator(mode="after")
    def default_is_known(self) -> Speculation:
        if self.default != "off" and self.default not in self.methods:
            raise ValueError(f"speculation.default {self.default!r} is not one of its methods")
        return self


class Yarn(Strict):
    """How to stretch the native window with YaRN (vLLM `--hf-overrides`).

    The override replaces the checkpoint's whole `rope_parameters`, so the recipe restates them.
    """

    max_factor: Annotated[float, Field(gt=1)]
    config_key: str = ""  # where rope_parameters live: "" (top level) or e.g. "text_config"
    rope_parameters: dict[str, Any]


class Facts(Strict):
    """What `runtime plan` sizes a card with, offline: the memory the engine holds besides its KV cache, the KV
    cache's bytes per token, what the host must hold, and the notes' measured speeds. Each figure says whence."""

    # What vLLM holds inside its memory budget besides the KV cache (weights, activations, CUDA graphs, states),
    # over all the engine's GPUs; or the weights alone, the engine's usual share added by `runtime plan`.
    resident_gib: Annotated[float, Field(gt=0)] | None = None
    weights_gib: Annotated[float, Field(gt=0)] | None = None
    kv_bytes_per_token: Annotated[int, Field(gt=0)] | None = None  # over all the engine's GPUs
    host_ram_gib: Annotated[float, Field(ge=0)] = 0.0  # what the host's RAM must hold besides the usual
    source: str  # where the figures come from: the notes' measurements, the model's shape
    speeds: dict[str, str] = {}  # RunPod GPU id → the notes' measured speed on it

    @model_validator(mode="after")
    def sized(self) -> Facts:
        if (self.resident_gib is None) == (self.weights_gib is None):
            raise ValueError("facts need resident_gib or weights_gib (one of them)")
        return self


class Recipe(Strict):
    """One model, ready to be turned into a vLLM command by runtime.engine."""

    name: str
    description: str
    repo: str  # Hub repository, or a local directory (see `generate`)
    generate: bool = False  # a local model that runtime.engine.tinymodel writes when the directory is absent
    generated_answer: Literal["hello", "greetings"] = "hello"  # that model's plain reply (tinymodel.script.ANSWERS)
    native_context: Annotated[int, Field(ge=256)]
    yarn: Yarn | None = None
    aliases: list[str] = []  # names besides the bare name and claude-<name>
    reasoning_parser: str | None = None
    # Anthropic's API thinks only when asked (a request's `thinking`); true keeps the chat template's
    # default instead, for a model that is unusable without its reasoning (say why in the recipe).
    thinks_unasked: bool = False
    tool_parser: str | None = None
    vision: bool = False  # accepts images: VL_MM_IMAGES sets --limit-mm-per-prompt
    speculation: Speculation = Speculation()
    env: dict[str, str] = {}
    vllm: dict[str, OptionValue] = {}  # `vllm serve` options in printed order, without the leading --
    quirks: list[str] = []  # what the operator must know and the runtime cannot fix
    # Engine modules the model cannot run without (dotted name → where to get them): a start on an
    # engine that lacks one stops with that line instead of failing deep inside vLLM.
    requires: dict[Annotated[str, Field(pattern=r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")], str] = {}
    facts: Facts | None = None  # for `runtime plan`; none: it reads the repository's files on the Hub

    @property
    def names(self) -> tuple[str, ...]:
        """Served names, bare name first: Claude Code honours CLAUDE_CODE_MAX_CONTEXT_TOKENS only
        for ids that do not start with `claude-`; the `claude-` form passes its model-name check."""
        return tuple(dict.fromkeys([self.name, f"claude-{self.name}", *self.aliases]))

    @property
    def max_context(self) -> int:
        """The largest window this model can serve: native, or stretched by YaRN."""
        return int(self.native_context * self.yarn.max_factor) if self.yarn else self.native_context

    @property
    def default_window(self) -> int:
        window = self.vllm.get("max-model-len", self.native_context)
        # A [vllm] value is kept as written: `consistent`, the first to ask, refuses one that is no count.
        if isinstance(window, bool) or not isinstance(window, int):
            raise ValueError(f"max-model-len {window!r} is not a whole number of tokens")
        return window

    @model_validator(mode="after")
    def consistent(self) -> Recipe:
        if self.default_window > self.max_context:
            raise ValueError(f"max-model-len {self.default_window} is above what it can serve ({self.max_context})")
        if self.yarn and "hf-overrides" in self.vllm:
            raise ValueError("hf-overrides is computed from [yarn]; do not set both")
        return self


@cache
def load_recipe(name: str) -> Recipe:
    """The recipe `name` (a file in runtime/engine/recipes/), validated; RecipeError when absent or malformed."""
    path = RECIPES_DIR / f"{name}.toml"
    if name not in recipe_names():
        raise RecipeError(f"no recipe named {name!r}: expected one of {', '.join(recipe_names())}")
    try:
        recipe = Recipe.model_validate(tomllib.loads(path.read_text()))
    except (tomllib.TOMLDecodeError, ValidationError) as error:
        raise RecipeError(f"{path.name}: {' '.join(str(error).split())}") from None
    if recipe.name != name:
        raise RecipeError(f"{path.name}: name {recipe.name!r} does not match the file name")
    return recipe
