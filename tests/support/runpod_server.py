"""A strict local stand-in for RunPod's REST API v2: the template and registry routes, with in-memory state,
checking every request body and every answer against RunPod's published OpenAPI description (vendored).

Routes: `GET/POST /v2/templates`, `GET/PATCH /v2/templates/{id}`, `GET/POST /v2/registries`,
`GET /v2/registries/{id}`. Bearer auth (`api_key` may write; `read_only_key` gets 403 on writes, the spec's
"valid key lacking access"); errors are `application/problem+json` ErrorResponse objects: 401/403, 404 for
an unknown id or route, 400 for a body that is not JSON, and 422 with the validator's messages for one the
schema refuses (the spec's own wording: "rejected with 422 by the schema validator"). Every request is kept
in `received`; an answer of ours that breaks the spec goes to `faults` (the fixture fails the test on one).
Use it through the `runpod_server` fixture (and `runpod_openapi` for the spec's schemas).
"""

from __future__ import annotations

import json
import secrets
import socket
import string
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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


Handler = Callable[[Request, Any], tuple[int, str, Any]]  # (status, response schema, body); runs under the lock
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
            with self.state.lock:
                self.state.received.append(
                    Received(request.method, request.url.path, dict(request.headers), raw, status, request_schema)
                )
            return self.answer(status, schema, answer)

        return endpoint

    def answer(self, status: int, schema: str, body: Any) -> Response:
        """The response, after checking it against the spec: a wrong one of ours is a fault, never sent as is."""
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
        self.state = RunPodState(api_key=f"rpa_{secrets.token_hex(20)}", read_only_key=f"rpa_{secrets.token_hex(20)}")
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RunPodServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)  # listening already: a client that comes before uvicorn accepts waits in the backlog
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(RunPodApp(self.state).asgi(), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="runpod-server", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(30)

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
