"""`python -m runtime <command>`: one sub-command per module, imported only when it is run.

Each command's module exposes `configure(parser)` to declare its options and `run(args) -> int`.
Importing lazily keeps `python -m runtime --help` quick: it imports one command's module, `pod`'s, whose parser
names the verbs its line lists.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

COMMANDS: dict[str, tuple[str, str]] = {  # one line a command: its module, and its line in the usage
    "start": ("runtime.pod.start", "start sshd, vLLM and the bridge, and keep them alive (the image entrypoint)"),
    "bridge": ("runtime.bridge.server", "serve the Anthropic Messages API in front of an OpenAI-style upstream"),
    "engine-args": ("runtime.engine.command", "print the vLLM command line that the current environment yields"),
    "weights": ("runtime.engine.weights", "download the model's files into the cache (the volume), as a start would"),
    "preload": ("runtime.pod.preload", "download VL_PRELOAD's repos into the cache, at lowest priority, as a pod does"),
    "logs": ("runtime.hub.logtail", "tail a pod's remote log on the Hub"),
    "connect": ("runtime.client.connect", "check an endpoint and print Claude Code's environment"),
    "launch": ("runtime.client.launch", "check the pod, then run Claude Code on it (-- passes claude's arguments)"),
    "check": ("runtime.client.check", "prove the model answers right under load: needle, prefills, tools, cache…"),
    "bench": ("runtime.client.bench", "measure the pod's speed as the field notes did: solo decode, sessions, prefill"),
    "plan": ("runtime.client.plan", "does a model fit a card at a context, for K sessions, and what does it cost"),
    "pod": ("runtime.client.pods", "your pods on RunPod, without its console"),
    "status": ("runtime.client.status", "show a pod's console in the terminal: engine, traffic, keys, GPUs, cost"),
    "desktop": ("runtime.pod.desktop", "run the browser desktop on port 6080 (VL_DESKTOP=on; `start` supervises it)"),
    "settings": ("runtime.settings_command", "print the VL_* settings, check a settings file, update the docs' tables"),
}
# The commands of verbs: their usage line ends with the verbs their own parser declares, so the two cannot drift.
VERBS_LISTED = ("pod",)


SCRIPT = "vllm-pod"  # pyproject.toml's console script: `pip install .` puts it on PATH


def invoked_as() -> str:
    """How the commands were run, for their usage lines: the console script by its name, else `python -m runtime`."""
    return SCRIPT if Path(sys.argv[0]).stem == SCRIPT else "python -m runtime"  # `.stem`: vllm-pod.exe on Windows


def usage() -> str:
    width, program = max(map(len, COMMANDS)), invoked_as()
    lines = [f"usage: {program} <command> [options]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary_of(name)}" for name in COMMANDS]
    lines += ["", f"Run `{program} <command> --help` for a command's options."]
    return "\n".join(lines)


def summary_of(name: str) -> str:
    """A command's line in the usage: its summary, and for a command of verbs (`pod`) the verbs its parser takes,
    read from that parser since a list written here went stale (it lacked `gpus` and `replace`)."""
    module_name, summary = COMMANDS[name]
    listed = verbs(module_name) if name in VERBS_LISTED else []
    return f"{summary}: {', '.join(listed)}" if listed else summary


def verbs(module_name: str) -> list[str]:
    """The sub-commands a command's module declares: the one module the usage imports, none where its packages are
    missing (a stock image's bare python runs `runtime` before installing them)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    parser = argparse.ArgumentParser()
    module.configure(parser)
    found = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return [verb for action in found for verb in action.choices]


class JsonErrors(argparse.ArgumentParser):
    """The parser of a command run with `--json` whose failures are JSON (its module's JSON_ERRORS): a refusal of
    its arguments is also {"error": ...} on stdout, so that a script reading the JSON gets one whatever went wrong."""

    def error(self, message: str) -> NoReturn:
        print(json.dumps({"error": message}))
        super().error(message)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return dispatch(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # `… | head` closed the pipe: the reader has what it wanted, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that exit's flush fails no more
        return 141  # the shell's code for a pipe's writer stopped by SIGPIPE


def dispatch(args: list[str]) -> int:
    """The command named first, its options parsed by its own module, run."""
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module_name, summary = COMMANDS[name]
    module = importlib.import_module(module_name)
    json_errors = getattr(module, "JSON_ERRORS", False) and "--json" in rest
    parser = (JsonErrors if json_errors else argparse.ArgumentParser)(
        prog=f"{invoked_as()} {name}", description=summary
    )
    module.configure(parser)
    run: Callable[[argparse.Namespace], int] = module.run
    if getattr(module, "PASSES_ON", False) and "--" in rest:  # what follows `--` is another program's
        parsed = parser.parse_args(rest[: rest.index("--")])
        parsed.passed_on = rest[rest.index("--") + 1 :]
    else:
        parsed = parser.parse_args(rest)
    return run(parsed)
