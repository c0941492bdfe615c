"""`python -m runtime settings`: the effective settings and where each comes from, a settings file checked
before it is published (`--check FILE [--repo OWNER/NAME]`, judged exactly as the pod judges it), and
the generated tables of docs/reference/settings.md (`--update-docs`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from runtime.settings import (
    VARIABLES,
    Settings,
    SettingsError,
    is_secret,
    load_settings,
    markdown_table,
    with_tables,
)
from runtime.settings import unknown_settings as unknown_in_environment
from runtime.settingsfile import MAX_FILE_BYTES, FileRefused, SettingsFile, settings_with_file

CANNOT_CHECK = 2  # a bad environment, an unreadable file, a repo the Hub cannot tell about
REFUSED = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--markdown", action="store_true", help="print the settings table")
    parser.add_argument(
        "--update-docs",
        metavar="PATH",
        nargs="?",
        const="docs/reference/settings.md",
        help="rewrite the generated tables of the settings reference (default: ./docs/reference/settings.md)",
    )
    parser.add_argument(
        "--check",
        metavar="FILE",
        help="check a settings file as the pod would read it from the Hub (exit 0: accepted, 1: refused)",
    )
    parser.add_argument(
        "--repo",
        metavar="OWNER/NAME",
        help="with --check: the Hub repo the file is for, so that secrets in a public repo are refused too "
        "(HF_TOKEN and HF_ENDPOINT as on the pod)",
    )


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(markdown_table())
        return 0
    if args.update_docs:
        document = Path(args.update_docs)
        document.write_text(with_tables(document.read_text()))
        return 0
    if args.repo and not args.check:
        print("--repo goes with --check FILE", file=sys.stderr)
        return CANNOT_CHECK
    for line in unknown_in_environment(os.environ):
        print(line, file=sys.stderr)
    try:
        settings = load_settings(os.environ)
    except SettingsError as error:
        print(error, file=sys.stderr)
        return CANNOT_CHECK
    if args.check:
        return check(args.check, args.repo, settings)
    for v in VARIABLES:
        value = getattr(settings, v.attr)
        shown = "***" if is_secret(v.env) and value else value
        print(f"{v.env}={shown!r}  ({settings.sources[v.attr]})")
    return 0


def check(path: str, repo: str | None, environment: Settings) -> int:
    """Judges the file at `path` as a pod whose environment is this one would, at its start."""
    try:
        file = read_file(path, repo)
    except (OSError, ValueError) as error:
        print(f"cannot check {path}: {error}", file=sys.stderr)
        return CANNOT_CHECK
    try:
        new = settings_with_file(environment, os.environ, file)
    except FileRefused as refusal:
        print(refusal, file=sys.stderr)
        return REFUSED
    changed = sorted(scope.value for scope in environment.changed_scopes(new))
    rule = "" if repo else " (without --repo, secrets were not checked against the repo's visibility)"
    print(f"accepted {file.where}: it changes {', '.join(changed) or 'nothing'} over this environment{rule}")
    return 0


def read_file(path: str, repo: str | None) -> SettingsFile:
    """The file as the pod would be handed it: unread when too large; with `repo`, that repo's visibility
    as the Hub tells it (ValueError when it cannot)."""
    size = Path(path).stat().st_size
    text = Path(path).read_text(encoding="utf-8", errors="replace") if size <= MAX_FILE_BYTES else ""
    where = path if repo is None else f"{repo}/{Path(path).name}"
    return SettingsFile(text, where, is_private(repo) if repo else None, size)


def is_private(spec: str) -> bool:
    from runtime.hub.repo import HubRepo

    repo = HubRepo.from_environ(spec, os.environ)  # ValueError: not a repo id
    try:
        return repo.is_private()
    except Exception as error:  # not found, token refused, Hub unreachable: the rule cannot be applied
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"the Hub does not say whether {repo} is private ({reason})") from None
