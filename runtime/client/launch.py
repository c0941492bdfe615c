"""`python -m runtime launch [URL] [--key K] [-- CLAUDE ARGS…]`: check the pod's endpoint as `connect` does, then run
Claude Code on it, the key in `ANTHROPIC_AUTH_TOKEN` and `ANTHROPIC_API_KEY` removed (it wins over the pod's token and
sends the session to the paid API). Without a URL, the pod `pod up` last brought up (kept in the user's config folder,
as the field notes' connect script kept its pod file); `--print` prints `connect`'s output instead.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from runtime.checks.endpoint import EndpointError, check_endpoint
from runtime.client.environment import claude_environment, print_environment
from runtime.client.identity import pod_key, pod_url
from runtime.headers import KEY_DEFAULT
from runtime.logsafe import terminal_line

PASSES_ON = True  # runtime.cli hands what follows `--` over as `passed_on`: Claude Code's own arguments


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", help="the pod's endpoint (default: the pod `pod up` last brought up)")
    parser.add_argument("--key", help=f"one of the pod's VL_API_KEYS (default: {KEY_DEFAULT}; any text if open)")
    parser.add_argument("--model", help="the model id to use (default: the served model's bare name)")
    parser.add_argument("--print", action="store_true", help="print the environment, as `connect` does; run nothing")
    parser.epilog = "Arguments after `--` go to Claude Code: python -m runtime launch URL -- -p 'hello'"


def run(args: argparse.Namespace) -> int:
    url = pod_url(args.url)
    if url is None:
        print("launch: no URL, and no pod brought up by `pod up` yet: give the pod's URL", file=sys.stderr)
        return 2
    key = pod_key(args.key, url) or "x"  # an open pod takes any text
    try:
        endpoint = check_endpoint(url, key, args.model)
    except EndpointError as error:
        print(terminal_line(f"launch: {error}"), file=sys.stderr)
        return 1
    if args.print:
        print_environment(endpoint)
        return 0
    if shutil.which("claude") is None:
        print("launch: Claude Code is not on PATH (npm install -g @anthropic-ai/claude-code)", file=sys.stderr)
        return 1
    environment = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"} | claude_environment(endpoint)
    print(
        f"launch: Claude Code on {endpoint.model!r} at {endpoint.base_url} ({endpoint.window:,}-token window)",
        file=sys.stderr,
        flush=True,
    )
    argv = ["claude", *getattr(args, "passed_on", [])]
    os.execvpe(argv[0], argv, environment)  # Claude Code takes the terminal over: no process of ours stays
