"""Publishing one target's image: through a Hugging Face Docker Space (the Hub builds it from the uploaded
context, and the push follows that build), or built here and pushed to any OCI registry.

`publish` does what the command line asks and returns the image a pod pulls (`Published`), None when nothing
was pushed; `named_image` names that image without pushing anything (for the RunPod template alone).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from space import BuildError, hf_space
from space.context import CERTIFICATES, context_files
from space.docker_build import BuildOptions, build, push
from space.runpod import registry_name
from space.targets import Target

Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Published:
    """The image a pod pulls, where it is made (a Space, a registry repository: its template's name), and
    who pulls it when it is private (a registry credential on RunPod)."""

    image: str
    source: str
    pull_user: str | None = None
    space: bool = False  # served by the Hub under :latest, the only tag it gives a Space's image
    hub_user: str | None = None  # the Hub token's user, when publishing has asked the Hub already


@dataclasses.dataclass(frozen=True)
class SpaceChoice:
    """The Space to publish to (None: the token's user's vllm-pod-TARGET), whether a new one is public, where
    the Hub serves its image, and how long to follow its build (not at all with `detach`)."""

    space_id: str | None
    public: bool
    registry: str
    timeout_s: float
    detach: bool


@dataclasses.dataclass(frozen=True)
class Request:
    """What the command line asks of a rendered target: a local build (tagged `tag`, else vllm-pod:TARGET),
    a push (to the `registry` repository when given, else to the Space), and how to build it."""

    build: bool
    push: bool
    tag: str | None
    registry: str | None
    options: BuildOptions
    ca_cert: Path | None
    space: SpaceChoice


def publish(target: Target, dockerfile: str, request: Request, say: Say) -> Published | None:
    """Build and push as `request` asks, from the context of `dockerfile` (the target's rendering, never
    read back from disk); the pushed image, or None when nothing was pushed."""
    if not (request.build or request.push):
        return None
    files = context_files(dockerfile, request.ca_cert, warn=say)
    say_certificates(files, say)
    reference = registry_reference(request.registry, target) if request.registry else None
    if request.build or reference:
        build(files, reference or request.tag or f"vllm-pod:{target.name}", request.options)
    if not request.push:
        return None
    return to_registry(reference, say) if reference else to_space(target, files, request.space, say)


def say_certificates(files: Mapping[str, bytes], say: Say) -> None:
    """Name the CA certificates the image will trust: they travel with the build context, to a Space too."""
    certificates = sorted(path for path in files if fnmatch.fnmatch(path, CERTIFICATES))
    if certificates:
        say(f"the image trusts {', '.join(certificates)}: sent with the build context (a CA certificate is public)")


def named_image(target: Target, request: Request) -> Published:
    """The image a pod pulls when nothing is pushed now: the registry reference, else the Space's image."""
    if request.registry:
        return registry_image(registry_reference(request.registry, target))
    return space_image(target, request.space)


# --- an OCI registry ---------------------------------------------------------------------------


def registry_reference(registry: str, target: Target) -> str:
    """REF as given when it names a tag, else REF:TARGET (one repository can hold every target)."""
    from docker.utils import parse_repository_tag

    _, tag = parse_repository_tag(registry)
    return registry if tag else f"{registry}:{target.name}"


def to_registry(reference: str, say: Say) -> Published:
    """Push the image built as `reference`; what a pod pulls is pinned by the digest the registry gave it."""
    digest = push(reference)
    say(f"pushed {reference}" + (f" ({digest})" if digest else ""))
    return registry_image(f"{reference}@{digest}" if digest else reference)


def registry_image(image: str) -> Published:
    """An image of an OCI registry; its repository names its template."""
    return Published(image, registry_name(image))


# --- a Hugging Face Docker Space ---------------------------------------------------------------


def to_space(target: Target, files: Mapping[str, bytes], choice: SpaceChoice, say: Say) -> Published:
    """Upload what differs from the context (and the Space's README), then follow the build it starts."""
    api = hf_space.hub_api()
    space = hf_space.ensure_space(api, resolve(api, target, choice))
    files = {**files, hf_space.README: hf_space.space_readme(target, space.image).encode()}
    plan = hf_space.plan_upload(api, space, files)
    if not plan:
        say(f"{space.space_id}: unchanged, nothing pushed ({space.url})")
        resume_build(api, space, choice, say)
        return from_space(space)
    started = time.monotonic()
    commit = hf_space.upload(api, space, plan, f"vllm-pod {target.name}: build.py --push")
    say(
        f"uploaded {len(plan.changed)} file(s), {plan.size / 1e3:.1f} kB, removed {len(plan.deleted)}, "
        f"in {time.monotonic() - started:.1f} s: {space.url} (commit {commit[:12]})"
    )
    if choice.detach:
        say(f"not following the build (--detach): {space.url}")
    else:
        follow_build(api, space, choice.timeout_s, say)
    return from_space(space)


def resume_build(api: Any, space: hf_space.Space, choice: SpaceChoice, say: Say) -> None:
    """An unchanged Space may still be building (a push that timed out or was interrupted): follow it on,
    so that no template is printed for an image that never finished; a failed build is said as such."""
    stage = hf_space.stage_of(api, space)
    if stage in hf_space.ON_THE_WAY and not choice.detach:
        say(f"{space.space_id} is still {stage}: following its build")
        follow_build(api, space, choice.timeout_s, say)
    elif stage in hf_space.NO_IMAGE:
        print_build_log_tail(api, space)
        raise BuildError(
            f"{space.space_id}'s last build ended in {stage} and nothing changed since: fix the "
            f"cause (the build log's tail is above), then push again ({space.url})"
        )


def follow_build(api: Any, space: hf_space.Space, timeout_s: float, say: Say) -> None:
    """Follow the Space's build to its end; a failed one prints its log's tail. Ctrl-C leaves it building."""
    started = time.monotonic()
    try:
        stage = hf_space.follow(api, space, timeout_s)
    except KeyboardInterrupt:
        print(f"build.py: stopped following; the Space keeps building: {space.url}", file=sys.stderr)
        raise SystemExit(130) from None
    if stage != "RUNNING":
        print_build_log_tail(api, space)
        raise BuildError(f"{space.space_id} ended in {stage}: the build log's tail is above ({space.url})")
    say(f"{space.space_id} built and running in {time.monotonic() - started:.0f} s")


def print_build_log_tail(api: Any, space: hf_space.Space) -> None:
    for line in hf_space.build_log_tail(api, space.space_id):
        print(f"  | {line}", file=sys.stderr)


def show_space_stage(target: Target, choice: SpaceChoice, say: Say) -> None:
    """The Space's stage and the image it serves (`--status`): none while its build is under way (a first
    build has none yet) or after a failed one."""
    api = hf_space.hub_api()
    space = resolve(api, target, choice)
    runtime = hf_space.runtime_of(api, space.space_id)
    stage, space = str(runtime.stage), dataclasses.replace(space, hosted_as=hf_space.hosted_name(runtime.raw))
    if stage in hf_space.NO_IMAGE:
        serves = "serves no image (its build failed)"
    elif stage == "BUILDING":  # RUNNING_BUILDING: the previous image runs meanwhile
        serves = f"its image, {space.image}, is served once this build succeeds"
    else:
        serves = f"serves {space.image}"
    say(f"{space.space_id}: {stage}; {serves} ({space.url})")


def space_image(target: Target, choice: SpaceChoice) -> Published:
    """The Space's image when nothing is pushed: a named Space's is known without the Hub when its name predicts
    it, else read from its runtime; the default Space is the token's user's, which the Hub says."""
    if not choice.space_id:
        api = hf_space.hub_api()
        space = resolve(api, target, choice)
        return from_space(space if hf_space.predictable(space.space_id) else hosted(api, space))
    owner, hosted_as = choice.space_id.split("/")[0], None
    if not hf_space.predictable(choice.space_id) and hf_space.has_token():
        hosted_as = hf_space.hosted_name(hf_space.runtime_of(hf_space.hub_api(), choice.space_id).raw)
    image = hf_space.image_of(choice.space_id, choice.registry, hosted_as)  # BuildError when none says it
    return Published(image, choice.space_id, None if choice.public else owner, space=True)


def hosted(api: Any, space: hf_space.Space) -> hf_space.Space:
    """The Space with its image's name as its runtime gives it."""
    return dataclasses.replace(space, hosted_as=hf_space.hosted_name(hf_space.runtime_of(api, space.space_id).raw))


def resolve(api: Any, target: Target, choice: SpaceChoice) -> hf_space.Space:
    return hf_space.resolve_space(api, choice.space_id, target, choice.public, choice.registry)


def from_space(space: hf_space.Space) -> Published:
    """A Space's image; a private one is pulled as the token's user."""
    return Published(space.image, space.space_id, space.user if space.private else None, True, space.user)
