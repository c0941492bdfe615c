"""`python -m runtime check [URL] [--key K] [--json]`: prove through the pod's public path (the bridge, as Claude Code
reaches it) that its model answers right under the load it promises, one named check at a time (runtime/checks: the
same checks the pod runs on itself with VL_SELFCHECK).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import asdict

from runtime.checks.asking import DEFAULT_URL, Outcome
from runtime.checks.bounded import DeadlineSettingError
from runtime.checks.endpoint import EndpointError
from runtime.checks.suite import CHECKS, run_checks
from runtime.client.identity import pod_key, pod_url
from runtime.headers import KEY_DEFAULT
from runtime.logsafe import terminal_line


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url", nargs="?", help=f"the pod's URL (default: the pod `pod up` last brought up, else {DEFAULT_URL})"
    )
    parser.add_argument("--key", help=f"a key of the pod's VL_API_KEYS (default: {KEY_DEFAULT})")
    parser.add_argument("--model", help="the model id to check (default: the served model's bare name)")
    parser.add_argument("--only", action="append", choices=list(CHECKS), help="run only these checks (repeatable)")
    parser.add_argument("--json", action="store_true", help='print {"checks": [{"name", "ok", "status", "detail"}]}')


def line_of(outcome: Outcome) -> str:
    """One check's line on the terminal: what the pod answered is shown without controls or line breaks."""
    return f"{outcome.name:<20} {outcome.status.upper():<8} {one_line(outcome.detail)}"


def one_line(text: str) -> str:
    return terminal_line(text)


def run(args: argparse.Namespace) -> int:
    names = args.only or list(CHECKS)
    say: Callable[[Outcome], None] = (lambda outcome: None) if args.json else (lambda o: print(line_of(o), flush=True))
    try:
        url = pod_url(args.url) or DEFAULT_URL
        outcomes = asyncio.run(run_checks(url, pod_key(args.key, url) or "", names, say, args.model))
    except (EndpointError, DeadlineSettingError) as error:
        print(one_line(f"runtime check: {error}"), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"checks": [asdict(o) | {"ok": o.ok} for o in outcomes]}, indent=2))
    return 0 if all(outcome.ok is not False for outcome in outcomes) else 1
