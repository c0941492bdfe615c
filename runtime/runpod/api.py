"""RunPod's REST API v2, as the project speaks it (the commands, build.py's side, the pod stopping itself): one
request at a time, each answer read into its shape (`payloads`) or a `RunPodError` whose text is one line with the
fix, never the key.

The API is described by RunPod's published OpenAPI file (runpod/docs, `api-reference-v2/openapi.json`);
tests/support/runpod_server.py serves that description strictly. `RUNPOD_API_URL` points the client
elsewhere (the tests' stand-in). Standard library, httpx and the runtime's leaves only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import httpx

from runtime.headers import USER_AGENT
from runtime.runpod.payloads import (
    Cluster,
    ClusterBody,
    GpuType,
    JsonObject,
    NetworkVolume,
    Pod,
    PodBody,
    Registry,
    Template,
    TemplateBody,
)

API_URL = "https://api.runpod.io"  # the `servers` entry of RunPod's OpenAPI description of REST API v2
API_URL_VARIABLE = "RUNPOD_API_URL"  # points the client elsewhere (the tests' stand-in)
KEY_VARIABLE = "RUNPOD_API_KEY"
VOLUME_PATH = "/workspace"  # RunPod's convention, and VL_VOLUME's default: the one path that survives a stop
CUDA_VERSIONS = ["13.0"]  # the images are built on CUDA 13.0 and refuse an older driver at start
TIMEOUT = httpx.Timeout(30.0, connect=10.0)  # every call: a hung API must end in one line, not a hung command
KEYS_PAGE = "https://console.runpod.io/user/settings"


class RunPodError(Exception):
    """RunPod refused or could not be reached; `str()` is the one line to show (never the key)."""

    def __init__(self, line: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(line)
        self.status, self.detail = status, detail


class RunPodClient:
    """Calls to RunPod's REST API v2 with one key; a context manager that closes its connections."""

    def __init__(self, api_key: str, base_url: str | None = None, *, secrets: tuple[str, ...] = ()) -> None:
        self.api_key = usable_key(api_key)
        self.base_url = (base_url or os.environ.get(API_URL_VARIABLE) or API_URL).rstrip("/")
        self.secrets = (self.api_key, *[s for s in secrets if s])  # never in a message, whatever the server says
        headers = {"Authorization": f"Bearer {self.api_key}", "User-Agent": USER_AGENT}
        self.client = httpx.Client(base_url=self.base_url, timeout=TIMEOUT, headers=headers)

    def __enter__(self) -> RunPodClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def call(
        self, method: str, path: str, action: str, body: Mapping[str, object] | None = None, expect: str | None = "id"
    ) -> JsonObject:
        """One request, answered by a JSON object holding `expect` (None: an empty answer will do); `action`
        says what it was for in an error line (e.g. "create the template 'x'")."""
        try:
            response = self.client.request(method, path, json=body)
        except httpx.TimeoutException:
            raise RunPodError(
                f"RunPod's API at {self.base_url} did not answer within {TIMEOUT.read:g} s "
                f"(trying to {action}): try again, or check {API_URL_VARIABLE} if you set it"
            ) from None
        except httpx.UnsupportedProtocol:
            raise RunPodError(
                f"RunPod's API URL {self.base_url!r} is not an http(s) URL: fix or unset {API_URL_VARIABLE}"
            ) from None
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise RunPodError(
                f"RunPod's API at {self.base_url} could not be reached ({type(exc).__name__}, "
                f"trying to {action}): check the network, or {API_URL_VARIABLE} if you set it"
            ) from None
        if response.is_error:
            detail = self.scrub(problem_of(response).detail)  # RunPod's 400 can quote the request back
            raise RunPodError(self.scrub(refusal(response, action)), response.status_code, detail)
        if expect is None and not response.content:
            return {}
        try:
            answer: object = response.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or (expect is not None and expect not in answer):
            raise RunPodError(
                f"RunPod answered {method} {path} with an unexpected body (HTTP {response.status_code}, "
                f"trying to {action}): check {API_URL_VARIABLE} if you set it"
            )
        return cast(JsonObject, answer)

    # --- the calls every side makes: build.py's templates and registry credentials, `runtime pod`'s pods, the pod's
    # own stop. Each answer is read into its shape here, once: `call` checked the key its shape is known by.

    def templates(self) -> list[Template]:
        answer = self.call("GET", "/v2/templates", "list your templates", expect="templates")
        return cast(list[Template], list_of(answer["templates"]))

    def create_template(self, body: TemplateBody) -> Template:
        return cast(Template, self.call("POST", "/v2/templates", f"create the template {body['name']!r}", body))

    def update_template(self, template_id: str, body: TemplateBody) -> Template:
        action = f"update the template {body['name']!r}"
        return cast(Template, self.call("PATCH", f"/v2/templates/{template_id}", action, body))

    def registries(self) -> list[Registry]:
        action = "list your container registry credentials"
        return cast(
            list[Registry], list_of(self.call("GET", "/v2/registries", action, expect="registries")["registries"])
        )

    def create_registry(self, name: str, username: str, password: str) -> Registry:
        body = {"name": name, "username": username, "password": password}
        return cast(Registry, self.call("POST", "/v2/registries", f"create the registry credential {name!r}", body))

    def pod(self, pod_id: str) -> Pod:
        return cast(Pod, self.call("GET", f"/v2/pods/{pod_id}", f"read the pod {pod_id}"))

    def pods(self) -> list[Pod]:
        return cast(list[Pod], list_of(self.call("GET", "/v2/pods", "list your pods", expect="pods")["pods"]))

    def create_pod(self, body: PodBody, on: str) -> Pod:
        return cast(Pod, self.call("POST", "/v2/pods", f"create {on}", body))

    def act(self, pod_id: str, action: str) -> None:
        self.call("POST", f"/v2/pods/{pod_id}/action", f"{action} the pod {pod_id}", {"action": action}, None)

    def stop_pod(self, pod_id: str) -> None:
        """The pod stopped (RunPod then sends it SIGTERM); what a pod calls on itself, with its own id."""
        self.call("POST", f"/v2/pods/{pod_id}/action", "stop this pod", {"action": "stop"}, None)

    def delete_pod(self, pod_id: str) -> None:
        self.call("DELETE", f"/v2/pods/{pod_id}", f"delete the pod {pod_id}", expect=None)

    def clusters(self) -> list[Cluster]:
        return cast(
            list[Cluster],
            list_of(self.call("GET", "/v2/clusters", "list your clusters", expect="clusters")["clusters"]),
        )

    def cluster(self, cluster_id: str) -> Cluster:
        return cast(Cluster, self.call("GET", f"/v2/clusters/{cluster_id}", f"read the cluster {cluster_id}"))

    def cluster_pods(self, cluster_id: str) -> list[Pod]:
        """A cluster's member pods, whole (the cluster itself only counts them)."""
        action = f"list the cluster {cluster_id}'s pods"
        return cast(
            list[Pod], list_of(self.call("GET", f"/v2/clusters/{cluster_id}/pods", action, expect="pods")["pods"])
        )

    def create_cluster(self, body: ClusterBody, on: str) -> Cluster:
        return cast(Cluster, self.call("POST", "/v2/clusters", f"create {on}", body))

    def delete_cluster(self, cluster_id: str) -> None:
        """The cluster deleted, every member pod with it (RunPod's API stops no cluster: it deletes one, whole)."""
        self.call("DELETE", f"/v2/clusters/{cluster_id}", f"delete the cluster {cluster_id}", expect=None)

    def gpu_types(self) -> list[GpuType]:
        """RunPod's GPU catalogue (`GET /v2/catalog/gpus`, its schema GpuType): ids, memory, prices, and each
        type's stock for pods."""
        path = "/v2/catalog/gpus?include=AVAILABILITY&product=POD"
        return cast(list[GpuType], list_of(self.call("GET", path, "list the GPU types", expect="gpus")["gpus"]))

    def network_volumes(self) -> list[NetworkVolume]:
        action = "list your network volumes"
        answer = self.call("GET", "/v2/network-volumes", action, expect="networkVolumes")
        return cast(list[NetworkVolume], list_of(answer["networkVolumes"]))

    def scrub(self, line: str) -> str:
        for secret in self.secrets:
            line = line.replace(secret, "***")
        return line


def usable_key(api_key: str) -> str:
    """The key as sent in a header: stripped of the newline a copy or a file adds; refused when unusable."""
    key = (api_key or "").strip()
    if not key:
        raise RunPodError(f"{KEY_VARIABLE} is empty: create an API key at {KEYS_PAGE}")
    if not key.isascii() or not key.isprintable() or " " in key:
        raise RunPodError(f"{KEY_VARIABLE} has spaces or unusual characters: copy it again from RunPod's console")
    return key


def refusal(response: httpx.Response, action: str) -> str:
    """One line for an error answer: the key's refusal, else the problem+json title/detail/errors."""
    problem = problem_of(response)
    reason = "; ".join(p for p in (problem.title, problem.detail, *problem.errors) if p)
    reason = " ".join((reason or f"HTTP {response.status_code}").split())  # one line, whatever the server sent
    if response.status_code in (401, 403):
        return (
            f"{KEY_VARIABLE} was refused: {reason} (trying to {action}): use a key with All or Read/Write "
            f"permission (console Settings, API Keys: {KEYS_PAGE})"
        )
    return f"RunPod refused to {action}: HTTP {response.status_code}: {reason}"


@dataclass(frozen=True)
class Problem:
    """The RFC 9457 problem object of an error answer (ErrorResponse); empty when it is not one."""

    title: str = ""
    detail: str = ""
    errors: tuple[str, ...] = ()


def problem_of(response: httpx.Response) -> Problem:
    try:
        problem: object = response.json()
    except ValueError:
        return Problem()
    if not isinstance(problem, dict):
        return Problem()
    errors = problem.get("errors")
    return Problem(
        str(problem.get("title") or ""),
        str(problem.get("detail") or ""),
        tuple(str(e) for e in errors) if isinstance(errors, list) else (),
    )


def list_of(items: object) -> list[JsonObject]:
    """A list RunPod answered, its objects that hold an id only (`call` checked the key holding the list)."""
    return [item for item in items if isinstance(item, dict) and "id" in item] if isinstance(items, list) else []
