"""What must happen on a pod between validated settings and vLLM's exec: the engine installed (unless the
image is prebaked), a generated model written if the recipe needs one, the weights downloaded into the
cache on the volume unless complete there; then the command runtime.engine.command made.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.engine import offload
from runtime.engine.command import EngineCommand, engine_command, model_source, tuned_options
from runtime.engine.install import ensure_engine
from runtime.engine.tinymodel import write_tiny_model
from runtime.engine.volume import hub_cache, make_cache_dirs
from runtime.engine.weights import ensure_weights, is_complete
from runtime.settings import Settings, SettingsError

if TYPE_CHECKING:
    from runtime.engine.recipes import Recipe

log = logging.getLogger(__name__)


def prepare_engine(
    settings: Settings,
    accelerator: str,
    extra_env: Mapping[str, str] | None = None,
    slow_work_begins: Callable[[], None] = lambda: None,
    gpus: int = 0,
) -> EngineCommand:
    """Everything between validated settings and exec: the engine installed (unless the image is
    prebaked), a generated model written if the recipe needs one, the weights downloaded into the
    cache unless complete there (vLLM then starts offline), then the command.

    `accelerator` is runtime.gpu's verdict ("cuda" or "cpu"), `gpus` the host's count; `slow_work_begins` is called
    before a download; raises SettingsError, InstallError or WeightsError.
    """
    command = engine_command(settings, extra_env)  # bad settings fail before minutes of installing
    if settings.kv_offload == offload.AUTO:  # sized from this host's RAM, now that its accelerator is known
        options, _ = tuned_options(settings, command.recipe)
        sized, line = offload.for_this_host(settings, command.recipe, options, accelerator, gpus)
        log.info("%s", line)
        command = engine_command(sized, extra_env)
    ensure_engine(settings, accelerator)
    refuse_missing_requirements(command.recipe, Path(settings.venv))
    if command.recipe.generate and not settings.repo:
        ensure_generated_model(Path(model_source(command.recipe, settings)), command.recipe.generated_answer)
    make_cache_dirs(command.cache)  # weights and compile caches: on the volume, for warm restarts
    if not command.hub_repos:
        return command
    if not all(is_complete(hub_cache(command.cache), repo) for repo in command.hub_repos):
        slow_work_begins()
    ensure_weights(command.hub_repos, hub_cache(command.cache))
    # Complete in the cache: vLLM asks the Hub nothing (the seeds: ~20 s of every start spent on Hub calls).
    return replace(command, env={**command.env, "HF_HUB_OFFLINE": "1"})


def refuse_missing_requirements(recipe: Recipe, venv: Path) -> None:
    """SettingsError (VL_MODEL) when the engine in `venv` lacks a module the recipe cannot run without."""
    for module, where in recipe.requires.items():
        if not _has_module(venv, module):
            raise SettingsError(
                "VL_MODEL",
                recipe.name,
                f"a model this image's engine can serve: {recipe.name} "
                f"needs {module}, which {venv} does not have ({where})",
            )


def _has_module(venv: Path, module: str) -> bool:
    """Whether `module` (dotted) is installed in the venv, looked up on disk: importing vLLM takes seconds."""
    *packages, last = module.split(".")
    for site in venv.glob("lib/python3*/site-packages"):
        folder = site.joinpath(*packages)
        if (folder / last / "__init__.py").is_file() or (folder / f"{last}.py").is_file():
            return True
    return False


def ensure_generated_model(directory: Path, answer: str = "hello") -> None:
    """Writes the tiny demo model (whose reply `answer` names) into `directory` unless it is there; a crash midway
    leaves no half model."""
    if directory.is_dir():
        return
    log.info("generating the tiny demo model in %s", directory)
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_tiny_model(partial, answer)
    partial.rename(directory)
