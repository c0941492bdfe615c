"""A Hugging Face Docker Space as the image's builder: the Space builds it and the Hub serves it from its registry.

`resolve_space` names the Space (by default the token's user's `vllm-pod-TARGET`), `ensure_space` creates it
when missing, `plan_upload` and `upload` send only the files that differ from the build context (nothing when
they match: no rebuild), and `follow` watches the build until its image is served or it fails. Every Hub
call goes through `hub_call`, which turns a failure into one line (never a token).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jinja2

from runtime.hubspace import SPACE_PORT
from runtime.liveline import LiveLine
from runtime.units import human_seconds
from space import BuildError
from space.context import git_blob_id
from space.targets import ROOT, Target

HUB_REGISTRY = "registry.hf.space"  # where the Hub serves a Docker Space's image
README = "README.md"
KEPT_REMOTE = {".gitattributes"}  # the Hub's own file in every repo
POLL_S = 5.0
GRACE_S = 120.0  # how long a Space may show its previous state before its new build starts
ON_THE_WAY = {"BUILDING", "RUNNING_BUILDING", "APP_STARTING", "RUNNING_APP_STARTING"}  # a new build is under way
NO_IMAGE = {"BUILD_ERROR", "CONFIG_ERROR", "NO_APP_FILE"}  # failed before an image was made
LOG_TAIL_LINES = 30
# A name the Hub surely keeps whole: `<owner>-<name>` of letters, digits and single hyphens, one DNS label at most.
# It shortens a longer one and adds a hash (undocumented): that image name is read from the Space's runtime.
PREDICTABLE = re.compile(r"(?=.{1,63}$)[a-z0-9]+(-[a-z0-9]+)*")


@dataclasses.dataclass(frozen=True)
class Space:
    """Where a target is published: the Space and the image the Hub builds from it."""

    space_id: str
    private: bool
    user: str  # the token's user: who pulls a private Space's image, with a read token as password
    endpoint: str
    registry: str
    hosted_as: str | None = None  # the image's name as the Space's runtime gives it, once read

    @property
    def image(self) -> str:
        return image_of(self.space_id, self.registry, self.hosted_as)

    @property
    def url(self) -> str:
        return f"{self.endpoint.rstrip('/')}/spaces/{self.space_id}"


def predictable(space_id: str) -> bool:
    """Whether the Hub surely names the Space's image `<owner>-<name>`, lowercased, the name kept whole."""
    return bool(PREDICTABLE.fullmatch(space_id.replace("/", "-").lower()))


def image_of(space_id: str, registry: str, hosted_as: str | None = None) -> str:
    """The image the Hub serves for a Space, only ever tagged :latest: named `hosted_as` (read from the Space's
    runtime), else predicted from its name; BuildError for a name the Hub may shorten (only the runtime says how)."""
    if hosted_as:
        return f"{registry}/{hosted_as}:latest"
    if not predictable(space_id):
        raise BuildError(
            f"the image name of the Space {space_id} cannot be predicted (the Hub rewrites characters other than "
            "letters, digits and single hyphens, and cuts a name over 63 characters, adding a hash): set HF_TOKEN "
            "so build.py reads it from the Hub once the Space exists, or choose a shorter, plainer name"
        )
    return f"{registry}/{space_id.replace('/', '-').lower()}:latest"


def hosted_name(runtime: Mapping[str, Any] | None) -> str | None:
    """The Space's image name as its runtime gives it: the host of its `<name>.hf.space` domain (the Hub names
    the image as the host); None when the runtime names no such domain."""
    for domain in (runtime or {}).get("domains") or []:
        host = str(domain.get("domain") or "")
        if host.endswith(".hf.space") and host.count(".") == 2:  # not <name>.static.hf.space, nor a custom domain
            return host.removesuffix(".hf.space")
    return None


@dataclasses.dataclass(frozen=True)
class Upload:
    """What a push sends: the files that differ from the Space's, and the Space's files we no longer have."""

    changed: dict[str, bytes]
    deleted: list[str]

    @property
    def size(self) -> int:
        return sum(len(content) for content in self.changed.values())

    def __bool__(self) -> bool:
        return bool(self.changed or self.deleted)


def has_token() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


def hub_api(token: str | None = None) -> Any:
    """The Hub client with `token`, else the user's (HF_TOKEN, or the one `hf auth login` saved)."""
    from huggingface_hub import HfApi, get_token

    token = token or get_token()
    if not token:
        raise BuildError(
            "no Hugging Face token: set HF_TOKEN to a token with write access "
            "(https://huggingface.co/settings/tokens), or publish to any registry with --registry REF"
        )
    return HfApi(token=token)


def space_readme(target: Target, image: str) -> str:
    template = jinja2.Environment(
        loader=jinja2.FileSystemLoader(ROOT / "space" / "files"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    return template.get_template("README.md.j2").render(
        target=target.name, description=target.description, image=image, app_port=SPACE_PORT
    )


def token_role(who: Mapping[str, Any]) -> str | None:
    """What a token may do, as the Hub's whoami says: "read", "write" or "fineGrained"."""
    return ((who.get("auth") or {}).get("accessToken") or {}).get("role")


def resolve_space(api: Any, space_id: str | None, target: Target, public: bool, registry: str) -> Space:
    """Who the token belongs to and what it may do, then the Space it publishes to."""
    who = hub_call(api.whoami, "check the token")
    if token_role(who) == "read":
        raise BuildError(
            "HF_TOKEN is read-only: publishing needs a token with write access (https://huggingface.co/settings/tokens)"
        )
    space_id = space_id or f"{who['name']}/vllm-pod-{target.name}"
    return Space(space_id, not public, who["name"], api.endpoint, registry)


def ensure_space(api: Any, space: Space) -> Space:
    """Create the Docker Space when it is missing; refuse one made with another SDK. An existing Space keeps
    its visibility: the returned Space says which it has."""
    hub_call(
        lambda: api.create_repo(
            space.space_id, repo_type="space", space_sdk="docker", private=space.private, exist_ok=True
        ),
        f"create the Space {space.space_id}",
    )
    info = hub_call(lambda: api.space_info(space.space_id), f"read the Space {space.space_id}")
    if info.sdk != "docker":
        raise BuildError(
            f"{space.space_id} is a {info.sdk} Space, not a Docker one: choose another name with --space OWNER/NAME"
        )
    hosted_as = hosted_name(info.runtime.raw if info.runtime else None)
    return dataclasses.replace(space, private=bool(info.private), hosted_as=hosted_as)


def runtime_of(api: Any, space_id: str) -> Any:
    """The Space's runtime now: its stage (BUILDING, RUNNING, BUILD_ERROR...) and, in `raw`, its domains."""
    return hub_call(lambda: api.get_space_runtime(space_id), f"read the stage of {space_id}")


def stage_of(api: Any, space: Space) -> str:
    """The Space's stage now (BUILDING, RUNNING, BUILD_ERROR...)."""
    return str(runtime_of(api, space.space_id).stage)


def plan_upload(api: Any, space: Space, files: Mapping[str, bytes]) -> Upload:
    """Compare our files with the Space's by their git blob ids: only what differs travels."""
    from huggingface_hub.hf_api import RepoFile

    tree = hub_call(
        lambda: list(api.list_repo_tree(space.space_id, repo_type="space", recursive=True)),
        f"list the files of {space.space_id}",
    )
    remote = {entry.path: entry.blob_id for entry in tree if isinstance(entry, RepoFile)}
    changed = {path: content for path, content in files.items() if remote.get(path) != git_blob_id(content)}
    deleted = sorted(set(remote) - set(files) - KEPT_REMOTE)
    return Upload(changed, deleted)


def upload(api: Any, space: Space, plan: Upload, message: str) -> str:
    """One commit with the changed files and the deletions; returns its id."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    operations: list[CommitOperationAdd | CommitOperationDelete] = [
        CommitOperationAdd(path, content) for path, content in sorted(plan.changed.items())
    ]
    operations += [CommitOperationDelete(path) for path in plan.deleted]
    commit = hub_call(
        lambda: api.create_commit(space.space_id, operations, commit_message=message, repo_type="space"),
        f"upload to {space.space_id}",
    )
    return str(commit.oid)


def hub_call(call: Callable[[], Any], doing: str) -> Any:
    """Run one Hub call; every failure becomes one line that says what to do (never a token)."""
    import httpx2  # huggingface_hub's HTTP client: its transport errors are how an unreachable Hub shows
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return call()
    except HfHubHTTPError as error:
        raise BuildError(hub_refusal(error, doing)) from None
    except ValueError as error:  # the client's own checks, e.g. the Hub refused the README's metadata
        raise BuildError(f"could not {doing}: {' '.join(str(error).split())}") from None
    except (httpx2.HTTPError, OSError) as error:
        raise BuildError(f"could not {doing}: the Hub is unreachable ({type(error).__name__}: {error})") from None


def hub_refusal(error: Any, doing: str) -> str:
    status = error.response.status_code if error.response is not None else None
    said = (error.server_message or "").strip().splitlines()
    reason = said[0] if said else f"HTTP {status}"
    if status == 402:
        return (
            f"could not {doing}: the Hub needs a paid plan for new Docker Spaces (HTTP 402: {reason}); "
            "upgrade the account, or publish to any registry with --registry REF"
        )
    if status == 401:
        return f"could not {doing}: the Hub refused HF_TOKEN (HTTP 401: {reason}); create a new token"
    if status == 403:
        return f"could not {doing}: HF_TOKEN may not do this (HTTP 403: {reason}); use a token with write access there"
    return f"could not {doing}: the Hub answered HTTP {status}: {reason}"


# --- following the build -----------------------------------------------------------------------


class LastLogLine:
    """The build log's latest line, read in the background from the Hub's never-ending event stream."""

    def __init__(self, api: Any, space_id: str) -> None:
        self.line = ""
        thread = threading.Thread(target=self._read, args=(api, space_id), name="space-build-log", daemon=True)
        thread.start()  # daemon: the stream never closes, and a finished command must not wait for it

    def _read(self, api: Any, space_id: str) -> None:
        try:
            for line in api.fetch_space_logs(space_id, build=True, follow=True):
                if line.strip():
                    self.line = line.strip()
        except Exception:  # the log is a nicety: the stage alone decides
            return


def follow(api: Any, space: Space, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> str:
    """Watch the Space until its new build is served or fails; returns the final stage.

    A Space can show its previous state for a moment after a commit: a finished stage counts only once
    a build was seen, or after a grace period.
    """
    started, seen_build = clock(), False
    log, progress = LastLogLine(api, space.space_id), LiveLine("build.py: ")
    try:
        while True:
            stage, elapsed = stage_of(api, space), clock() - started
            seen_build = seen_build or stage in ON_THE_WAY
            progress.show(elapsed, stage, log.line)
            if stage not in ON_THE_WAY and (seen_build or elapsed > GRACE_S):
                return stage
            if elapsed > timeout_s:
                raise BuildError(
                    f"{space.space_id} is still {stage} after {human_seconds(timeout_s)}; it keeps "
                    f"building: follow it at {space.url} or run the same --push again"
                )
            time.sleep(POLL_S)  # the Hub offers no notification of a stage change: poll it
    finally:
        progress.end()


def build_log_tail(api: Any, space_id: str, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last lines of the build log (a no-follow read: the client stops once the replay is drained)."""
    try:
        return tail(api.fetch_space_logs(space_id, build=True), lines)
    except Exception as error:  # what matters is the failure itself; the log may be unavailable
        return [f"(the build log could not be read: {type(error).__name__})"]


def tail(log: Iterable[str], lines: int) -> list[str]:
    kept: list[str] = []
    for line in log:
        kept = [*kept[-(lines - 1) :], line.rstrip("\n")]
    return kept
