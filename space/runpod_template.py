"""The RunPod template of a published image, as build.py offers it: printed for a person, saved through
RunPod's API with --runpod, and its VL_LOG_REPO (the pods' boot log on the Hub) made when it is missing.

space/runpod.py writes the template's body and speaks RunPod's API; this module decides what goes in.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from runtime.runpod import proxy
from runtime.runpod.payloads import TemplateBody
from space import BuildError, hf_space, runpod
from space.publish import Published, Say
from space.targets import Target

DEFAULT_LOG_REPO = "datasets/{user}/vllm-pod-logs"  # a private dataset: the pods' boot logs (VL_LOG_REPO)
DESKTOP_PORT = f"{proxy.DESKTOP_PORT}/http"  # the browser desktop (runtime/pod/desktop.py) through RunPod's HTTPS proxy
DESKTOP_SECRET = "VL_DESKTOP_PASSWORD"  # a RunPod secret of the same name, like HF_TOKEN and VL_API_KEYS
REPO_TYPES = {"datasets": "dataset", "spaces": "space"}


@dataclasses.dataclass(frozen=True)
class TemplateChoice:
    """What the command line asks of the template: the values it carries (--log-repo, --config-repo,
    --cost-per-hour), whether it is saved on RunPod (--runpod), whether its log repo is made when missing, and
    whether its pods run the browser desktop (VL_DESKTOP=on, port 6080), and the recipe they serve (--model)."""

    log_repo: str | None
    config_repo: str | None
    cost_per_hour: float | None
    save: bool
    create_log_repo: bool
    desktop: bool = False
    model: str | None = None

    def owned(self) -> set[str]:
        """The template's variables this command line chose: an update writes them over the console's values
        (the others it writes only where the template lacks them: a user's edit in the console stays)."""
        chosen = {
            "VL_MODEL": self.model,
            "VL_LOG_REPO": self.log_repo,
            "VL_CONFIG_REPO": self.config_repo,
            "VL_COST_PER_HOUR": self.cost_per_hour,
            "VL_DESKTOP": self.desktop or None,
            DESKTOP_SECRET: self.desktop or None,
        }
        return {variable for variable, value in chosen.items() if value is not None}


def show_template(target: Target, published: Published, choice: TemplateChoice, say: Say) -> None:
    """Print the RunPod template for the image; with `choice.save`, save it through RunPod's API too."""
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
    credential = runpod_credentials(published) if choice.save else None  # refused before anything is made
    body = runpod.template_body(
        runpod.template_name(target.name, published.source),
        published.image,
        cost_per_hour=choice.cost_per_hour,
        log_repo=log_repo(choice, published.hub_user, say),
        config_repo=choice.config_repo,
        model=choice.model,
    )
    if choice.desktop:
        if not target.desktop:
            raise BuildError(f"the {target.name} image has no desktop (docker/targets.toml: desktop = false)")
        body = with_desktop(body)
    print(
        runpod.render_template(
            body, private=bool(published.pull_user), saving=choice.save, registry=not published.space
        )
    )
    if choice.desktop:
        print(
            f"Create the secret {DESKTOP_SECRET} too: the browser desktop's password (8 to 128 visible ASCII "
            f"characters), asked at {proxy.proxy_url('POD_ID', proxy.DESKTOP_PORT, environ={})}/"
        )
    if credential is not None:
        runpod.save_template(body, *credential, owned=choice.owned(), find_registry=not published.space)


def with_desktop(body: TemplateBody) -> TemplateBody:
    """The template with the browser desktop on: VL_DESKTOP=on, its password a RunPod secret (by reference: the
    value never passes through here), and port 6080."""
    env = {**body["env"], "VL_DESKTOP": "on", DESKTOP_SECRET: runpod.secret_reference(DESKTOP_SECRET)}
    desktop = body.copy()
    desktop["env"], desktop["ports"] = env, desktop_ports(body["ports"], env)
    return desktop


def desktop_ports(ports: list[str], env: dict[str, str]) -> list[str]:
    """The template's ports with 6080 exactly when its environment turns the desktop on: RunPod's proxy would
    otherwise publish a port with nothing behind it."""
    others = [port for port in ports if port != DESKTOP_PORT]
    return [*others, DESKTOP_PORT] if env.get("VL_DESKTOP") == "on" else others


def log_repo(choice: TemplateChoice, user: str | None, say: Say) -> str | None:
    """The template's VL_LOG_REPO: --log-repo, else the token `user`'s private dataset (asked of the Hub when
    not known); made when missing if the choice says so (a pod would make it at its first publish; `runtime
    logs --follow` needs it sooner)."""
    if not hf_space.has_token():
        if not choice.log_repo:
            say(
                "no Hugging Face token: the template sets no VL_LOG_REPO (pods publish no boot log); set HF_TOKEN "
                "or pass --log-repo REPO"
            )
        return choice.log_repo
    api = hf_space.hub_api()
    spec = choice.log_repo or DEFAULT_LOG_REPO.format(
        user=user or hf_space.hub_call(api.whoami, "check the token")["name"]
    )
    if choice.create_log_repo:
        ensure_log_repo(api, spec)
        say(f"pods publish their boot log to {spec} (private): python -m runtime logs POD_ID --follow --repo {spec}")
    return spec


def ensure_log_repo(api: Any, spec: str) -> None:
    """Create the pods' log repo (private) when it is missing, so that `runtime logs POD --follow` works
    on the very first pod; `spec` is written as VL_LOG_REPO takes it (`datasets/owner/name`, `owner/name`)."""
    prefix, _, rest = spec.partition("/")
    repo_type, repo_id = (REPO_TYPES[prefix], rest) if prefix in REPO_TYPES else ("model", spec)
    hf_space.hub_call(
        lambda: api.create_repo(repo_id, repo_type=repo_type, private=True, exist_ok=True),
        f"create the log repo {spec}",
    )


def runpod_credentials(published: Published) -> tuple[str, tuple[str, str] | None]:
    """RUNPOD_API_KEY, and for a private image the registry credential RunPod pulls it with: the user and
    HF_READ_TOKEN, which the Hub must not call a write token (RunPod stores it); for a --registry image,
    REGISTRY_USER and REGISTRY_READ_TOKEN when given."""
    key = os.environ.get("RUNPOD_API_KEY", "")
    if not key:
        raise BuildError("--runpod needs RUNPOD_API_KEY (https://www.runpod.io/console/user/settings)")
    if not published.space:
        return key, registry_credential()
    if not published.pull_user:
        return key, None
    password = os.environ.get("HF_READ_TOKEN", "")
    if not password:
        raise BuildError(
            "a private image needs a registry credential on RunPod: set HF_READ_TOKEN to a read "
            "token (not the write token), or publish with --public"
        )
    role = hf_space.token_role(hf_space.hub_call(lambda: hf_space.hub_api(password).whoami(), "check HF_READ_TOKEN"))
    if role == "write":
        raise BuildError(
            "HF_READ_TOKEN is a write token (the Hub says so): RunPod stores it as a registry password, so give "
            "it a read token (https://huggingface.co/settings/tokens)"
        )
    return key, (published.pull_user, password)


def registry_credential() -> tuple[str, str] | None:
    """A --registry image's pull credential for RunPod: REGISTRY_USER and REGISTRY_READ_TOKEN (both, or neither:
    then the credential named after the image, if RunPod has one, else an anonymous pull)."""
    user, token = os.environ.get(runpod.REGISTRY_USER, ""), os.environ.get(runpod.REGISTRY_TOKEN, "")
    if bool(user) != bool(token):
        missing = runpod.REGISTRY_TOKEN if user else runpod.REGISTRY_USER
        raise BuildError(
            f"{missing} is not set: RunPod's registry credential needs {runpod.REGISTRY_USER} and "
            f"{runpod.REGISTRY_TOKEN} (a token that may only read packages: RunPod stores it)"
        )
    return (user, token) if user else None
