"""`python -m runtime plan [--model RECIPE|HF_REPO] [--context N] [--sessions K] [--gpu ID…] [--json]`: does this
model fit this card at this context, for K sessions at once, what does it leave, what does it cost, and which image
serves it, before anything is rented. A recipe is sized offline from its facts; a Hub repository from its files
(runtime/sizing: the same library `pod up` sizes with).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from runtime.client.columns import print_columns
from runtime.engine.recipes import RecipeError
from runtime.runpod.api import RunPodError
from runtime.settings import Parser, SettingsError, integer, quoted
from runtime.sizing.errors import NotAllowed, PlanError
from runtime.sizing.fit import SESSIONS, Model
from runtime.sizing.model import sized_model, sizing_settings
from runtime.sizing.offers import offers
from runtime.sizing.verdicts import Row, offload_line, rows_for, verdict

SESSIONS_ALLOWED = integer(1, unit="sessions")
CONTEXT_ALLOWED = integer(256, unit="tokens")  # VL_CTX's bound: the window a pod would accept
# `runtime.cli`: with --json, a refusal of the arguments is also {"error": ...} on stdout, as run's failures are.
JSON_ERRORS = True


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
    if line := offload_line(model, rows):
        print(line)
    return 0


def failed(line: str, status: int, as_json: bool) -> int:
    """A failure's one line on stderr, and with --json as {"error": line} on stdout too: a script reading the
    JSON gets a JSON answer whatever went wrong."""
    print(f"plan: {line}", file=sys.stderr)
    if as_json:
        print(json.dumps({"error": line}))
    return status


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
