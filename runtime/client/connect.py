"""`python -m runtime connect URL`: check a pod's endpoint, then print Claude Code's environment for it.

The check is what a user would do by hand (runtime/checks/endpoint.py): the bridge answers, lists its models with
their context window, and generates one token through `/v1/messages` with the given key. The environment follows
the rules the seeds paid for: a bare model id (Claude Code honours `CLAUDE_CODE_MAX_CONTEXT_TOKENS`
only for ids that do not start with `claude-`), and `ANTHROPIC_API_KEY` removed (it wins over the
token and silently sends traffic to the paid API).
"""

from __future__ import annotations

import argparse
import sys

from runtime.checks.endpoint import EndpointError, check_endpoint
from runtime.client.environment import print_environment
from runtime.client.identity import pod_key
from runtime.headers import KEY_DEFAULT
from runtime.logsafe import terminal_line
from runtime.runpod.proxy import proxy_url


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help=f"the pod's public endpoint, e.g. {proxy_url('<pod>', environ={})}")
    parser.add_argument("--key", help=f"one of the pod's VL_API_KEYS (default: {KEY_DEFAULT}; any text if open)")
    parser.add_argument("--model", help="the model id to use (default: the served model's bare name)")
    parser.add_argument("--shell", choices=("bash", "powershell", "both"), default="both")


def run(args: argparse.Namespace) -> int:
    try:
        endpoint = check_endpoint(args.url, pod_key(args.key, args.url) or "x", args.model)  # open: any text
    except EndpointError as error:
        print(terminal_line(f"connect: {error}"), file=sys.stderr)
        return 1
    print_environment(endpoint, args.shell)
    return 0
