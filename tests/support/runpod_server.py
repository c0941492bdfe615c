"""A strict local stand-in for RunPod's REST API v2: the template, registry, pod and network-volume routes,
with in-memory state, checking every request body and every answer against RunPod's published OpenAPI
description (vendored).

Routes: `GET/POST /v2/templates`, `GET/PATCH /v2/templates/{id}`, `GET/POST /v2/registries`,
`GET /v2/registries/{id}`, `GET/POST /v2/pods`, `GET/DELETE /v2/pods/{id}`, `POST /v2/pods/{id}/action`,
`GET /v2/network-volumes`, `GET /v2/catalog/gpus` (GPU_TYPES, with each type's data centres), and the Instant
Clusters' routes (runpod_clusters.py: `/v2/clusters…`, each member a pod here, RunPod's variables for each node). Pods go PROVISIONING → STARTING → RUNNING, one step per read of the pod
(as a poller sees it); `stop` → EXITED, `start` → RUNNING, `terminate` or DELETE → gone; an action the
status does not allow is a 409. What the spec leaves to RunPod's judgement is set by the test:
`out_of_stock` GPU types or CPU flavours (a 400 whose detail says no instance is available, the spec's capacity
refusal; the catalogue says NONE), `out_of_stock_in` a GPU type's data centres (the same refusal there, while the
catalogue still lists them, as stock moves between a read and a create), `host_cuda` (the CUDA version a GPU type's hosts report: outside `allowedCudaVersions`, the
same refusal), `host_taken` pods (their `start` refused with a 400: not enough free GPUs on the host),
and `on_pod` (called with a pod's id and its new status, under the lock: a test starts or stops what
plays the pod). Bearer auth (`api_key` may write; `read_only_key` gets 403 on writes, the spec's
"valid key lacking access"); errors are `application/problem+json` ErrorResponse objects: 401/403, 404 for
an unknown id or route, 400 for a body that is not JSON (or a CPU pod's body the spec's text refuses:
a persistent mount, a flavour not listed, a vCPU count not a power of two), and 422 with the validator's messages for one the
schema refuses (the spec's own wording: "rejected with 422 by the schema validator"). Every request is kept
in `received`; an answer of ours that breaks the spec goes to `faults` (the fixture fails the test on one).
Use it through the `runpod_server` fixture (and `runpod_openapi` for the spec's schemas).
"""

from __future__ import annotations

import json
import secrets
import string
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.net import Served

SPEC_PATH = Path(__file__).resolve().parent.parent / "data" / "runpod-openapi-v2.json"
SPEC_URI = "urn:runpod:openapi-v2"  # the document's id in the validators' registry: `$ref`s resolve inside it
PROBLEM = "application/problem+json"
ID_ALPHABET = string.ascii_lowercase + string.digits  # ids shaped like the spec's examples ("9x4m2p7v")


class OpenAPISchemas:
    """The spec's component schemas as JSON Schema 2020-12 validators (OpenAPI 3.1's dialect), refs resolved."""

    def __init__(self, path: Path = SPEC_PATH) -> None:
        self.document = json.loads(path.read_text())
        self.registry = Registry().with_resource(SPEC_URI, DRAFT202012.create_resource(self.document))
        self.validators: dict[str, Draft202012Validator] = {}

    @property
    def server_url(self) -> str:
        return self.document["servers"][0]["url"]

    def validator(self, schema: str) -> Draft202012Validator:
        if schema not in self.validators:
            if schema not in self.document["components"]["schemas"]:
                raise KeyError(f"no schema {schema!r} in {SPEC_PATH.name}")
            ref = {"$ref": f"{SPEC_URI}#/components/schemas/{schema}"}
            self.validators[schema] = Draft202012Validator(ref, registry=self.registry)
        return self.validators[schema]

    def errors(self, schema: str, instance: object) -> list[str]:
        """What the schema refuses in `instance`, one line each (`$.path: message`); [] when valid."""
        found = sorted(self.validator(schema).iter_errors(instance), key=lambda e: (e.json_path, e.message))
        return [f"{error.json_path}: {error.message}" for error in found]


SCHEMAS = OpenAPISchemas()


class Problem(Exception):
    """An error answer as the spec shapes them: an ErrorResponse (`title`, `status`, `detail`, `errors`)."""

    def __init__(self, status: int, detail: str, errors: list[str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors

    def body(self) -> dict[str, Any]:
        body = {"title": HTTPStatus(self.status).phrase, "status": self.status, "detail": self.detail}
        return body | ({"errors": self.errors} if self.errors else {})


@dataclass(frozen=True)
class Received:
    """One request as the server saw it, the status it got, and the schema its body was checked against."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    schema: str | None

    def json(self) -> Any:
        return json.loads(self.body)

    def carries(self, text: str) -> bool:
        """Whether `text` was sent anywhere but the Authorization header (where the key belongs)."""
        others = " ".join(v for k, v in self.headers.items() if k != "authorization")
        return text in self.path or text in others or text.encode() in self.body


@dataclass
class RunPodState:
    """The account: its keys, templates and registry credentials (stored with the write-only secrets)."""

    api_key: str
    read_only_key: str
    lock: threading.RLock = field(default_factory=threading.RLock)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    registries: dict[str, dict[str, str]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    volumes: dict[str, dict[str, Any]] = field(default_factory=dict)
    out_of_stock: set[str] = field(default_factory=set)  # GPU types (CPU flavours) out of stock everywhere
    out_of_stock_in: set[tuple[str, str]] = field(default_factory=set)  # (GPU type, data centre)
    quotes_requests: bool = False  # a 400's detail quotes the request back, its key and body with it
    host_cuda: dict[str, str] = field(default_factory=dict)  # GPU type -> CUDA version; default DEFAULT_CUDA
    host_taken: set[str] = field(default_factory=set)
    next_pod_id: str | None = None  # the id the next created pod gets (a test's Hub log path), else a new one
    hosts: list[str] = field(default_factory=list)  # where the next GPU pods land (a sick host), else each alone
    on_pod: Callable[[str, str], None] = lambda pod_id, status: None
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)  # runpod_clusters.py's; members in `pods`
    node_variables: dict[str, dict[str, str]] = field(default_factory=dict)  # RunPod's, by cluster member's id
    received: list[Received] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    def new_id(self) -> str:
        return "".join(secrets.choice(ID_ALPHABET) for _ in range(8))

    def authorize(self, request: Request) -> None:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Problem(401, "missing bearer token")
        if key.strip() not in (self.api_key, self.read_only_key):
            raise Problem(401, "invalid API key")
        if request.method != "GET" and key.strip() != self.api_key:
            raise Problem(403, "access denied")

    def template(self, template_id: str) -> dict[str, Any]:
        if template_id not in self.templates:
            raise Problem(404, "template not found")
        return self.templates[template_id]

    def check_registry(self, body: dict[str, Any]) -> None:
        # Assumed, not in the spec's text: a template may only reference a credential of the same account.
        if body.get("registry") is not None and body["registry"] not in self.registries:
            raise Problem(400, f"container registry credential {body['registry']} not found")


DEFAULT_CUDA = "13.0"
NO_CAPACITY = (
    "There are no longer any instances available with the requested specifications. Please refresh and try again."
)
HOST_TAKEN = "There are not enough free GPUs on the host machine to start this pod."
GPU_PRICES = {
    "NVIDIA RTX 6000 Ada Generation": 0.77,
    "NVIDIA L40S": 0.86,
    "NVIDIA GeForce RTX 4090": 0.69,
    "NVIDIA A100 80GB PCIe": 1.19,
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": 1.69,
}
# The catalogue (GET /v2/catalog/gpus): each type's name, memory in GB and the data centres that have it.
GPU_TYPES = {
    "NVIDIA RTX 6000 Ada Generation": ("RTX 6000 Ada", 48, ("US-TX-3", "EU-RO-1")),
    "NVIDIA L40S": ("L40S", 48, ("US-KS-2", "EU-RO-1")),
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 24, ("US-TX-3",)),
    "NVIDIA A100 80GB PCIe": ("A100 PCIe", 80, ("US-KS-2",)),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": ("RTX PRO 6000", 96, ("US-TX-3",)),
}
CPU_FLAVOURS = {"cpu3c", "cpu3g", "cpu5c"}  # what the stand-in's catalog would list
CPU_PRICE_PER_VCPU, CPU_RAM_GB_PER_VCPU = 0.04, 2.0  # the spec's example prices a vCPU at $0.04/h
NEXT_STATUS = {"PROVISIONING": "STARTING", "STARTING": "RUNNING"}
ACTIONS = {  # what each status allows, as the spec's action operation lists it
    "PROVISIONING": ["stop", "terminate"],
    "STARTING": ["stop", "terminate"],
    "RUNNING": ["stop", "restart", "terminate"],
    "EXITED": ["start", "terminate"],
    "ERROR": ["start", "terminate"],
}


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_pod(
    pod_id: str, body: dict[str, Any], template: dict[str, Any] | None, cuda: str | None, host: str | None = None
) -> dict[str, Any]:
    """A Pod from a CreatePodRequest, its template resolved into it (body fields win, env merged per key); on `host`,
    its machine's address in `ssh.direct` when it publishes 22/tcp (RunPod tells it once the pod runs: at once here)."""
    base: dict[str, Any] = {
        k: template[k] for k in ("image", "args", "disk", "ports", "env", "registry") if template and k in template
    }
    mounts = body.get("mounts") or {}
    if not mounts and "gpu" in body and template and template.get("mounts", {}).get("persistent"):
        mounts = {"persistent": template["mounts"]["persistent"]}  # CPU pods do not inherit it (the spec)
    pod: dict[str, Any] = {
        "args": "", "disk": 50, "ports": [], "registry": None, **base,
        **{k: body[k] for k in ("image", "args", "disk", "ports", "registry") if k in body},
        "id": pod_id, "name": body["name"], "status": "PROVISIONING", "actions": ACTIONS["PROVISIONING"],
        "env": {**base.get("env", {}), **body.get("env", {})}, "mounts": mounts,
        "cloud": body.get("cloud", "SECURE"),
        "dataCenterId": (body.get("dataCenterIds") or ["US-TX-3"])[0], "cudaVersion": cuda,
        "ssh": {"proxy": None, "direct": None}, "template": body.get("templateId"), "locked": False, "runtime": None,
        "createdAt": now(), "startedAt": None, "globalNetworking": {"enabled": False},
    }  # fmt: skip
    if "gpu" in body:
        pod["gpu"] = {"id": body["gpu"]["id"], "count": body["gpu"].get("count", 1)}
    else:  # memory: the flavour's RAM per vCPU times the count, as the spec says the API derives it
        pod["cpu"] = {**body["cpu"], "memory": int(CPU_RAM_GB_PER_VCPU * body["cpu"]["vcpuCount"])}
    if host and "22/tcp" in pod["ports"]:
        port = 22000 + sum(map(ord, pod_id)) % 1000
        pod["ssh"]["direct"] = {"host": host, "port": port, "username": "root", "command": f"ssh root@{host} -p {port}"}
    pod["cost"] = price(pod)
    return json.loads(json.dumps(pod))


def price(pod: dict[str, Any]) -> float:
    """A running pod's price per hour: its GPUs', or its vCPUs'."""
    if "gpu" in pod:
        return GPU_PRICES.get(pod["gpu"]["id"], 0.5) * pod["gpu"]["count"]
    return round(CPU_PRICE_PER_VCPU * pod["cpu"]["vcpuCount"], 4)


def new_template(template_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """A Template from a CreateTemplateRequest: the schema's defaults for what the body leaves out."""
    defaults = {
        "args": "",
        "disk": 50,
        "mounts": {},
        "ports": [],
        "env": {},
        "registry": None,
        "serverless": False,
        "public": False,
        "category": "NVIDIA",
        "startSsh": True,
        "startJupyter": True,
        "allowedCudaVersions": [],
    }  # `disk` has no default in the spec: 50 is its examples' value
    return {"id": template_id, **defaults, **json.loads(json.dumps(body))}


def patched(template: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A Template after an UpdateTemplateRequest: fields present replace, omitted ones stay; `mounts: {}` keeps."""
    changes = {k: v for k, v in json.loads(json.dumps(body)).items() if not (k == "mounts" and v == {})}
    return {**template, **changes}


Handler = Callable[[Request, Any], tuple[int, str | None, Any]]  # (status, response schema, body), under the lock
Endpoint = Callable[[Request], Awaitable[Response]]


class RunPodApp:
    """The Starlette app: one handler per operation, each returning (status, response schema, body)."""

    def __init__(self, state: RunPodState) -> None:
        self.state = state

    def asgi(self) -> Starlette:
        routes = [
            Route("/v2/templates", self.operation(self.list_templates), methods=["GET"]),
            Route("/v2/templates", self.operation(self.create_template, "CreateTemplateRequest"), methods=["POST"]),
            Route("/v2/templates/{id}", self.operation(self.get_template), methods=["GET"]),
            Route(
                "/v2/templates/{id}", self.operation(self.update_template, "UpdateTemplateRequest"), methods=["PATCH"]
            ),
            Route("/v2/registries", self.operation(self.list_registries), methods=["GET"]),
            Route("/v2/registries", self.operation(self.create_registry, "CreateRegistryRequest"), methods=["POST"]),
            Route("/v2/registries/{id}", self.operation(self.get_registry), methods=["GET"]),
            Route("/v2/pods", self.operation(self.list_pods), methods=["GET"]),
            Route("/v2/pods", self.operation(self.create_pod, "CreatePodRequest"), methods=["POST"]),
            Route("/v2/pods/{id}", self.operation(self.get_pod), methods=["GET"]),
            Route("/v2/pods/{id}", self.operation(self.delete_pod), methods=["DELETE"]),
            Route("/v2/pods/{id}/action", self.operation(self.pod_action, "PodActionRequest"), methods=["POST"]),
            Route("/v2/network-volumes", self.operation(self.list_volumes), methods=["GET"]),
            Route("/v2/catalog/gpus", self.operation(self.list_gpu_types), methods=["GET"]),
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: self.no_route})

    async def no_route(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        detail = "resource not found" if exc.status_code == 404 else "the method is not allowed for this path"
        response = self.answer(exc.status_code, "ErrorResponse", Problem(exc.status_code, detail).body())
        response.headers.update(exc.headers or {})  # 405 names the allowed methods (`Allow`), as the spec's does
        return response

    def operation(self, handler: Handler, request_schema: str | None = None) -> Endpoint:
        """The route's endpoint: auth, then the body checked against `request_schema`, then the handler."""

        async def endpoint(request: Request) -> Response:
            raw = await request.body()
            try:
                with self.state.lock:
                    self.state.authorize(request)
                    body = parsed(raw, request_schema)
                    status, schema, answer = handler(request, body)
            except Problem as problem:
                status, schema, answer = problem.status, "ErrorResponse", problem.body()
                if self.state.quotes_requests and status == 400:  # as RunPod's own 400s can: the request, headers too
                    quoted = {
                        "authorization": request.headers.get("authorization"),
                        "body": raw.decode(errors="replace"),
                    }
                    answer["detail"] = f"{answer['detail']} (request: {json.dumps(quoted)})"
            with self.state.lock:
                self.state.received.append(
                    Received(request.method, request.url.path, dict(request.headers), raw, status, request_schema)
                )
            return self.answer(status, schema, answer)

        return endpoint

    def answer(self, status: int, schema: str | None, body: Any) -> Response:
        """The response, after checking it against the spec: a wrong one of ours is a fault, never sent as is."""
        if schema is None:  # an answer without a body (204)
            return Response(status_code=status)
        errors = SCHEMAS.errors(schema, body)
        if errors:
            with self.state.lock:
                self.state.faults.append(f"{status} {schema}: {'; '.join(errors)}")
            return Response("the stand-in broke the spec (see faults)", 500)
        return JSONResponse(body, status, media_type=PROBLEM if schema == "ErrorResponse" else None)

    def list_templates(self, request: Request, body: None) -> tuple[int, str, Any]:
        return 200, "ListTemplatesResponse", {"templates": list(self.state.templates.values())}

    def get_template(self, request: Request, body: None) -> tuple[int, str, Any]:
        return 200, "Template", self.state.template(request.path_params["id"])

    def create_template(self, request: Request, body: dict[str, Any]) -> tuple[int, str, Any]:
        self.state.check_registry(body)
        template = new_template(self.state.new_id(), body)
        self.state.templates[template["id"]] = template
        return 201, "Template", template

    def update_template(self, request: Request, body: dict[str, Any]) -> tuple[int, str, Any]:
        template = self.state.template(request.path_params["id"])
        self.state.check_registry(body)
        self.state.templates[template["id"]] = updated = patched(template, body)
        return 200, "Template", updated

    def list_registries(self, request: Request, body: None) -> tuple[int, str, Any]:
        return 200, "ListRegistriesResponse", {"registries": [public(r) for r in self.state.registries.values()]}

    def get_registry(self, request: Request, body: None) -> tuple[int, str, Any]:
        registry = self.state.registries.get(request.path_params["id"])
        if registry is None:
            raise Problem(404, "registry not found")
        return 200, "Registry", public(registry)

    def create_registry(self, request: Request, body: dict[str, Any]) -> tuple[int, str, Any]:
        registry = {"id": self.state.new_id(), **body}
        self.state.registries[registry["id"]] = registry
        return 201, "Registry", public(registry)

    # --- pods ---

    def list_pods(self, request: Request, body: None) -> tuple[int, str, Any]:
        return 200, "ListPodsResponse", {"pods": list(self.state.pods.values())}

    def get_pod(self, request: Request, body: None) -> tuple[int, str, Any]:
        pod = self.pod(request)
        if pod["status"] in NEXT_STATUS:  # provisioning moves on as it is watched
            self.moved(pod, NEXT_STATUS[pod["status"]])
        return 200, "Pod", pod

    def create_pod(self, request: Request, body: dict[str, Any]) -> tuple[int, str, Any]:
        if ("gpu" in body) == ("cpu" in body):
            raise Problem(400, "exactly one of gpu or cpu must be set")
        template = None
        if "templateId" in body:
            template = self.state.template(body["templateId"])  # 404 when unknown, as the spec says
        elif "image" not in body:
            raise Problem(400, "image is required unless templateId is set")
        cuda: str | None = None  # a CPU pod's host reports none
        if "cpu" in body:
            self.check_cpu(body)
        else:
            gpu = body["gpu"]["id"]
            cuda = self.state.host_cuda.get(gpu, DEFAULT_CUDA)
            allowed = body["gpu"].get("allowedCudaVersions") or (template or {}).get("allowedCudaVersions") or []
            wanted = body.get("dataCenterIds") or list(GPU_TYPES.get(gpu, ("", 0, ("US-TX-3",)))[2])
            if gpu in self.state.out_of_stock or all((gpu, dc) in self.state.out_of_stock_in for dc in wanted):
                raise Problem(400, NO_CAPACITY)
            if allowed and cuda not in allowed:
                raise Problem(400, NO_CAPACITY)
        for volume in (body.get("mounts") or {}).get("network", []):
            if volume["volumeId"] not in self.state.volumes:
                raise Problem(400, f"network volume {volume['volumeId']} not found")
        pod_id, self.state.next_pod_id = self.state.next_pod_id or self.state.new_id(), None
        host = (self.state.hosts.pop(0) if self.state.hosts else f"{pod_id}.machines.example.invalid") if cuda else None
        self.state.pods[pod_id] = pod = new_pod(pod_id, body, template, cuda, host)
        self.state.on_pod(pod_id, "PROVISIONING")
        return 201, "Pod", pod

    def check_cpu(self, body: dict[str, Any]) -> None:
        """A CPU pod's checks, from the spec's text (the schema cannot say them); no CUDA to report."""
        cpu = body["cpu"]
        if "persistent" in (body.get("mounts") or {}):
            raise Problem(400, "mounts.persistent is invalid when cpu is set")
        if cpu["id"] not in CPU_FLAVOURS or cpu["vcpuCount"] & (cpu["vcpuCount"] - 1):
            raise Problem(400, f"no CPU flavour {cpu['id']} with {cpu['vcpuCount']} vCPUs (a power of two)")
        if cpu["id"] in self.state.out_of_stock:
            raise Problem(400, NO_CAPACITY)

    def pod_action(self, request: Request, body: dict[str, Any]) -> tuple[int, str | None, Any]:
        pod, action = self.pod(request), body["action"]
        if action not in pod["actions"]:
            raise Problem(409, f"cannot {action} a pod that is {pod['status']}")
        if action == "terminate":
            return self.delete_pod(request, None)
        if action == "start" and pod["id"] in self.state.host_taken:
            raise Problem(400, HOST_TAKEN)
        self.moved(pod, {"stop": "EXITED", "start": "RUNNING", "restart": "RUNNING"}[action])
        return 200, "Pod", pod

    def delete_pod(self, request: Request, body: None) -> tuple[int, str | None, Any]:
        pod = self.pod(request)
        del self.state.pods[pod["id"]]
        self.state.on_pod(pod["id"], "TERMINATED")
        return 204, None, None

    def pod(self, request: Request) -> dict[str, Any]:
        pod = self.state.pods.get(request.path_params["id"])
        if pod is None:
            raise Problem(404, "pod not found")
        return pod

    def moved(self, pod: dict[str, Any], status: str) -> None:
        pod["status"], pod["actions"] = status, ACTIONS[status]
        running = status == "RUNNING"
        gpus = [{"util": 0, "memoryUtil": 0}] * (pod["gpu"]["count"] if "gpu" in pod else 0)
        pod["runtime"] = {"uptime": 0, "gpus": gpus} if running else None
        pod["startedAt"] = now() if running else pod["startedAt"]
        pod["cost"] = price(pod) if status != "EXITED" else 0.0
        self.state.on_pod(pod["id"], status)

    def list_gpu_types(self, request: Request, body: None) -> tuple[int, str, Any]:
        """The catalogue, with availability when asked as the spec requires it (include=AVAILABILITY with product)."""
        include, product = request.query_params.get("include"), request.query_params.get("product")
        if (include == "AVAILABILITY") != bool(product):
            raise Problem(400, "include=AVAILABILITY requires product, and product is valid only with it")
        with self.state.lock:
            gpus = [self.gpu_type(gpu, bool(include)) for gpu in GPU_TYPES]
        return 200, "ListGpuTypesResponse", {"gpus": gpus}

    def gpu_type(self, gpu: str, availability: bool) -> dict[str, Any]:
        name, memory, centres = GPU_TYPES[gpu]
        price = GPU_PRICES[gpu]
        entry: dict[str, Any] = {
            "id": gpu,
            "name": name,
            "pool": None,
            "manufacturer": "NVIDIA",
            "memory": memory,
            "secure": True,
            "community": True,
            "price": {"secure": price, "community": round(price * 0.7, 2)},
            "maxCount": {"secure": 8, "community": 4},
        }
        if availability:
            # `out_of_stock_in` is not said here: stock moves between a read of the catalogue and a create.
            stocked = (
                []
                if gpu in self.state.out_of_stock
                else [{"id": dc, "name": dc, "availability": "HIGH"} for dc in centres]
            )
            entry["availability"] = "HIGH" if stocked else "NONE"
            if stocked:
                entry["dataCenters"] = stocked
        return entry

    def list_volumes(self, request: Request, body: None) -> tuple[int, str, Any]:
        return 200, "ListNetworkVolumesResponse", {"networkVolumes": list(self.state.volumes.values())}


def parsed(raw: bytes, schema: str | None) -> Any:
    """The request body, refused (400 not JSON, 422 against the schema) unless the operation's schema allows it."""
    if schema is None:
        return None
    try:
        body = json.loads(raw)
    except ValueError:
        raise Problem(400, "request body is not valid JSON") from None
    errors = SCHEMAS.errors(schema, body)
    if errors:
        raise Problem(422, "Request validation failed.", errors)
    return body


def public(registry: dict[str, str]) -> dict[str, str]:
    """A credential as the API shows it: username and password are write-only."""
    return {"id": registry["id"], "name": registry["name"]}


class RunPodServer:
    """The stand-in on 127.0.0.1 (a free port) in a background thread, with a write key and a read-only key."""

    def __init__(self) -> None:
        from tests.support.runpod_clusters import ClusterApp  # its routes added to these (it imports this module)

        self.state = RunPodState(api_key=f"rpa_{secrets.token_hex(20)}", read_only_key=f"rpa_{secrets.token_hex(20)}")
        self.served = Served(ClusterApp(self.state).asgi(), "runpod-server")

    def __enter__(self) -> RunPodServer:
        self.served.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.served.__exit__(*exc)

    @property
    def url(self) -> str:
        return self.served.url

    # --- what tests use ---

    @property
    def api_key(self) -> str:
        return self.state.api_key

    @property
    def read_only_key(self) -> str:
        return self.state.read_only_key

    @property
    def received(self) -> list[Received]:
        with self.state.lock:
            return list(self.state.received)

    @property
    def templates(self) -> list[dict[str, Any]]:
        with self.state.lock:
            return json.loads(json.dumps(list(self.state.templates.values())))

    @property
    def registries(self) -> list[dict[str, str]]:
        """The stored credentials, username and password included (what RunPod keeps, never shows)."""
        with self.state.lock:
            return [dict(r) for r in self.state.registries.values()]

    @property
    def faults(self) -> list[str]:
        with self.state.lock:
            return list(self.state.faults)

    def add_template(self, body: dict[str, Any]) -> str:
        """Stores a template directly (as if made in the console); the body must be a valid CreateTemplateRequest."""
        assert not SCHEMAS.errors("CreateTemplateRequest", body), SCHEMAS.errors("CreateTemplateRequest", body)
        with self.state.lock:
            template = new_template(self.state.new_id(), body)
            self.state.templates[template["id"]] = template
            return template["id"]

    def add_pod(self, body: dict[str, Any], status: str = "EXITED") -> str:
        """A pod of the account made earlier (not played by any machine); the body must be a valid CreatePodRequest."""
        assert not SCHEMAS.errors("CreatePodRequest", body), SCHEMAS.errors("CreatePodRequest", body)
        with self.state.lock:
            template = self.state.template(body["templateId"]) if "templateId" in body else None
            pod = new_pod(self.state.new_id(), body, template, DEFAULT_CUDA)
            self.state.pods[pod["id"]] = pod | {"status": status, "actions": ACTIONS[status]}
            return str(pod["id"])

    def add_volume(self, name: str, size: int = 200, data_center: str = "EU-RO-1") -> str:
        """A network volume of the account (made in the console)."""
        with self.state.lock:
            volume_id = self.state.new_id()
            self.state.volumes[volume_id] = {
                "id": volume_id, "name": name, "size": size, "dataCenter": data_center, "type": "STANDARD"
            }  # fmt: skip
            return volume_id

    @property
    def pods(self) -> list[dict[str, Any]]:
        """Every pod of the account, a cluster's members included."""
        with self.state.lock:
            return json.loads(json.dumps(list(self.state.pods.values())))

    @property
    def clusters(self) -> list[dict[str, Any]]:
        """The account's clusters, each with its members' ids (`members`, by rank)."""
        with self.state.lock:
            return json.loads(json.dumps(list(self.state.clusters.values())))

    def edit_template(self, template_id: str, **changes: Any) -> None:
        """Changes a stored template directly (as a person would in the console)."""
        with self.state.lock:
            self.state.templates[template_id] = patched(self.state.template(template_id), changes)


@pytest.fixture
def runpod_server() -> Iterator[RunPodServer]:
    """A fresh stand-in for one test; it fails the test if any of its own answers broke the spec."""
    with RunPodServer() as server:
        yield server
    assert not server.faults, f"the RunPod stand-in answered outside the spec: {server.faults}"


@pytest.fixture
def runpod_openapi() -> OpenAPISchemas:
    """The vendored spec's schemas, to check a body directly (`runpod_openapi.errors("CreateTemplateRequest", b)`)."""
    return SCHEMAS
