#!/usr/bin/env python3
"""Render, build and publish the images: `python build.py --arch sm89|sm120|cpu [--build] [--push]`.

The command line only: it parses the arguments and hands each action to space/ (space/__init__.py says
which module does what: rendering, verifying the pins, building, publishing, the RunPod template).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# space/ imports the Docker SDK and huggingface_hub only where it calls them: rendering and --check load neither.
from space import BuildError, deps
from space.docker_build import BuildOptions
from space.hf_space import HUB_REGISTRY
from space.publish import Request, SpaceChoice, named_image, show_space_stage
from space.publish import publish as publish_target
from space.runpod import DEFAULT_MODEL, recipe_names
from space.runpod_template import TemplateChoice, show_template
from space.targets import ROOT, Target, check, load_targets, load_versions, render, unique_targets, write

DEFAULT_TIMEOUT_MIN = 180  # a GPU image is 7-10 GB of layers: the Space builder takes a while


def parse_args(argv: Sequence[str] | None, targets: dict[str, Target]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python build.py", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--arch", choices=list(targets), help="render this target's Dockerfile")
    what.add_argument("--all", action="store_true", help="render every target's Dockerfile")
    what.add_argument(
        "--check",
        action="store_true",
        help="exit non-zero with a diff when a committed Dockerfile differs from its rendering",
    )
    parser.add_argument(
        "--verify-deps",
        action="store_true",
        help="resolve a GPU target's pip layers with pip (dry run, for the image's platform) and "
        "check its engine's libraries (CUDA runtime, glibc); no build, no GPU needed",
    )
    local = parser.add_argument_group("building with a local Docker engine")
    local.add_argument("--build", action="store_true", help="then build the image with the local Docker engine")
    local.add_argument("--tag", help="image tag for --build (default: vllm-pod:TARGET)")
    local.add_argument(
        "--build-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a build argument (BASE_IMAGE, TORCH_INDEX_URL, PIP_FIND_LINKS, ...); repeatable",
    )
    local.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR_OR_URL",
        help="an extra wheel location for pip; a local directory is served on loopback; repeatable",
    )
    local.add_argument(
        "--network",
        metavar="MODE",
        help="the build's network (e.g. host; default: the engine's, or host with a --find-links DIR)",
    )
    parser.add_argument(
        "--ca-cert",
        type=Path,
        metavar="FILE",
        help="a PEM CA certificate (or bundle) to trust during the build, e.g. a TLS proxy's "
        "(with --push, uploaded with the build context)",
    )
    publish = parser.add_argument_group("publishing")
    publish.add_argument(
        "--push", action="store_true", help="publish through a Hugging Face Docker Space (HF_TOKEN), or to --registry"
    )
    publish.add_argument("--space", metavar="OWNER/NAME", help="the Space (default: YOUR_USER/vllm-pod-TARGET)")
    publish.add_argument("--public", action="store_true", help="make a new Space public (default: private)")
    publish.add_argument(
        "--registry",
        metavar="REF",
        help="build locally and push to this OCI repository instead (e.g. ghcr.io/acme/vllm-pod; "
        "tag: TARGET unless REF has one)",
    )
    publish.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_MIN,
        metavar="MIN",
        help=f"stop following the Space's build after MIN minutes (default {DEFAULT_TIMEOUT_MIN})",
    )
    publish.add_argument("--detach", action="store_true", help="upload to the Space without following its build")
    publish.add_argument(
        "--status", action="store_true", help="show the Space's stage and the image it serves, then stop"
    )
    publish.add_argument(
        "--space-registry",
        default=HUB_REGISTRY,
        metavar="HOST",
        help=f"where the Hub serves Space images (default {HUB_REGISTRY})",
    )
    runpod = parser.add_argument_group("RunPod")
    runpod.add_argument("--runpod-template", action="store_true", help="print the RunPod template for the image")
    runpod.add_argument(
        "--runpod",
        action="store_true",
        help="create or update the RunPod template through RunPod's API (RUNPOD_API_KEY; a private --registry "
        "image's pull credential from REGISTRY_USER and REGISTRY_READ_TOKEN, a token that may only read packages)",
    )
    runpod.add_argument(
        "--model",
        choices=recipe_names(),
        metavar="RECIPE",
        help=f"the template's VL_MODEL, the recipe its pods serve (default {DEFAULT_MODEL}; an update keeps the one "
        f"set in RunPod's console unless given): {', '.join(recipe_names())}",
    )
    runpod.add_argument(
        "--log-repo",
        metavar="REPO",
        help="the template's VL_LOG_REPO, where pods publish their boot log (default: datasets/YOUR_USER/"
        "vllm-pod-logs, created private by --push and --runpod when missing)",
    )
    runpod.add_argument(
        "--config-repo", metavar="REPO", help="the template's VL_CONFIG_REPO, the Hub repo of the pods' settings file"
    )
    runpod.add_argument(
        "--desktop",
        action="store_true",
        help="the template's pods run the browser desktop (VL_DESKTOP=on, port 6080, its password the RunPod secret "
        "VL_DESKTOP_PASSWORD)",
    )
    runpod.add_argument(
        "--cost-per-hour",
        type=float,
        metavar="DOLLARS",
        help="the hourly price of the GPU you will rent (RunPod's console shows it): the template's "
        "VL_COST_PER_HOUR, for the console's cost figures",
    )
    args = parser.parse_args(argv)
    if (args.build or args.push or args.runpod_template or args.runpod or args.status) and not args.arch:
        parser.error("--build, --push, --status, --runpod-template and --runpod need --arch")
    if args.model and not (args.push or args.runpod_template or args.runpod):
        parser.error("--model chooses the RunPod template's VL_MODEL: with --push, --runpod-template or --runpod")
    if args.status and (args.registry or args.push):
        parser.error("--status shows a Space's build: without --push or --registry")
    if args.verify_deps and args.check:
        parser.error("--verify-deps needs --arch or --all")
    if args.registry and args.space:
        parser.error("--registry and --space are two ways to publish: choose one")
    for pair in args.build_arg:
        if "=" not in pair:
            parser.error(f"--build-arg {pair!r}: expected NAME=VALUE")
    if args.ca_cert and not args.ca_cert.is_file():
        parser.error(f"--ca-cert {args.ca_cert}: no such file")
    if args.timeout <= 0:
        parser.error(f"--timeout {args.timeout}: expected a positive number of minutes")
    return args


def say(line: str) -> None:
    print(f"build.py: {line}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        targets = load_targets()
        args = parse_args(argv, targets)
        versions = load_versions()
        if args.check:
            return check(targets, versions)
        chosen = unique_targets(targets) if args.all else [targets[args.arch]]
        rendered = [(target, render(target, versions)) for target in chosen]
        if not args.push:  # a push uploads its rendering: it writes no file to read back
            for target, dockerfile in rendered:
                say(f"wrote {write(target, dockerfile).relative_to(ROOT)}")
        if args.verify_deps:
            return verify_deps(chosen, versions)
        if args.status:
            show_space_stage(chosen[0], space_choice(args), say)
            return 0
        if not (args.build or args.push or args.runpod_template or args.runpod):
            return 0
        return publish(args, *rendered[0])
    except BuildError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build.py: interrupted", file=sys.stderr)
        return 130


def verify_deps(targets: list[Target], versions: dict[str, Any]) -> int:
    for target in targets:
        if target.kind == "gpu":
            deps.verify(target, versions, say)
            say(f"{target.name}: dependencies verified")
        else:
            say(f"{target.name}: skipped (--verify-deps checks the GPU images; this one is built and tested here)")
    return 0


def publish(args: argparse.Namespace, target: Target, dockerfile: str) -> int:
    """Build and push as asked, then show (or save) the RunPod template for the image."""
    options = BuildOptions(
        build_args=dict(pair.split("=", 1) for pair in args.build_arg),
        find_links=tuple(args.find_links),
        network=args.network,
    )
    request = Request(args.build, args.push, args.tag, args.registry, options, args.ca_cert, space_choice(args))
    published = publish_target(target, dockerfile, request, say)
    if args.push or args.runpod_template or args.runpod:
        template = TemplateChoice(
            log_repo=args.log_repo,
            config_repo=args.config_repo,
            cost_per_hour=args.cost_per_hour,
            save=args.runpod,
            create_log_repo=args.push or args.runpod,
            desktop=args.desktop,
            model=args.model,
        )
        show_template(target, published or named_image(target, request), template, say)
    return 0


def space_choice(args: argparse.Namespace) -> SpaceChoice:
    return SpaceChoice(args.space, args.public, args.space_registry, args.timeout * 60, args.detach)


if __name__ == "__main__":
    raise SystemExit(main())
