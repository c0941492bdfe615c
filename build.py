#!/usr/bin/env python3
"""Render, build and publish the images: `python build.py --arch sm89|sm120|cpu [--build] [--push]`.

The command line only: space/targets.py renders the Dockerfiles from docker/, space/engine.py builds
and pushes with the Docker SDK, space/hub.py publishes through a Hugging Face Docker Space and
space/runpod.py writes (or saves) the RunPod template for the image.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from space import BuildError
from space.targets import ROOT, Target, check, load_targets, load_versions, render, unique_targets, write

DEFAULT_TIMEOUT_MIN = 180  # a GPU image is 7-10 GB of layers: the Space builder takes a while


@dataclasses.dataclass(frozen=True)
class Published:
    """The image a pod pulls, where it is made (a Space, a registry repository: its template's name), and
    who pulls it when it is private (a registry credential on RunPod)."""

    image: str
    source: str
    pull_user: str | None = None
    space: bool = False  # served by the Hub under :latest, the only tag it gives a Space's image
    hub_user: str | None = None  # the Hub token's user, when publishing has asked the Hub already


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
        default=None,
        metavar="HOST",
        help="where the Hub serves Space images (default registry.hf.space)",
    )
    runpod = parser.add_argument_group("RunPod")
    runpod.add_argument("--runpod-template", action="store_true", help="print the RunPod template for the image")
    runpod.add_argument(
        "--runpod",
        action="store_true",
        help="create or update the RunPod template through RunPod's API (RUNPOD_API_KEY)",
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
        "--cost-per-hour",
        type=float,
        metavar="DOLLARS",
        help="the hourly price of the GPU you will rent (RunPod's console shows it): the template's "
        "VL_COST_PER_HOUR, for the console's cost figures",
    )
    args = parser.parse_args(argv)
    if (args.build or args.push or args.runpod_template or args.runpod or args.status) and not args.arch:
        parser.error("--build, --push, --status, --runpod-template and --runpod need --arch")
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


def registry_reference(registry: str, target: Target) -> str:
    """REF as given when it names a tag, else REF:TARGET (one repository can hold every target)."""
    from docker.utils import parse_repository_tag

    _, tag = parse_repository_tag(registry)
    return registry if tag else f"{registry}:{target.name}"


def build_locally(args: argparse.Namespace, target: Target, files: dict[str, bytes], tag: str) -> None:
    from space.engine import BuildOptions, build

    options = BuildOptions(
        tag=tag,
        build_args=dict(pair.split("=", 1) for pair in args.build_arg),
        find_links=tuple(args.find_links),
        network=args.network,
    )
    build(files, options)


def push_to_space(args: argparse.Namespace, target: Target, files: dict[str, bytes]) -> Published:
    """Upload to the Space and follow its build."""
    from space import hub

    api = hub.hub_api()
    space = hub.resolve_space(api, args.space, target, args.public, args.space_registry or hub.HUB_REGISTRY)
    space = hub.ensure_space(api, space)
    files = {**files, hub.README: hub.space_readme(target, space.image).encode()}
    plan = hub.plan_upload(api, space, files)
    if not plan:
        say(f"{space.space_id}: unchanged, nothing pushed ({space.url})")
        resume_build(args, api, space)
    else:
        started = time.monotonic()
        commit = hub.upload(api, space, plan, f"vllm-pod {target.name}: build.py --push")
        say(
            f"uploaded {len(plan.changed)} file(s), {plan.size / 1e3:.1f} kB, removed {len(plan.deleted)}, "
            f"in {time.monotonic() - started:.1f} s: {space.url} (commit {commit[:12]})"
        )
        if args.detach:
            say(f"not following the build (--detach): {space.url}")
        else:
            follow_build(api, space, args.timeout * 60)
    return Published(space.image, space.space_id, space.user if space.private else None, True, space.user)


def resume_build(args: argparse.Namespace, api: Any, space: Any) -> None:
    """An unchanged Space may still be building (a push that timed out or was interrupted): follow it on,
    so that no template is printed for an image that never finished; a failed build is said as such."""
    from space import hub

    stage = hub.stage_of(api, space)
    if stage in hub.ON_THE_WAY and not args.detach:
        say(f"{space.space_id} is still {stage}: following its build")
        follow_build(api, space, args.timeout * 60)
    elif stage in hub.NO_IMAGE:
        for line in hub.build_log_tail(api, space.space_id):
            print(f"  | {line}", file=sys.stderr)
        raise BuildError(f"{space.space_id}'s last build ended in {stage} and nothing changed since: fix the "
                         f"cause (the build log's tail is above), then push again ({space.url})")  # fmt: skip


def show_status(args: argparse.Namespace, target: Target) -> int:
    """The Space's stage and the image it serves (`--status`)."""
    from space import hub

    api = hub.hub_api()
    space = hub.resolve_space(api, args.space, target, args.public, args.space_registry or hub.HUB_REGISTRY)
    stage = hub.stage_of(api, space)
    serves = "no image (its build failed)" if stage in hub.NO_IMAGE else space.image
    say(f"{space.space_id}: {stage}; serves {serves} ({space.url})")
    return 0


def follow_build(api: Any, space: Any, timeout_s: float) -> None:
    """Follow the Space's build to its end; a failed one prints its log's tail. Ctrl-C leaves it building."""
    from space import hub

    started = time.monotonic()
    try:
        stage = hub.follow(api, space, timeout_s)
    except KeyboardInterrupt:
        print(f"build.py: stopped following; the Space keeps building: {space.url}", file=sys.stderr)
        raise SystemExit(130) from None
    if stage != "RUNNING":
        for line in hub.build_log_tail(api, space.space_id):
            print(f"  | {line}", file=sys.stderr)
        raise BuildError(f"{space.space_id} ended in {stage}: the build log's tail is above ({space.url})")
    say(f"{space.space_id} built and running in {time.monotonic() - started:.0f} s")


def show_template(args: argparse.Namespace, target: Target, published: Published) -> None:
    """Print the RunPod template for the image; with --runpod, save it through RunPod's API too."""
    from space import runpod

    if published.pull_user:
        say(
            f"the image is private: RunPod pulls it with a registry credential (user: {published.pull_user}, "
            "password: a read token from https://huggingface.co/settings/tokens)"
        )
    if published.space:
        say(
            "the template names the Space's image as :latest, the only tag the Hub serves for a Space (none per "
            "revision): pods made after a later push pull that push; --registry pins an immutable digest"
        )
    credential = runpod_credentials(published) if args.runpod else None  # refused before anything is made
    body = runpod.template_body(
        runpod.template_name(target.name, published.source),
        published.image,
        cost_per_hour=args.cost_per_hour,
        log_repo=log_repo(args, published.hub_user, create=args.push or args.runpod),
        config_repo=args.config_repo,
    )
    print(runpod.render_template(body, private=bool(published.pull_user)))
    if credential is not None:
        runpod.save_template(body, *credential)


def log_repo(args: argparse.Namespace, user: str | None, create: bool) -> str | None:
    """The template's VL_LOG_REPO: --log-repo, else the token `user`'s private dataset (asked of the Hub when
    not known); with `create`, made when missing (a pod would make it at its first publish; `runtime logs
    --follow` needs it sooner)."""
    from space import hub

    if not hub.has_token():
        if not args.log_repo:
            say("no Hugging Face token: the template sets no VL_LOG_REPO (pods publish no boot log); set HF_TOKEN "
                "or pass --log-repo REPO")  # fmt: skip
        return args.log_repo
    api = hub.hub_api()
    spec = args.log_repo or hub.DEFAULT_LOG_REPO.format(
        user=user or hub.hub_call(api.whoami, "check the token")["name"]
    )
    if create:
        hub.ensure_log_repo(api, spec)
        say(f"pods publish their boot log to {spec} (private): python -m runtime logs POD_ID --follow --repo {spec}")
    return spec


def runpod_credentials(published: Published) -> tuple[str, tuple[str, str] | None]:
    """RUNPOD_API_KEY, and for a private image the registry credential RunPod pulls it with: the user and
    HF_READ_TOKEN, which the Hub must not call a write token (RunPod stores it)."""
    from space import hub

    key = os.environ.get("RUNPOD_API_KEY", "")
    if not key:
        raise BuildError("--runpod needs RUNPOD_API_KEY (https://www.runpod.io/console/user/settings)")
    if not published.pull_user:
        return key, None
    password = os.environ.get("HF_READ_TOKEN", "")
    if not password:
        raise BuildError(
            "a private image needs a registry credential on RunPod: set HF_READ_TOKEN to a read "
            "token (not the write token), or publish with --public"
        )
    if hub.token_role(hub.hub_call(lambda: hub.hub_api(password).whoami(), "check HF_READ_TOKEN")) == "write":
        raise BuildError(
            "HF_READ_TOKEN is a write token (the Hub says so): RunPod stores it as a registry password, so give "
            "it a read token (https://huggingface.co/settings/tokens)"
        )
    return key, (published.pull_user, password)


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
        for target in chosen:
            say(f"wrote {write(target, render(target, versions)).relative_to(ROOT)}")
        if args.verify_deps:
            return verify_deps(chosen, versions)
        if args.status:
            return show_status(args, chosen[0])
        if not (args.build or args.push or args.runpod_template or args.runpod):
            return 0
        return publish(args, chosen[0])
    except BuildError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("build.py: interrupted", file=sys.stderr)
        return 130


def verify_deps(targets: list[Target], versions: dict[str, Any]) -> int:
    from space.deps import verify

    for target in targets:
        if target.kind == "gpu":
            verify(target, versions, say)
            say(f"{target.name}: dependencies verified")
        else:
            say(f"{target.name}: skipped (--verify-deps checks the GPU images; this one is built and tested here)")
    return 0


def publish(args: argparse.Namespace, target: Target) -> int:
    from space.context import context_files

    files = context_files(target.dockerfile.read_text(), args.ca_cert, warn=say)
    reference = registry_reference(args.registry, target) if args.registry else None
    if args.build or (args.push and reference):
        build_locally(args, target, files, reference or args.tag or f"vllm-pod:{target.name}")
    published = None
    if args.push and reference:
        from space.engine import push

        digest = push(reference)
        say(f"pushed {reference}" + (f" ({digest})" if digest else ""))
        published = registry_image(f"{reference}@{digest}" if digest else reference)
    elif args.push:
        published = push_to_space(args, target, files)
    if args.push or args.runpod_template or args.runpod:
        if published is None:
            published = registry_image(reference) if reference else space_image(args, target)
        show_template(args, target, published)
    return 0


def registry_image(image: str) -> Published:
    """An image of an OCI registry; its repository names its template."""
    from space.runpod import registry_name

    return Published(image, registry_name(image))


def space_image(args: argparse.Namespace, target: Target) -> Published:
    """The Space's image when nothing was pushed: from --space, or from the token's user."""
    from space import hub

    registry = args.space_registry or hub.HUB_REGISTRY
    if args.space:
        owner = args.space.split("/")[0]
        image = hub.Space(args.space, False, owner, "", registry).image
        return Published(image, args.space, None if args.public else owner, space=True)
    space = hub.resolve_space(hub.hub_api(), None, target, args.public, registry)
    return Published(space.image, space.space_id, space.user if space.private else None, True, space.user)


if __name__ == "__main__":
    raise SystemExit(main())
