"""The RunPod template for an image: the body RunPod's REST API v2 accepts, printed for a person to paste,
or saved through the API with `RUNPOD_API_KEY` (one template per name, updated in place on every push).

The API is described by RunPod's published OpenAPI file (runpod/docs, `api-reference-v2/openapi.json`);
tests/support/runpod_server.py serves that description strictly, so every body here is checked against it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from runtime.runpod.api import API_URL, CUDA_VERSIONS, VOLUME_PATH, RunPodClient, RunPodError
from runtime.runpod.clusters import cluster_body as spread_cluster
from runtime.runpod.payloads import ClusterBody, ClusterCompute, JsonObject, TemplateBody
from runtime.runpod.proxy import PUBLIC_PORT, SSH_PORT
from space import BuildError
from space.targets import ROOT

PORTS = [f"{PUBLIC_PORT}/http", f"{SSH_PORT}/tcp"]  # the bridge (RunPod's HTTPS proxy serves it) and sshd (direct TCP)
CONTAINER_DISK_GB = 30  # the image itself; everything that grows lives on the volume
VOLUME_GB = 200  # model weights are tens of GB, plus vLLM's compile caches
COST_PER_HOUR_MAX = 1000.0  # VL_COST_PER_HOUR's bound (runtime/settings.py, not imported here; a test compares)
DEFAULT_MODEL = "nemotron"  # VL_MODEL's default (runtime/settings.py), spelled out in the template
RECIPES_DIR = ROOT / "runtime" / "engine" / "recipes"  # what VL_MODEL may name: one TOML file per recipe
REGISTRY_USER, REGISTRY_TOKEN = "REGISTRY_USER", "REGISTRY_READ_TOKEN"  # a --registry image's pull credential
SECRETS = {  # variable -> RunPod secret of the same name (created once in the console, never sent by us)
    "HF_TOKEN": "a Hugging Face token with WRITE access to the log repo (a read token: no log), for gated models",
    "VL_API_KEYS": "the keys Claude Code may send (comma-separated): the bridge refuses any other",
}


def secret_reference(name: str) -> str:
    """How a template names a RunPod secret in an env value, substituted when the pod starts.

    Syntax from RunPod's docs (runpod/docs: pods/templates/secrets.mdx, "Direct reference method", and
    pods/templates/environment-variables.mdx): `{{ RUNPOD_SECRET_secret_name }}`.
    """
    return f"{{{{ RUNPOD_SECRET_{name} }}}}"


def recipe_names() -> list[str]:
    """The recipes VL_MODEL may name (runtime/settings.py's list, read from the files: the build side imports
    no settings)."""
    return sorted(path.stem for path in RECIPES_DIR.glob("*.toml"))


def template_env(
    cost_per_hour: float | None = None,
    log_repo: str | None = None,
    config_repo: str | None = None,
    model: str | None = None,
) -> dict[str, str]:
    """The pod's environment: the recipe (`model`, else the default), secrets by reference only, the Hub repos of
    its boot log and its settings file, and the GPU's hourly price when given (the console's cost figures). No cache
    variable: the runtime finds the volume at VOLUME_PATH (VL_VOLUME's default) and keeps weights there."""
    if cost_per_hour is not None and not 0 < cost_per_hour <= COST_PER_HOUR_MAX:
        raise BuildError(f"--cost-per-hour must be a price in dollars, above 0 and at most {COST_PER_HOUR_MAX:g}")
    repos = {"VL_LOG_REPO": log_repo, "VL_CONFIG_REPO": config_repo}  # pod settings: the environment only
    return {
        "VL_MODEL": model or DEFAULT_MODEL,  # spelled out so it is visible (and editable) in the console
        **{name: secret_reference(name) for name in SECRETS},  # values live in RunPod, never in the template
        **{name: repo for name, repo in repos.items() if repo},
        # VL_COST_PER_HOUR is left out unless given: a template fits any GPU, the price is the GPU's.
        **({"VL_COST_PER_HOUR": f"{cost_per_hour:g}"} if cost_per_hour is not None else {}),
    }


def template_body(
    name: str,
    image: str,
    *,
    registry_id: str | None = None,
    cost_per_hour: float | None = None,
    log_repo: str | None = None,
    config_repo: str | None = None,
    model: str | None = None,
) -> TemplateBody:
    """The template as a CreateTemplateRequest (also a valid UpdateTemplateRequest: every field is mutable)."""
    return {
        "name": name,
        "image": image,
        "category": "NVIDIA",  # a GPU image (only groups it in the console)
        "disk": CONTAINER_DISK_GB,
        "mounts": {"persistent": {"size": VOLUME_GB, "path": VOLUME_PATH}},
        "ports": list(PORTS),
        "env": template_env(cost_per_hour, log_repo, config_repo, model),
        "registry": registry_id,  # the credential for a private image; null clears a stale one on update
        "allowedCudaVersions": list(CUDA_VERSIONS),
        "startSsh": True,  # RunPod injects PUBLIC_KEY (the account's SSH keys); the runtime's sshd uses it
        "startJupyter": False,  # the image has no Jupyter: no generated JUPYTER_PASSWORD
        "serverless": False,  # a pod template
        "public": False,  # it names the owner's secrets and registry credential
    }


def cluster_body(name: str, image: str, gpu_type: str, gpus_per_node: int, nodes: int) -> ClusterBody:
    """An Instant Cluster as a CreateClusterRequest (`POST /v2/clusters`, type APPLICATION), for a model larger than
    one machine: the template's pod on every node (runtime/runpod/clusters.py spreads it), each node taking its role
    from RunPod's variables (rank 0 serves; the others run vLLM's engine headless) and the split from the model's
    sizing; no Ray. `python -m runtime pod up --nodes N` makes one from a saved template. Clusters take public images
    only (no `registry` field)."""
    compute = ClusterCompute(gpuTypeId=gpu_type, gpuCountPerPod=gpus_per_node, podCount=nodes)
    return spread_cluster(name, template_body(name, image), compute)


def repository(image: str) -> tuple[str, str]:
    """(registry host, repository path) of an image reference, tag and digest dropped; Docker Hub by default."""
    path = image.split("@", 1)[0]
    if ":" in path.rsplit("/", 1)[-1]:
        path = path.rsplit(":", 1)[0]
    first, _, rest = path.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return "docker.io", path


def template_name(target: str, source: str) -> str:
    """One template per image: the target and where its image is made (a Space, a registry repository),
    so that publishing a second Space never repoints the first one's template."""
    return f"vllm-pod {target} {source}"


def registry_name(image: str) -> str:
    """The registry credential's name for an image: its repository, so one credential serves every tag."""
    host, path = repository(image)
    return f"{host}/{path}"


def render_template(body: TemplateBody, *, private: bool = False, saving: bool = False, registry: bool = False) -> str:
    """A template body (`template_body`) for a person: the JSON for `POST /v2/templates`, the secrets to create,
    and the registry credential a `private` image needs, or a `registry` image (--registry) if it is private
    (never a value: only names and where to set them); `saving`: build.py saves them itself next."""
    lines = [
        f"RunPod template {body['name']!r} (body for POST {API_URL}/v2/templates, or the console's fields):",
        json.dumps(body, indent=2),
        "Create these secrets, named exactly so, at https://console.runpod.io/user/secrets:",
    ]
    lines += [f"  {secret}: {why}" for secret, why in SECRETS.items()]
    if private and not saving:
        host = repository(body["image"])[0]
        lines.append(
            f"The image is private: add a container registry credential for {host} "
            "(https://console.runpod.io/user/settings: your username and a read token), select it in the "
            "template, or run build.py with --runpod and RUNPOD_API_KEY to save both."
        )
    if registry and not saving:
        lines.append(
            f"If the image is private, RunPod pulls it with a container registry credential: create one named "
            f"{registry_name(body['image'])!r} (https://console.runpod.io/user/settings: a user name and a token "
            f"that may only read packages) and select it in the template, or set {REGISTRY_USER} and "
            f"{REGISTRY_TOKEN} and run build.py with --runpod and RUNPOD_API_KEY to save both."
        )
    return "\n".join(lines)


class RunPodAPI(RunPodClient):
    """The project's one RunPod client (runtime.runpod.api), each call ending in data or a BuildError: build.py's way."""

    def __init__(self, api_key: str, base_url: str | None = None, *, secrets: tuple[str, ...] = ()) -> None:
        try:
            super().__init__(api_key, base_url, secrets=secrets)
        except RunPodError as error:
            raise BuildError(str(error)) from None

    def __enter__(self) -> RunPodAPI:
        return self

    def call(
        self, method: str, path: str, action: str, body: Mapping[str, object] | None = None, expect: str | None = "id"
    ) -> JsonObject:
        try:
            return super().call(method, path, action, body, expect)
        except RunPodError as error:
            raise BuildError(str(error)) from None


def named_registry(api: RunPodAPI, image: str) -> str | None:
    """The id of the credential named after the image's repository (made by build.py or in the console by that
    name), else None: the image is then pulled anonymously, and the line says what to create if it is private."""
    name = registry_name(image)
    existing = [r for r in api.registries() if r.get("name") == name]
    if existing:
        print(f"RunPod: the template pulls with the registry credential {name!r} ({existing[0]['id']})")
        return str(existing[0]["id"])
    print(
        f"RunPod: no registry credential named {name!r}: pods pull the image anonymously; if it is private, set "
        f"{REGISTRY_USER} and {REGISTRY_TOKEN} (a token that may only read packages) and run again, or create a "
        "credential of that name in the console (Settings, container registry auth) and run again"
    )
    return None


def ensure_registry(api: RunPodAPI, image: str, username: str, password: str) -> str:
    """The id of the image's registry credential: an existing one of that name, else a new one.

    The API has no update for a credential (`/v2/registries/{id}` is GET and DELETE only, and credentials are
    write-only), so an existing one is reused as is; to change its password, delete it and run again.
    """
    name = registry_name(image)
    existing = [r for r in api.registries() if r.get("name") == name]
    if existing:
        print(
            f"RunPod: reusing the registry credential {name!r} ({existing[0]['id']}); RunPod cannot update one: "
            "to change its password, delete it in the console (Settings, container registry auth) and run again"
        )
        return str(existing[0]["id"])
    created = api.create_registry(name, username, password)
    print(f"RunPod: created the registry credential {name!r} ({created['id']})")
    return str(created["id"])


def ensure_template(api: RunPodAPI, body: TemplateBody, owned: Iterable[str] = ()) -> str:
    """Creates the template, or updates the one with the same name: its env keeps what the console set (added
    variables, changed values) but for the `owned` variables, those the command line chose this time."""
    name = body["name"]
    same_name = [t for t in api.templates() if t.get("name") == name]
    if len(same_name) > 1:
        ids = ", ".join(t["id"] for t in same_name)
        raise BuildError(
            f"{len(same_name)} RunPod templates are named {name!r} ({ids}): delete or rename all but "
            "one in the console (My Templates), then run again"
        )
    if not same_name:
        created = api.create_template(body)
        print(f"RunPod: created the template {name!r} ({created['id']})")
        return str(created["id"])
    current, ours = same_name[0], body["env"]
    console: dict[str, str] = current.get("env") or {}
    chosen = {variable: ours[variable] for variable in owned if variable in ours}
    added = sorted(set(console) - set(ours))
    changed = sorted(v for v in ours if v in console and v not in chosen and console[v] != ours[v])
    updated = api.update_template(current["id"], {**body, "env": {**ours, **console, **chosen}})
    print(
        f"RunPod: updated the template {name!r} ({updated['id']})"
        + (f"; kept the variables added in the console: {', '.join(added)}" if added else "")
        + (f"; kept the console's {', '.join(changed)}" if changed else "")
        + (" (--model RECIPE sets VL_MODEL)" if "VL_MODEL" in changed else "")
    )
    return str(updated["id"])


def save_template(
    body: TemplateBody,
    api_key: str,
    registry_auth: tuple[str, str] | None,
    base_url: str | None = None,
    *,
    owned: Iterable[str] = (),
    find_registry: bool = False,
) -> str:
    """Creates or updates the template `body` names (and, for a private image, the registry credential
    from `registry_auth` = (username, password); without one, with `find_registry`, the credential named after
    the image if there is one); `owned`: see `ensure_template`. Prints a line per step, returns the template id."""
    if registry_auth and not all(registry_auth):
        raise BuildError("a private image needs both a registry username and a password (or token) for RunPod")
    password = registry_auth[1] if registry_auth else ""
    with RunPodAPI(api_key, base_url, secrets=(password,)) as api:
        if registry_auth:
            registry_id: str | None = ensure_registry(api, body["image"], *registry_auth)
        else:
            registry_id = named_registry(api, body["image"]) if find_registry else None
        return ensure_template(api, {**body, "registry": registry_id}, owned)
