"""Who may call the public port: API keys (VL_API_KEYS), or, with none, only what no web page can send.

An entry is `key`, `name:key`, `name:key:admin` or `name:key:swap`; metrics and logs show the name, or a hash
of the key salted with a secret of the pod's, never the key. An admin sees the whole pod, the others their own
usage; only the admin and `:swap` keys may make the pod swap its model (VL_SWAP stops the engine for everyone); with several keys, each key's prompts are cached under its own salt (VL_PREFIX_CACHE). Keys
arrive as `Authorization: Bearer` (ANTHROPIC_AUTH_TOKEN) or `x-api-key` (ANTHROPIC_API_KEY); both
present and different is refused rather than guessed. Without keys (open), a POST must be
`application/json` (a cross-site page cannot send that without a CORS preflight, which is never
granted) and `Host` a name of the pod's (a rebound DNS name is not).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.bridge.errors import JSON_CONTENT_TYPE, BridgeError
from runtime.settings import BY_ENV, ApiKey, Settings, parse_value
from runtime.state.selfcheck import SELFCHECK_KEY

log = logging.getLogger("runtime.bridge")

OPEN_LABEL = "open"  # the usage label when no key is configured
GATEWAY_LABEL = "gateway"  # a worker pod's label for its gateway's key (VL_WORKER_KEY): the team's traffic
# Claude Code's probes (HEAD / and /api/hello), the watchdog, the console's page: none carries data.
UNGUARDED = frozenset({"/", "/api/hello", "/health", "/console"})
ENGINE_UNGUARDED = frozenset({"/health"})  # vLLM's as the public server: no console, no warm-up route of ours
SELFCHECK_LABEL = "selfcheck"  # the pod's own key for its self-check (VL_SELFCHECK, runtime.state.selfcheck)
SALT_FILE = "key-label.salt"  # in VL_STATE_DIR: made once, so labels survive bridge restarts
SALT_BYTES = 32  # 256 bits: a label cannot be tested against guessed keys without the salt
LABEL_HEX = 12  # 48 bits of the HMAC: enough to tell a pod's keys apart, all a label needs
LOOPBACK_NAMES = frozenset({"localhost"})  # names a browser resolves to this machine only
RUNPOD_PROXY = ".proxy.runpod.net"  # RunPod's HTTP proxy: `<pod>-<port>.proxy.runpod.net` reaches this pod's port
HOSTS_REMEMBERED = 256  # `Host` values whose verdict is kept: the pod's few names, many times over
POLICY_VIOLATION = 1008  # a WebSocket refused before its handshake completes: the server answers 403


def label_salt(state_dir: Path) -> bytes:
    """The pod's secret salt for key labels, made once (0600) in `state_dir`; a fresh one for this
    process only (labels then change at each restart) when `state_dir` cannot keep it."""
    path = state_dir / SALT_FILE
    try:
        if not path.exists():
            state_dir.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{SALT_FILE}.{os.getpid()}")
            descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                file.write(secrets.token_bytes(SALT_BYTES))
            try:
                os.link(partial, path)  # whole or not at all; a concurrent bridge's salt, made first, wins
            except FileExistsError:
                pass
            finally:
                partial.unlink()
        return path.read_bytes()
    except OSError as error:
        log.warning(
            "no key-label salt in %s (%s): labels of unnamed keys change at each restart", state_dir, error.strerror
        )
        return secrets.token_bytes(SALT_BYTES)


def label_of(key: str, salt: bytes) -> str:
    """A key's label in traces and metrics: an HMAC under the pod's secret salt (a bare hash of a
    weak key could be reversed offline by anyone who reads /metrics or the Hub log)."""
    return "hmac:" + hmac.new(salt, key.encode(), "sha256").hexdigest()[:LABEL_HEX]


def cache_salt_of(key: str, secret: bytes) -> str:
    """A key's `cache_salt`: vLLM caches prompts under different salts apart, and the pod's secret keeps a
    key from computing another's (and so from reading its cache)."""
    return hmac.new(secret, b"cache_salt\0" + key.encode(), "sha256").hexdigest()[:32]


@dataclass(frozen=True)
class Caller:
    """Who sent a request: its key's label, whether it sees the whole pod (every key's usage, /metrics), whether
    it may make the pod swap its model, and the salt set on its generations (None: the body's own is left, one
    tenant or the gateway's)."""

    label: str
    admin: bool = False
    cache_salt: str | None = None
    swaps: bool = False  # the admin, or a `:swap` key: may ask for a model that is not loaded (VL_SWAP)
    reads_metrics: bool = False  # the gateway's key: a worker's /metrics, which its gateway shows (never admin)


OPEN_CALLER = Caller(OPEN_LABEL, admin=True, swaps=True)  # no keys: whoever may reach the bridge owns the pod
UNGUARDED_CALLER = Caller(OPEN_LABEL)  # on a path that reads nothing of anyone's, without a valid key


class ApiKeys:
    """The accepted keys and who each is; empty means the bridge is open. A worker pod accepts its
    gateway's key (VL_WORKER_KEY) too, labelled `gateway`: the team's traffic, salted by the gateway."""

    def __init__(
        self,
        entries: Sequence[ApiKey],
        secret: bytes,
        gateway_key: str | None = None,
        salted: bool = False,
        selfcheck_key: str | None = None,
    ) -> None:
        marked = any(entry.admin for entry in entries)
        self.keys: list[tuple[Caller, bytes]] = []
        for position, entry in enumerate(entries):
            label = entry.name or label_of(entry.key, secret)
            admin = entry.admin or (not marked and position == 0)  # entries without roles: the first is the owner
            salt = cache_salt_of(entry.key, secret) if salted else None
            self.keys.append((Caller(label, admin, salt, swaps=admin or entry.swap), entry.key.encode()))
        if gateway_key:
            self.keys.append((Caller(GATEWAY_LABEL, reads_metrics=True), gateway_key.encode()))
        if self.keys and selfcheck_key:  # an open pod needs no key of its own
            self.keys.append((Caller(SELFCHECK_LABEL), selfcheck_key.encode()))

    @classmethod
    def for_pod(cls, settings: Settings) -> ApiKeys:
        """The pod's keys, labelled and salted with the secret kept in VL_STATE_DIR (read only when used)."""
        gateway_key = settings.worker_key if settings.role != "gateway" else None  # a gateway presents it
        keys = settings.api_keys
        several = len(keys) + bool(gateway_key) > 1  # one tenant has no one to hide its prompts from
        salted = several and settings.prefix_cache == "per-key"
        needs_secret = salted or any(entry.name is None for entry in keys)
        secret = label_salt(Path(settings.state_dir)) if needs_secret else b""
        return cls(keys, secret, gateway_key, salted, os.environ.get(SELFCHECK_KEY))  # the pod's own, for VL_SELFCHECK

    @property
    def labels(self) -> set[str]:
        return {caller.label for caller, _ in self.keys}

    @property
    def open(self) -> bool:
        return not self.keys

    def identify(self, authorization: str | None, api_key: str | None) -> Caller:
        """Who the key presented is; BridgeError(401) when none, a wrong one, or two that differ."""
        if self.open:
            return OPEN_CALLER
        bearer = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
        if bearer is not None and api_key is not None and not hmac.compare_digest(bearer.encode(), api_key.encode()):
            raise BridgeError(401, "Authorization and x-api-key carry different keys; send one of them")
        presented = bearer if bearer is not None else api_key
        if not presented:
            raise BridgeError(401, "an API key is required: send Authorization: Bearer <key> or x-api-key: <key>")
        found = None
        for caller, key in self.keys:  # compare against every key: the time taken says nothing about which
            if hmac.compare_digest(presented.encode(), key):
                found = caller
        if found is None:
            raise BridgeError(401, "invalid API key")
        return found


class AllowedHosts:
    """What the open bridge accepts in `Host`: any IP address (a page served from an address is the
    pod's own origin), `localhost`, RunPod's proxy names of this pod, and VL_ALLOWED_HOSTS."""

    def __init__(self, names: Iterable[str], pod_id: str | None = None) -> None:
        self.names = frozenset(LOOPBACK_NAMES | set(names))
        self.pod_id = pod_id.lower() if pod_id else None
        self.verdicts: dict[str, bool] = {}  # by `Host` value: a client sends the same one on every request

    @classmethod
    def for_pod(cls, extra: Iterable[str], environ: Mapping[str, str]) -> AllowedHosts:
        return cls(extra, environ.get("RUNPOD_POD_ID", "").strip() or None)

    def describe(self) -> str:
        """The rule in words, for the start-up warning."""
        proxy = [f"{self.pod_id}-<port>{RUNPOD_PROXY}"] if self.pod_id else []
        return ", ".join(["an IP address", *sorted(self.names), *proxy])

    def admits(self, header: str) -> bool:
        """Whether `Host: header` names this pod; judged once per value (the first HOSTS_REMEMBERED values)."""
        verdict = self.verdicts.get(header)
        if verdict is None:
            verdict = self.judge(header)
            if len(self.verdicts) < HOSTS_REMEMBERED:  # a stranger may send any: the memory stays bounded
                self.verdicts[header] = verdict
        return verdict

    def judge(self, header: str) -> bool:
        name = host_name(header)
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return name in self.names or self.is_proxy(name)

    def is_proxy(self, name: str) -> bool:
        """Whether `name` is RunPod's proxy name of one of this pod's ports (any: each leads here)."""
        pod, _, port = name.removesuffix(RUNPOD_PROXY).rpartition("-")
        return self.pod_id is not None and name.endswith(RUNPOD_PROXY) and pod == self.pod_id and port.isdigit()


def host_name(header: str) -> str:
    """The name or address of a `Host` header: no port, brackets or final dot, lower-cased."""
    if header.startswith("["):
        return header[1:].partition("]")[0].lower()
    return header.partition(":")[0].rstrip(".").lower()  # a name or an IPv4 address holds no colon


def media_type(content_type: bytes | None) -> str:
    return (content_type or b"").decode("latin-1").partition(";")[0].strip().lower()


class RequireKey:
    """ASGI middleware: admits every request to a path outside UNGUARDED, by its key, or when the
    bridge is open by its `Host` and body type; puts the `Caller` in `scope["state"]["caller"]`, its
    label in `scope["state"]["key"]`."""

    def __init__(self, app: ASGIApp, keys: ApiKeys, hosts: AllowedHosts, unguarded: frozenset[str] = UNGUARDED) -> None:
        self.app = app
        self.keys = keys
        self.hosts = hosts
        self.unguarded = unguarded

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A WebSocket scope reaches only EngineKeys, in vLLM's server (its realtime API): the bridge has none.
        if scope["type"] in ("http", "websocket"):
            try:
                caller = self.admit(scope)
            except BridgeError as error:
                await refuse(error, scope, receive, send)
                return
            scope.setdefault("state", {}).update(key=caller.label, caller=caller)
        await self.app(scope, receive, send)

    def admit(self, scope: Scope) -> Caller:
        """The caller; BridgeError: 401 (key), or when open 403 (`Host`) and 415 (body type)."""
        headers = dict(scope["headers"])
        if scope["path"] in self.unguarded:
            return self.known(headers)
        if not self.keys.open:
            return self.keys.identify(*presented(headers))
        host = headers.get(b"host")
        if host is not None and not self.hosts.admits(host.decode("latin-1")):
            raise BridgeError(
                403,
                "the bridge is open (no VL_API_KEYS), so it answers only to its own names in Host: "
                "add this one to VL_ALLOWED_HOSTS, or configure keys",
            )
        # JSON: the only body type a cross-site page cannot POST without a preflight.
        if scope.get("method") == "POST" and media_type(headers.get(b"content-type")) != JSON_CONTENT_TYPE:
            raise BridgeError(415, f"the body must be sent as Content-Type: {JSON_CONTENT_TYPE}")
        return OPEN_CALLER

    def known(self, headers: Mapping[bytes, bytes]) -> Caller:
        """On an unguarded path: the caller its key names (a key's holder sees more of /health), else anyone."""
        authorization, api_key = presented(headers)
        if self.keys.open or (authorization is None and api_key is None):
            return UNGUARDED_CALLER
        try:
            return self.keys.identify(authorization, api_key)
        except BridgeError:  # a wrong key on an open path: answered as anyone, never refused
            return UNGUARDED_CALLER


def presented(headers: Mapping[bytes, bytes]) -> tuple[str | None, str | None]:
    """The `Authorization` and `x-api-key` values a request carries (None: absent)."""
    authorization, api_key = headers.get(b"authorization"), headers.get(b"x-api-key")
    return (
        authorization.decode("latin-1") if authorization is not None else None,
        api_key.decode("latin-1") if api_key is not None else None,
    )


async def refuse(error: BridgeError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answers `error` in the envelope (a 401 with its challenge), or closes a WebSocket before it opens."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": POLICY_VIOLATION, "reason": error.message[:120]})
        return
    challenge = {"www-authenticate": "Bearer"} if error.status == 401 else None
    await error.response(challenge)(scope, receive, send)


class EngineKeys(RequireKey):
    """vLLM's `--middleware` when it serves the public port itself (VL_BRIDGE=off): the keys of
    VL_API_KEYS in its environment on every path but /health (its own --api-key leaves /invocations open)."""

    def __init__(self, app: ASGIApp) -> None:
        entries = parse_value(BY_ENV["VL_API_KEYS"], os.environ.get("VL_API_KEYS", ""))
        labels = secrets.token_bytes(SALT_BYTES)  # vLLM shows no label: a salt of its own will do
        super().__init__(app, ApiKeys(entries, labels), AllowedHosts(()), ENGINE_UNGUARDED)
