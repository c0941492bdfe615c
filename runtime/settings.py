"""Every `VL_*` setting in one typed, validated place: defaults, parsing, documentation.

Precedence is built-in default < remote (Hub) file < pod environment. A bad value raises
`SettingsError`, whose message is one line naming the variable, its value and what is allowed.
The settings table of docs/reference/settings.md is generated from `VARIABLES` (`python -m runtime settings --markdown`).
"""

from __future__ import annotations

import difflib
import enum
import ipaddress
import keyword
import math
import re
import shlex
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard

from runtime.budget import Budget, budget

RECIPES_DIR = Path(__file__).resolve().parent / "engine" / "recipes"


class Scope(enum.StrEnum):
    """What must restart when a setting changes at run time (see runtime.hub's config watcher)."""

    ENGINE = "engine"  # vLLM restarts (weights stay on disk)
    BRIDGE = "bridge"  # the bridge alone restarts, in seconds
    POD = "pod"  # the pod's environment only (ports, paths, repos, intervals): fixed for the pod's life


# A refusal quotes the value it refuses: a 1 MB value must not become a 1 MB log line (or Hub note).
QUOTED_CHARS = 120


def quoted(value: str) -> str:
    """`value` as a message quotes it: its repr, cut to QUOTED_CHARS with its full length said."""
    if len(value) <= QUOTED_CHARS:
        return repr(value)
    return f"{value[:QUOTED_CHARS]!r}... ({len(value):,} characters)"


class SettingsError(ValueError):
    """A setting has a value that is not allowed; `str()` is the one line shown to the operator."""

    def __init__(self, variable: str, value: str, allowed: str) -> None:
        self.variable, self.value, self.allowed = variable, value, allowed
        super().__init__(f"{variable}={quoted(value)} is not allowed: expected {allowed}")


# RunPod writes a secret's value in place of `{{ RUNPOD_SECRET_name }}` when the pod starts; a secret the user never
# created stays as written, and its shape was refused instead ("VL_API_KEYS='***' ... entry 1 has 2 characters").
RUNPOD_SECRET_REFERENCE = re.compile(r"\{\{\s*RUNPOD_SECRET_(\w+)\s*\}\}")


class SecretNeverCreated(SettingsError):
    """A setting still holds RunPod's reference to a secret: the one line says which secret to create, and where
    (the reference is shown, never the rest of a secret's value)."""

    def __init__(self, variable: str, secret: str) -> None:
        super().__init__(variable, f"{{{{ RUNPOD_SECRET_{secret} }}}}", "a value RunPod substitutes")
        self.args = (f"{variable}={self.value!r}: the RunPod secret {secret} was never created: create it in "
                     "RunPod's console (Secrets)",)  # fmt: skip


@dataclass(frozen=True)
class Parser:
    """How a setting's text becomes its value (`parse` raises ValueError on a value not allowed), with the words
    for what it allows: the documentation's table and each refusal take them from here, so they never disagree."""

    parse: Callable[[str], Any]
    allowed: str


def allows(allowed: str) -> Callable[[Callable[[str], Any]], Parser]:
    """Makes the function it decorates a Parser that allows what `allowed` says."""
    return lambda parse: Parser(parse, allowed)


def optional(parser: Parser) -> Parser:
    """`parser`, or None for an empty (or blank) value."""
    return Parser(lambda raw: parser.parse(raw) if raw.strip() else None, f"{parser.allowed}, or empty")


def one_of(*options: str) -> str:
    """`options` as an allowed text lists them: `one of 'a', 'b'`."""
    return "one of " + ", ".join(repr(o) for o in options)


class Disallowed(ValueError):
    """A parser's reason to refuse a value, worth adding to what is allowed ("129 entries, at most 128")."""


@dataclass(frozen=True)
class Variable:
    """One `VL_*` variable: its attribute name on `Settings`, default (as text, like the env), parser."""

    env: str
    attr: str
    default: str
    parser: Parser
    scope: Scope
    doc: str
    secret: bool = False
    max_chars: int = 0  # 0: MAX_VALUE_CHARS

    @property
    def allowed(self) -> str:
        return self.parser.allowed


# --- the parsers (each a Parser, or a function that makes one) and their helpers ---

HUB_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"  # the Hub's rule: 1..96, no edge `.` or `-`
NO_DOUBLES = r"(?!.*(?:--|\.\.))"  # the Hub refuses `--` and `..` anywhere in an id
HUB_REPO_ID = re.compile(rf"{NO_DOUBLES}(?:(?:models|datasets|spaces)/)?{HUB_NAME}/{HUB_NAME}")
MODEL_REPO_ID = re.compile(rf"{NO_DOUBLES}{HUB_NAME}/{HUB_NAME}")  # a checkpoint to serve is a model repo
# Served model names as clients send them (`claude-sonnet-4-5[1m]`, `org/name`, `…-v1:0`, `…@2025…`);
# never a leading `-`: vLLM would read the name as one of its flags when it serves the names itself.
MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/+\[\]-]{0,255}")
IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")  # vLLM's KV cache dtypes and attention backends
REPO_FILE_SEGMENT = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,254}")  # a file name the Hub and a disk take
# In a path on an sshd_config line, a space splits the argument and a newline starts a new directive.
UNSAFE_IN_PATH = re.compile(r"[\s\x00-\x1f\x7f]")
PATH_MAX = 4096  # Linux's limit on a path: a longer one fails every system call that takes it
MAX_FILE_CHECKED = 1 << 20  # what is read of a file the runtime is about to write, to see whose it is
# A key line of an authorized_keys file: its type, then base64 that starts with the type's length (AAAA).
AUTHORIZED_KEY = re.compile(r"(?:^|\s)(?:ssh|ecdsa|sk)-[\w@.-]+\s+AAAA[A-Za-z0-9+/]+={0,3}(?:\s|$)")
ENVIRONMENT_FILE_HEADER = "# The pod's environment for login shells, written by the runtime at each start.\n"
# Every value is bounded before it is parsed: 40,000 aliases (269 KB) passed once, then the bridge's exec
# failed with "Argument list too long" after the old bridge had stopped. Linux takes 128 KiB per variable.
MAX_VALUE_CHARS = 4096
MAX_NAMES = 64  # aliases or allowed hosts: a few are what a pod needs
MAX_KEYS = 128  # VL_API_KEYS entries (one per person or tool of a team)
MAX_KEY_CHARS = 256
MAX_REPLICAS = 8  # engines in one pod: RunPod's largest machines have 8 GPUs
MIN_PING_S = 1.0  # no proxy cuts a connection silent for less; below it pings only burn CPU (1e-300 s: 134,585/s)
# `name:key` in VL_API_KEYS: the name labels the key's usage in traces and metrics.
ADMIN_SUFFIX = ":admin"  # a named entry's role: sees every key's usage and /metrics, and may swap the model
SWAP_SUFFIX = ":swap"  # a named entry's right to make the pod swap its model (VL_SWAP): it stops the engine
NAMED_KEY = re.compile(r"([A-Za-z0-9_.-]{1,64}):(.+)")
# What an HTTP header carries byte for byte: visible ASCII (no space, control or non-ASCII character).
HEADER_TOKEN = re.compile(r"[\x21-\x7e]+")
# Shorter is a password, not a key: 16 random characters are beyond guessing, even at a pod's request rate.
MIN_KEY_CHARS = 16
# A DNS name: dot-separated labels of letters, digits and inner hyphens, 63 characters at most each.
DNS_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


@allows(one_of("on", "off"))
def switch(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("on", "1", "true", "yes"):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ValueError


def words(raw: str) -> tuple[str, ...]:
    """A list written with commas and/or spaces: `a,b c` → ('a', 'b', 'c')."""
    return tuple(w for w in re.split(r"[\s,]+", raw.strip()) if w)


def at_most(limit: int, items: tuple[Any, ...]) -> tuple[Any, ...]:
    """`items`, unless there are more than `limit` of them (ValueError saying how many)."""
    if len(items) > limit:
        raise Disallowed(f"{len(items):,} entries, at most {limit}")
    return items


def matching(pattern: re.Pattern[str], allowed: str) -> Parser:
    """The text itself, when it matches `pattern` whole (which `allowed` says in words)."""

    def parse(raw: str) -> str:
        value = raw.strip()
        if not pattern.fullmatch(value):
            raise ValueError
        return value

    return Parser(parse, allowed)


def each_matching(limit: int, pattern: re.Pattern[str], allowed: str, fold: Callable[[str], str] = str) -> Parser:
    """`words`, at most `limit`, each matching `pattern` whole once folded (which `allowed` says in words)."""

    def parse(raw: str) -> tuple[str, ...]:
        found = at_most(limit, tuple(map(fold, words(raw))))
        if not all(pattern.fullmatch(word) for word in found):
            raise ValueError
        return found

    return Parser(parse, allowed)


@dataclass(frozen=True)
class ApiKey:
    """One entry of VL_API_KEYS: a key and the name that labels its usage (None: a salted hash does)."""

    name: str | None
    key: str = field(repr=False)  # a repr may reach a log: the key never does
    admin: bool = False  # `name:key:admin`: sees every key's usage and /metrics (runtime.bridge.auth)
    swap: bool = False  # `name:key:swap`: may make the pod swap its model, as the admin may
    budgets: tuple[Budget, ...] = ()  # `name:key[:role]:5usd/day[:100usd/month]`: refused past one (runtime.budget)

    @property
    def entry(self) -> str:
        """The entry as written in VL_API_KEYS: `name:key[:admin|:swap][:budget…]`, or the bare key."""
        role = ADMIN_SUFFIX if self.admin else SWAP_SUFFIX if self.swap else ""
        budgets = "".join(f":{budget.entry}" for budget in self.budgets)
        return f"{self.name}:{self.key}{role}{budgets}" if self.name else self.key


def key_entry(entry: str) -> ApiKey:
    """An entry of VL_API_KEYS: `name:key`, `name:key:admin`, `name:key:swap`, each maybe followed by budgets
    (`:5usd/day`), or a bare key (no name, no role, no budget)."""
    named = NAMED_KEY.fullmatch(entry)
    if not named:
        return ApiKey(None, entry)
    name, key = named.groups()
    budgets: list[Budget] = []
    while ":" in key and (last := budget(key.rpartition(":")[2])) is not None:
        budgets.insert(0, last)
        key = key.rpartition(":")[0]
    for suffix in (ADMIN_SUFFIX, SWAP_SUFFIX):
        if key.endswith(suffix) and len(key) > len(suffix):
            admin, swap = suffix == ADMIN_SUFFIX, suffix == SWAP_SUFFIX
            return ApiKey(name, key.removesuffix(suffix), admin, swap, tuple(budgets))
    return ApiKey(name, key, budgets=tuple(budgets))


def key_entries(raw: str) -> tuple[ApiKey, ...]:
    """VL_API_KEYS read as entries, unchecked (the redactor masks even keys the settings refuse)."""
    return tuple(key_entry(entry) for entry in words(raw))


@allows(
    f"at most {MAX_KEYS} keys (`key`, `name:key`, `name:key:admin` or `name:key:swap`, a named one maybe followed by "
    f"budgets, `:5usd/day`) separated by commas, each key {MIN_KEY_CHARS} to {MAX_KEY_CHARS} visible ASCII "
    "characters, or empty"
)
def api_keys(raw: str) -> tuple[ApiKey, ...]:
    """The entries of VL_API_KEYS, each a key a header can carry and too long to guess; the error names
    the entry by position and name, never by its key (the message is printed and published)."""
    entries = at_most(MAX_KEYS, key_entries(raw))
    for position, entry in enumerate(entries, 1):
        which = f"entry {position}" + (f" ({entry.name})" if entry.name else "")
        if not HEADER_TOKEN.fullmatch(entry.key):
            raise Disallowed(f"{which} holds a character an HTTP header cannot carry (non-ASCII or control)")
        if budget(entry.key) is not None:  # `KEY:5usd/day` reads as a name and a key: the name is the key
            raise Disallowed(f"entry {position} has a budget but no name: write it `name:key:{entry.key}`")
        if any(budget(part) for part in entry.key.split(":")[1:]):  # `name:key:5usd/day:admin`
            raise Disallowed(f"{which} has a budget before its role: write it `name:key:role:budget`")
        if not MIN_KEY_CHARS <= len(entry.key) <= MAX_KEY_CHARS:
            raise Disallowed(f"{which} has {len(entry.key)} characters")
        check_budgets(which, entry.budgets)
        named = [n for n, other in enumerate(entries[: position - 1], 1) if entry.name and other.name == entry.name]
        keyed = [n for n, other in enumerate(entries[: position - 1], 1) if other.key == entry.key]
        if named or keyed:  # one label per key: two under one name would share its usage and its share
            raise Disallowed(f"{which} repeats the {'name' if named else 'key'} of entry {(named or keyed)[0]}")
    return entries


def check_budgets(which: str, budgets: tuple[Budget, ...]) -> None:
    """Each budget above nothing, and one per unit and period (two would leave the smaller one alone to count)."""
    for position, one in enumerate(budgets):
        if one.limit <= 0:
            raise Disallowed(f"{which} has a budget of {one.entry}: above 0, or no budget")
        if any((other.unit, other.period) == (one.unit, one.period) for other in budgets[:position]):
            raise Disallowed(f"{which} has two budgets in {one.unit} a {one.period}")


# DNS names, lower-cased (Host headers are compared without case).
host_names = each_matching(
    MAX_NAMES, DNS_NAME, f"at most {MAX_NAMES} host names separated by commas or spaces, or empty", str.lower
)


@allows(f"at most {MAX_NAMES} http(s) URLs without credentials, separated by commas or spaces, or empty")
def worker_urls(raw: str) -> tuple[str, ...]:
    """`words` that are each the base URL of a pod's bridge: http(s), a host, maybe a port and a path (a
    proxy that routes by path); no query and no credentials (the key is VL_WORKER_KEY, a secret); written
    without a trailing `/`."""
    urls = at_most(MAX_NAMES, tuple(url.rstrip("/") for url in words(raw)))
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        dotted = {".", ".."} & set(parts.path.split("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or any(parts[3:]) or dotted:
            raise Disallowed(
                "each must be an http(s) URL: a host, maybe a port and a plain path, no query or credentials"
            )
        parts.port  # noqa: B018  # raises ValueError on a port out of range
    if len(set(urls)) != len(urls):
        raise Disallowed("a URL is named twice")
    return urls


# One key as a header carries it.
header_key = matching(
    re.compile(rf"[\x21-\x7e]{{{MIN_KEY_CHARS},{MAX_KEY_CHARS}}}"),
    f"a key of {MIN_KEY_CHARS} to {MAX_KEY_CHARS} visible ASCII characters",
)
# Model names as clients send them (see MODEL_NAME).
model_names = each_matching(
    MAX_NAMES,
    MODEL_NAME,
    f"at most {MAX_NAMES} model names (letters, digits, `_.:@/+[]-`, no leading `-`) separated by commas or spaces",
)


# vLLM flags the runtime sets itself: from VL_EXTRA_ARGS they would put vLLM on every interface
# (`--host 0.0.0.0`: no key behind the bridge), drop the keys' middleware, or rename what is served.
# `--config` is a YAML file of arguments (it can set any of them); `--uds` moves the server off its port.
RUNTIME_FLAGS = ("host", "port", "uds", "api-key", "middleware", "served-model-name", "config")


def runtime_flag(word: str) -> str | None:
    """The runtime's flag that `word` would set in vLLM's parser, which takes `_` for `-`, `--flag=value`
    and any unambiguous abbreviation (`--ho`): None when it sets none of them."""
    if not word.startswith("--"):
        return None
    name = word[2:].split("=", 1)[0].replace("_", "-")
    return next((f"--{flag}" for flag in RUNTIME_FLAGS if name and flag.startswith(name)), None)


@allows(f"extra vLLM arguments, shell-quoted, none of the runtime's own ({', '.join('--' + f for f in RUNTIME_FLAGS)})")
def engine_arguments(raw: str) -> str:
    """Extra vLLM arguments: shell-quoted, and none of the runtime's own flags (RUNTIME_FLAGS)."""
    if any(not char.isprintable() and not char.isspace() for char in raw):
        raise Disallowed("a control character (an escape code?) is no argument of vLLM's")
    try:
        arguments = shlex.split(raw)
    except ValueError as error:  # an unclosed quote
        raise Disallowed(str(error)) from None
    owned = sorted({flag for flag in map(runtime_flag, arguments) if flag})
    if owned:
        raise Disallowed(f"{', '.join(owned)} {'is' if len(owned) == 1 else 'are'} the runtime's")
    return raw.strip()


REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
# huggingface_hub names cache files after the revision the Hub answers (`trees/<sha>.json`, `snapshots/<sha>/`,
# `refs/<revision>`) without checking it: `../../…` would write outside the cache. A commit id is the only one taken.
COMMIT_ID = re.compile(r"[0-9a-f]{40}")


def is_commit_id(revision: object) -> TypeGuard[str]:
    """Whether `revision` is a full git commit id, the only revision the cache's folder names may take."""
    return isinstance(revision, str) and COMMIT_ID.fullmatch(revision) is not None


def hub_repo(spec: str) -> tuple[str, str]:
    """A Hub repo id as (type, `owner/name`): `owner/name` is a model, `datasets/…` and `spaces/…` say
    their type. The one check of a repo id, for the settings and for `runtime.hub.repo` alike."""
    value = spec.strip()
    if not HUB_REPO_ID.fullmatch(value):
        raise ValueError
    prefix, _, rest = value.partition("/")
    if prefix not in REPO_TYPES:
        return "model", value
    if "/" not in rest:  # `datasets/logs`: a type without its owner (the Hub reserves these names)
        raise ValueError
    return REPO_TYPES[prefix], rest


@allows("a Hub repo id (owner/name, datasets/owner/name or spaces/owner/name)")
def hub_repo_id(raw: str) -> str:
    """A Hub repo id as written (see `hub_repo`)."""
    value = raw.strip()
    hub_repo(value)
    return value


@allows("an IPv4 or IPv6 address to listen on")
def listen_address(raw: str) -> str:
    """An IPv4 or IPv6 address in its canonical form; no `%zone` (its text is free: a newline fits)."""
    value = raw.strip()
    if "%" in value:
        raise ValueError
    return str(ipaddress.ip_address(value))


def local_path(raw: str) -> str:
    """An absolute path on the pod, safe on an sshd_config line: no space, control character or `..`."""
    value = raw.strip()
    if not value.startswith("/") or len(value) > PATH_MAX or UNSAFE_IN_PATH.search(value) or ".." in value.split("/"):
        raise ValueError
    return value


ABSOLUTE_DIRECTORY = Parser(local_path, "an absolute directory path (no spaces, no `..`)")
ABSOLUTE_FILE = Parser(local_path, "an absolute file path (no spaces, no `..`)")


def file_to_write(looks_ours: Callable[[str], bool], what: str, may_hold: str) -> Parser:
    """An absolute path the runtime writes to: a file already there must look like `what` (`may_hold` says what
    the path may hold), so that a slip (or `/etc/passwd`) never gets keys appended or the pod's environment
    written over it."""

    def parse(raw: str) -> str:
        path = Path(local_path(raw))
        try:
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise Disallowed(f"{path} is not a regular file")
            if path.exists():
                with open(path, "rb") as file:
                    head = file.read(MAX_FILE_CHECKED).decode(errors="replace")
                if not looks_ours(head):
                    raise Disallowed(f"{path} exists and is not {what}")
        except PermissionError:  # not ours to look at, so not ours to write either (a Space runs as uid 1000)
            pass
        return str(path)

    return Parser(parse, f"{ABSOLUTE_FILE.allowed}, {may_hold}")


def is_authorized_keys(text: str) -> bool:
    """Every line is blank, a comment or a public key (after sshd's options, if any)."""
    lines = (line.strip() for line in text.splitlines())
    return all(not line or line.startswith("#") or AUTHORIZED_KEY.search(line) for line in lines)


def is_pod_environment(text: str) -> bool:
    """Empty, or written by the runtime (runtime.pod.sshd starts it with ENVIRONMENT_FILE_HEADER)."""
    return not text.strip() or text.startswith(ENVIRONMENT_FILE_HEADER)


@allows("a relative path inside the config repo (`a-z A-Z 0-9 _ . -` and `/`; no `..`)")
def repo_file(raw: str) -> str:
    """A relative path inside a Hub repo: plain segments, none empty, `.` or `..`, no backslash."""
    value = raw.strip()
    segments = value.split("/")
    if not all(REPO_FILE_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments):
        raise ValueError
    return value


@allows("a Hub model repo id (owner/name) or the absolute path of an existing directory")
def checkpoint(raw: str) -> str:
    """What VL_REPO may name: a model repo on the Hub, or a directory that exists on the pod."""
    value = raw.strip()
    if value.startswith("/"):
        if not Path(local_path(value)).is_dir():
            raise ValueError
    elif not MODEL_REPO_ID.fullmatch(value):
        raise ValueError
    return value


def ascii_number(raw: str) -> str:
    """`raw` stripped, if written in ASCII digits: Python reads the Arabic-Indic `٣` as 3, and a person
    reading the setting would not."""
    text = raw.strip()
    if not text.isascii():
        raise ValueError
    return text


def integer(low: int, high: int | None = None, unit: str = "") -> Parser:
    """A whole number (of `unit`) in low..high, or at least `low` without `high`."""

    def parse(raw: str) -> int:
        value = int(ascii_number(raw).replace("_", ""))
        if value < low or (high is not None and value > high):
            raise ValueError
        return value

    bounds = f"in {low}..{high}" if high is not None else f">= {low}"
    return Parser(parse, f"a whole number{f' of {unit}' if unit else ''} {bounds}")


def decimal(low: float, high: float, unit: str = "") -> Parser:
    """A finite number (of `unit`) in low..high."""

    def parse(raw: str) -> float:
        value = float(ascii_number(raw))
        if not math.isfinite(value) or not low <= value <= high:  # `nan`, `inf`: never, whatever the bounds
            raise ValueError
        return value

    return Parser(parse, f"a number{f' of {unit}' if unit else ''} in {low:g}..{high:g}")


TCP_PORT = Parser(integer(1, 65535).parse, "a TCP port")
REPLICA_COUNT = integer(1, MAX_REPLICAS)


KV_OFFLOAD_GIB = decimal(1, 4096, unit="GiB")  # 4 TiB: beyond any machine RunPod rents


@allows(f"{KV_OFFLOAD_GIB.allowed}, auto, or empty")
def kv_offload_size(raw: str) -> float | Literal["auto"] | None:
    """VL_KV_OFFLOAD: GiB of host RAM, `auto` (sized from the pod's RAM once the start knows its accelerator:
    runtime.engine.offload), or None (off) for an empty value."""
    text = raw.strip()
    if not text:
        return None
    return "auto" if text.lower() == "auto" else KV_OFFLOAD_GIB.parse(text)


@allows(f"{REPLICA_COUNT.allowed}, or auto")
def replica_count(raw: str) -> int | None:
    """VL_REPLICAS: a count, or None for `auto` (as many as the GPUs allow, decided once they are known)."""
    return None if raw.strip().lower() == "auto" else REPLICA_COUNT.parse(raw)


def choice(*options: str) -> Parser:
    """One of `options`, in any case."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise ValueError
        return value

    return Parser(parse, one_of(*options))


# Whole words of a variable name that mark its value as secret. Matching words, not substrings, is
# what keeps `TOKENIZERS_PARALLELISM`, `VL_KVBYTES` or `KEYBOARD` out; `TOKENS` is left out on
# purpose: `MAX_TOKENS`-style names hold counts.
# fmt: off
SECRET_WORDS = frozenset({
    "TOKEN", "KEY", "KEYS", "APIKEY", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS",
    "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH", "AUTHORIZATION", "COOKIE",
})
# fmt: on
# Glued spellings (`HFTOKEN`, `OPENAIAPIKEY`); a bare `…KEY` suffix is not enough (`MONKEY`).
SECRET_SUFFIXES = ("TOKEN", "APIKEY", "SECRET", "PASSWORD", "PASSWD")
# A `PUBLIC_KEY` (RunPod's SSH key) is meant to be seen.
PUBLIC_WORDS = frozenset({"PUBLIC", "PUB"})


def is_secret(name: str) -> bool:
    """Whether the value of a variable or field called `name` is a secret: for a `VL_*` setting, as its
    row says (`VL_SSH_HOST_KEYS` is a path); for any other name, as its words say (`HF_TOKEN`, `api_key`).
    The one rule for the Hub log's redaction, the Space status page and the settings printout."""
    if name in BY_ENV:
        return BY_ENV[name].secret
    parts = [part for part in re.split(r"[^A-Z0-9]+", name.upper()) if part]
    if any(part in PUBLIC_WORDS for part in parts):
        return False
    return any(part in SECRET_WORDS or part.endswith(SECRET_SUFFIXES) for part in parts)


def _var(
    env: str,
    default: str,
    parser: Parser,
    scope: Scope,
    doc: str,
    secret: bool = False,
    max_chars: int = 0,
) -> Variable:
    attr = env.removeprefix("VL_").lower()
    attr += "_" if keyword.iskeyword(attr) else ""  # VL_ASYNC → .async_
    return Variable(env, attr, default, parser, scope, doc, secret, max_chars)


def recipe_names() -> tuple[str, ...]:
    """Every recipe shipped with the runtime, sorted (the allowed values of VL_MODEL). Here, not in
    runtime.engine.recipes (pydantic): a stock image's bare python loads the settings before installing anything."""
    return tuple(sorted(path.stem for path in RECIPES_DIR.glob("*.toml")))


E, B, P = Scope.ENGINE, Scope.BRIDGE, Scope.POD
SPEC_MODES = ("auto", "off", "ngram", "mtp")
ROUTINGS = ("affinity", "round-robin")
ROLES = ("pod", "gateway")
CLUSTER_SPREADS = ("auto", "dp", "pp")
PREFIX_CACHES = ("per-key", "shared")
RECIPES = recipe_names()
MAX_SWAPS = 8  # models one pod swaps between: each is a download and minutes of compilation
MAX_PRELOADS = 8


@allows(
    f"at most {MAX_SWAPS} pairs `served-name:recipe` separated by commas or spaces (recipes: {', '.join(RECIPES)}), "
    "each name once"
)
def swap_pairs(raw: str) -> tuple[str, ...]:
    """VL_SWAP: which recipe serves each name a request may ask for (`name:recipe`, split at the last colon)."""
    pairs = at_most(MAX_SWAPS, words(raw))
    names = []
    for pair in pairs:
        name, colon, recipe = pair.rpartition(":")
        if not colon or not MODEL_NAME.fullmatch(name) or recipe not in RECIPES:
            raise ValueError
        names.append(name)
    if len(set(names)) != len(names):
        raise Disallowed("a name given twice")
    return pairs


# VL_PRELOAD: model repos whose files are downloaded ahead of a swap.
model_repos = each_matching(
    MAX_PRELOADS, MODEL_REPO_ID, f"at most {MAX_PRELOADS} Hub model repo ids (owner/name) separated by commas or spaces"
)
# VL_DESKTOP_PASSWORD: the browser desktop's password (no default: the page is public).
desktop_password = matching(re.compile(r"[\x21-\x7e]{8,128}"), "8 to 128 visible ASCII characters")


# A table, one variable to a few lines, read down its columns: the formatter leaves it as written.
# fmt: off
VARIABLES: tuple[Variable, ...] = (
    # --- the engine ---
    _var("VL_MODEL", "nemotron", choice(*RECIPES), E,
         "Model recipe to serve (runtime/engine/recipes/; the cpu image sets `tiny`)."),
    _var("VL_REPO", "", optional(checkpoint), E,
         "Serve another checkpoint of the recipe's model (e.g. another quantization); empty = the recipe's."),
    _var("VL_CTX", "", optional(integer(256)), E,
         "Context window (`--max-model-len`); empty = the recipe's. Above the native window needs YaRN in the recipe."),
    _var("VL_UTIL", "", optional(decimal(0.05, 0.99)), E,
         "GPU memory fraction; empty = the recipe's (never above 0.90 with speculation: OOM in the rejection sampler)."),
    _var("VL_KVBYTES", "", optional(integer(1, unit="bytes")), E,
         "`--kv-cache-memory-bytes`: fixes the KV cache and skips profiling (+22% KV on Flash-Next); "
         "too high kills the engine under load, not at start."),
    _var("VL_KV_OFFLOAD", "", kv_offload_size, E,
         "GiB of host RAM that keeps prefixes evicted from the GPU (`--kv-offloading-size`, vLLM's native backend): "
         "a team whose prefixes outgrow the GPU's KV re-prefills them (21 s a turn, not 1.14); `runtime plan` sizes "
         "it. auto = the pod's RAM less max(32 GiB, 25%) and the recipe's own host RAM, each engine's share as its GPUs'. "
         "A GPU only (vLLM's CPU build refuses it: auto is off there); not on hybrid models (Mamba's alignment closed "
         "it on Flash-Next: auto is off)."),
    _var("VL_KV", "", optional(matching(IDENTIFIER, "a vLLM KV cache dtype (auto, fp8, ...)")), E,
         "KV cache dtype; empty = the recipe's (fp8 buys capacity, not speed)."),
    _var("VL_BATCHED", "", optional(integer(64)), E,
         "`--max-num-batched-tokens`; empty = the recipe's (8192 measured +10% aggregate over 4096)."),
    _var("VL_SEQS", "", optional(integer(1)), E,
         "`--max-num-seqs`; empty = the recipe's or vLLM's."),
    _var("VL_SPEC", "auto", choice(*SPEC_MODES), E,
         "Speculative decoding; auto = the recipe's measured choice (off on most: MTP/DSpark cost Nemotron "
         "62-73% solo; n-gram on qwen: +86% on code edits; MTP k=3 on qwen38)."),
    _var("VL_SPEC_N", "", optional(integer(1, 32)), E,
         "Draft tokens per step; empty = the recipe's for the method (n-gram 12, MTP 1-3)."),
    _var("VL_LOOK_MIN", "", optional(integer(1, 64)), E,
         "n-gram speculation: shortest match looked up in the prompt; empty = the recipe's (3)."),
    _var("VL_LOOK_MAX", "", optional(integer(1, 64)), E,
         "n-gram speculation: longest match looked up in the prompt; empty = the recipe's (8)."),
    _var("VL_TP", "", optional(integer(1, 8)), E,
         "Tensor parallelism (GPUs per replica); empty = the recipe's. Above 1 sets NCCL_P2P_DISABLE=1 "
         "(NCCL init never returned on RunPod A40 pairs)."),
    _var("VL_DP", "1", integer(1, 8), E,
         "vLLM's own data parallelism (one API server, one replica per GPU): +15% at 32 sessions, loses solo "
         "speed and half the KV; the bridge pins each conversation to one rank (`X-data-parallel-rank`)."),
    _var("VL_CLUSTER", "auto", choice(*CLUSTER_SPREADS), E,
         "On a RunPod Instant Cluster (NUM_NODES set): dp = replicas on every node (VL_DP each, else as many as its GPUs "
         "hold) behind rank 0's API server, each agent "
         "pinned to one; pp = the layers split across the nodes, tensor parallel inside each; auto = dp when the "
         "recipe's engine fits one node's GPUs. vLLM's own multi-node engine, no Ray."),
    _var("VL_MM_IMAGES", "4", integer(0, 64), E,
         "Images per prompt for vision models; 0 makes vLLM refuse every screenshot with a 400."),
    _var("VL_ASYNC", "", optional(switch), E,
         "`--async-scheduling` (+9% aggregate on Nemotron); empty = the recipe's, else vLLM's own choice."),
    _var("VL_FASTOK", "on", switch, E,
         "fastokens Rust tokenizer when installed (-12% median TTFT)."),
    _var("VL_FLASHINFER", "off", switch, E,
         "FlashInfer's sampler (`VLLM_USE_FLASHINFER_SAMPLER`); off: it raised a CUDA fault on a 580 host."),
    _var("VL_ATTN", "", optional(matching(IDENTIFIER, "a vLLM attention backend name")), E,
         "Force an attention backend; empty = vLLM's choice (forcing TRITON_ATTN cost 32% prefill)."),
    _var("VL_ALIASES", "", model_names, B,
         "Extra names the bridge answers to (any unknown name still falls back to the served model); "
         "with VL_BRIDGE=off vLLM serves them itself (a change then restarts it)."),
    _var("VL_SWAP", "", swap_pairs, B,
         "Models swapped on demand: `name:recipe` pairs; /v1/models lists every name, and a request for a name "
         "whose recipe is not loaded restarts the engine on it while the request waits (pings; 529 unstreamed). "
         "The loaded recipe's own names are served as ever; empty = one model."),
    _var("VL_SWAP_MIN_S", "300", decimal(0.0, 86400.0, unit="seconds"), B,
         "Least time on a model before a swap away from it (a swap costs minutes: 368 s at a first compile)."),
    _var("VL_PRELOAD", "", model_repos, P,
         "Hub model repos downloaded into the cache in the background once the first model serves (at the "
         "lowest CPU and I/O priority), so that a later swap downloads nothing."),
    _var("VL_SELFCHECK", "auto", choice("auto", "on", "off"), P,
         "Once the model first serves, the pod runs `runtime check` against itself (a key of its own, one check at "
         "a time, each once no user request is in flight) and publishes the verdict: the Hub log, /health "
         "(`checked`), the console and `runtime status`. auto = on with a GPU, off on the CPU."),
    _var("VL_EXTRA_ARGS", "", engine_arguments, E,
         "Appended to the vLLM command (the flags the runtime sets are refused: the settings above own them).",
         max_chars=8192),
    # --- the bridge ---
    _var("VL_BRIDGE", "on", switch, E,
         "Serve the bridge on the public port; off = vLLM's native API there (no effort budget, no pings)."),
    _var("VL_BRIDGE_PING_S", "15", decimal(MIN_PING_S, 300.0, unit="seconds"), B,
         "SSE `ping` interval while the engine is silent (RunPod's proxy cuts after ~100-125 s)."),
    _var("VL_API_KEYS", "", api_keys, B,
         "Keys accepted by the bridge (Bearer or x-api-key), or by vLLM itself when VL_BRIDGE=off; empty = open, "
         "with a loud warning. An admin key sees every key's usage and /metrics, the others their own; with none "
         "marked `:admin`, the first entry is the admin. With VL_SWAP, only the admin and keys marked `:swap` may "
         "ask for a model that is not loaded (a swap stops the engine for everyone). A key without a name is labelled in traces and metrics "
         "by a salted hash (the salt: `key-label.salt` in VL_STATE_DIR). A named key may carry budgets, "
         "`name:key:5usd/day:2Mtokens/month` (per UTC day, week or month; dollars at VL_COST_PER_HOUR): Claude Code "
         "shows its use past 75 % and 95 %, and past it the key gets `429 billing_error` until the period ends.",
         secret=True, max_chars=MAX_KEYS * (MAX_KEY_CHARS + 150)),  # name, role, three budgets
    _var("VL_PREFIX_CACHE", "per-key", choice(*PREFIX_CACHES), B,
         "With several keys, each key's prompts are cached apart (vLLM's `cache_salt`), so that no key learns "
         "another's prompts from its cache hits or timing; `shared` lets a team's keys share a prefix."),
    _var("VL_ALLOWED_HOSTS", "", host_names, B,
         "Without keys: names the bridge answers to in `Host`, besides IP addresses, `localhost` and RunPod's "
         "`<pod>-<port>.proxy.runpod.net` (any other is refused with a 403, against DNS rebinding)."),
    _var("VL_GUARD", "on", switch, B,
         "Block a whole-file write (Write, write_file, create_file) whose content holds an explicit elision "
         "marker (`... rest of file`, `(rest of the file unchanged)`, `<unchanged>`...): the model is told why, "
         "and the file is not truncated."),
    _var("VL_LOG_PROMPTS", "off", switch, B, "Include prompt text in the per-request trace."),
    _var("VL_MAX_BODY_MB", "64", integer(1, 1024, unit="MiB"), B,
         "Largest request body the bridge accepts (413 beyond)."),
    _var("VL_KEY_CONCURRENCY", "", optional(integer(1)), B,
         "Requests one key may have in flight, streams until their last byte (beyond: 429 `rate_limit_error` "
         "with `retry-after`, which clients retry); empty = the upstream pool (512) split evenly among the keys, "
         "so that no key can take the others' share (one key, or none: no cap but the pool's 529)."),
    _var("VL_CLIENT_STALL_S", "60", decimal(1.0, 3600.0, unit="seconds"), B,
         "A client that reads nothing this long while its answer waits is dropped and its generation aborted "
         "(trace `stop=client_stalled`); a bad link's hiccups pass, Claude Code reads continuously."),
    _var("VL_COST_PER_HOUR", "", optional(decimal(0.0, 1000.0, unit="dollars")), B,
         "What the pod costs an hour (the RunPod template fills it from the GPU's price): the console's cost so far "
         "and cost per million output tokens; empty = not shown."),
    # --- the pod ---
    _var("VL_PORT", "8080", TCP_PORT, P, "Public port (bridge, or vLLM when VL_BRIDGE=off)."),
    _var("VL_ENGINE_PORT", "18081", TCP_PORT, P,
         "vLLM's loopback port behind the bridge (with VL_REPLICAS, engine i listens on this port + i)."),
    _var("VL_REPLICAS", "1", replica_count, P,
         "vLLM engines in this pod, each on its own VL_TP GPUs, behind one router (SGLang's `smg`) and the bridge; "
         "auto = as many as the GPUs allow; 1 = one engine, no router."),
    _var("VL_ROUTING", "affinity", choice(*ROUTINGS), P,
         "With several engines: affinity keeps each Claude Code agent on the engine that holds its prefix "
         "(a turn 1.14 s in cache, 21 s without); round-robin spreads requests (benchmarks only)."),
    _var("VL_ROUTER_PORT", "18070", TCP_PORT, P,
         "The router's loopback port (several engines, or a gateway); its metrics on the next one."),
    _var("VL_ROLE", "pod", choice(*ROLES), P,
         "pod = engines here; gateway = no engine, no GPU: the bridge and the router in front of the pods in "
         "VL_WORKERS (a cheap CPU pod can front a team's GPU pods)."),
    _var("VL_WORKERS", "", worker_urls, P,
         "With VL_ROLE=gateway: the pods it routes to (their bridge: `https://<pod>-8080.proxy.runpod.net`, or "
         "`http://<podId>.runpod.internal:8080` with global networking), each conversation kept on one; kept "
         "out of logs like a secret (a URL can carry one).", secret=True),
    _var("VL_WORKER_KEY", "", optional(header_key), P,
         "With VL_ROLE=gateway: the key it presents to its workers; on a worker pod: one more key its bridge accepts, "
         "labelled `gateway`, that may read its /metrics (what the gateway shows) and is never its admin "
         "(`runtime pod up --workers` gives the team's pods one of their own); empty = none.",
         secret=True),
    _var("VL_SSH_PORT", "22", TCP_PORT, P, "sshd's port."),
    _var("VL_SSH", "on", switch, P, "Start sshd (needs PUBLIC_KEY or SSH_PUBLIC_KEY)."),
    _var("VL_LISTEN", "0.0.0.0", listen_address, P,
         "Address of the public servers (bridge, sshd, vLLM when VL_BRIDGE=off); tests use 127.0.0.1."),
    _var("VL_SSH_HOST_KEYS", "/etc/ssh", ABSOLUTE_DIRECTORY, P,
         "sshd's host keys, generated at start when missing (the image ships none: each pod gets its own)."),
    _var("VL_SSH_AUTHORIZED_KEYS", "/root/.ssh/authorized_keys", file_to_write(is_authorized_keys, "an authorized_keys file",
         "absent or an authorized_keys file"), P,
         "Where the key from PUBLIC_KEY or SSH_PUBLIC_KEY is added (keys already there are kept)."),
    _var("VL_SSH_STRICT_MODES", "on", switch, P,
         "sshd's StrictModes; off only when ~/.ssh sits on a volume with loose permissions (every key is refused)."),
    _var("VL_SSH_ENV_FILE", "/etc/profile.d/pod-environment.sh", file_to_write(is_pod_environment, "the runtime's",
         "absent, empty or written by the runtime"), P,
         "The pod's environment as `export` lines for login shells (RunPod's equivalent: /etc/rp_environment)."),
    _var("VL_LOG_REPO", "", optional(hub_repo_id), P,
         "Hub repo that receives `etat/<POD_ID>.log` while the pod is not healthy; empty = off."),
    _var("VL_LOG_INTERVAL_S", "25", decimal(5.0, 3600.0, unit="seconds"), P,
         "How often the log is republished while not healthy."),
    _var("VL_CONFIG_REPO", "", optional(hub_repo_id), P,
         "Hub repo holding the remote settings file; empty = no remote config."),
    _var("VL_CONFIG_FILE", "pod.env", repo_file, P,
         "Remote settings file (`VL_NAME=value` lines) in VL_CONFIG_REPO."),
    _var("VL_CONFIG_POLL_S", "30", decimal(5.0, 3600.0, unit="seconds"), P,
         "How often the remote settings file is checked."),
    _var("VL_CUDA_COMPAT", "auto", choice("auto", "on", "off"), P,
         "CUDA forward compatibility (`/usr/local/cuda/compat`): auto = only when the host driver is older "
         "than the image's CUDA and the GPU is data-center class (elsewhere error 804; over a newer driver, 803)."),
    _var("VL_IDLE_STOP_MIN", "", optional(decimal(0.5, 10080.0, unit="minutes")), P,
         "No request served for this long: the pod says so in its Hub log, then stops itself through RunPod's API "
         "(its volume stays; the GPU's billing ends); empty = never. Needs RunPod's RUNPOD_POD_ID and RUNPOD_API_KEY."),
    _var("VL_MAX_SPEND", "", optional(decimal(0.01, 100000.0, unit="dollars")), P,
         "With VL_COST_PER_HOUR: once this start of the pod has cost this much, it says so and stops itself; "
         "empty = no cap. Needs RunPod's RUNPOD_POD_ID and RUNPOD_API_KEY."),
    _var("VL_DESKTOP", "off", switch, P,
         "A Linux desktop in the browser on port 6080 (noVNC); needs VL_DESKTOP_PASSWORD."),
    _var("VL_DESKTOP_PASSWORD", "", optional(desktop_password), P,
         "The desktop's password: set it from a RunPod secret (there is no default).", secret=True),
    _var("VL_STATE_DIR", "/var/lib/vlpod", ABSOLUTE_DIRECTORY, P, "Where the runtime keeps its logs and state."),
    _var("VL_VOLUME", "/workspace", ABSOLUTE_DIRECTORY, P,
         "The pod's volume (RunPod mounts it at /workspace): when it is a mount point, VL_CACHE_DIR defaults to a folder on it."),
    _var("VL_CACHE_DIR", "", optional(ABSOLUTE_DIRECTORY), P,
         "Weights (the Hub cache) and compile caches (vLLM, torch inductor, Triton, FlashInfer); empty = "
         "`VL_VOLUME/vllm-pod-cache` when VL_VOLUME is mounted (survives a stop: a warm restart), else "
         "`VL_STATE_DIR/cache` on the container disk (lost on a stop)."),
    _var("VL_VENV", "/opt/venv", ABSOLUTE_DIRECTORY, P, "The engine's virtual environment."),
    _var("VL_PREBAKED_MARKER", "/opt/.image_prebaked", ABSOLUTE_FILE, P,
         "The image's build facts; when absent, the engine is installed at start."),
)
# fmt: on

BY_ENV: dict[str, Variable] = {v.env: v for v in VARIABLES}


class Settings:
    """The effective settings: one typed attribute per variable (`VL_CTX` → `.ctx`), plus where each
    came from (`sources`). The annotations are checked against VARIABLES (tests/pod/test_settings.py)."""

    # the engine
    model: str
    repo: str | None
    ctx: int | None
    util: float | None
    kvbytes: int | None
    kv_offload: float | Literal["auto"] | None
    kv: str | None
    batched: int | None
    seqs: int | None
    spec: str
    spec_n: int | None
    look_min: int | None
    look_max: int | None
    tp: int | None
    dp: int
    cluster: str
    mm_images: int
    async_: bool | None
    fastok: bool
    flashinfer: bool
    attn: str | None
    aliases: tuple[str, ...]
    swap: tuple[str, ...]
    swap_min_s: float
    preload: tuple[str, ...]
    selfcheck: str
    extra_args: str
    # the bridge
    bridge: bool
    bridge_ping_s: float
    api_keys: tuple[ApiKey, ...]
    prefix_cache: str
    allowed_hosts: tuple[str, ...]
    guard: bool
    log_prompts: bool
    max_body_mb: int
    key_concurrency: int | None
    client_stall_s: float
    cost_per_hour: float | None
    # the pod
    port: int
    engine_port: int
    replicas: int | None  # None: auto
    routing: str
    router_port: int
    role: str
    workers: tuple[str, ...]
    worker_key: str | None
    ssh_port: int
    ssh: bool
    listen: str
    ssh_host_keys: str
    ssh_authorized_keys: str
    ssh_strict_modes: bool
    ssh_env_file: str
    log_repo: str | None
    log_interval_s: float
    config_repo: str | None
    config_file: str
    config_poll_s: float
    cuda_compat: str
    idle_stop_min: float | None
    max_spend: float | None
    desktop: bool
    desktop_password: str | None
    state_dir: str
    volume: str
    cache_dir: str | None
    venv: str
    prebaked_marker: str

    def __init__(self, values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
        for variable in VARIABLES:
            setattr(self, variable.attr, values[variable.attr])
        self.sources = dict(sources)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self.raw() == other.raw()

    def raw(self) -> dict[str, Any]:
        """The values by attribute name."""
        return {v.attr: getattr(self, v.attr) for v in VARIABLES}

    def changed_scopes(self, other: Settings) -> set[Scope]:
        """The scopes whose settings differ between `self` and `other` (what a reload must restart).
        Without the bridge, vLLM serves the aliases and checks the keys itself: their change is then the engine's too."""
        mine, theirs = self.raw(), other.raw()
        scopes = {v.scope for v in VARIABLES if mine[v.attr] != theirs[v.attr]}
        if not other.bridge and (self.aliases != other.aliases or self.api_keys != other.api_keys):
            scopes.add(Scope.ENGINE)
        return scopes

    def environ(self, *scopes: Scope) -> dict[str, str]:
        """The settings (of `scopes`, or all) as `VL_*` text that `load_settings` reads back unchanged:
        what a child process is given."""
        return {v.env: as_text(getattr(self, v.attr)) for v in VARIABLES if not scopes or v.scope in scopes}


def as_text(value: object) -> str:
    """A setting's value as the environment writes it (the inverse of its parser)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(item.entry if isinstance(item, ApiKey) else str(item) for item in value)
    return str(value)


def parse_value(variable: Variable, raw: str) -> Any:
    if reference := RUNPOD_SECRET_REFERENCE.search(raw):
        raise SecretNeverCreated(variable.env, reference.group(1))
    try:
        if "\x00" in raw:  # no environment holds a NUL (only the Hub file can), and no argv or file takes one
            raise ValueError
        if len(raw) > (limit := variable.max_chars or MAX_VALUE_CHARS):
            raise Disallowed(f"{len(raw):,} characters, at most {limit:,}")
        return variable.parser.parse(raw)
    except (ValueError, TypeError) as error:
        allowed = f"{variable.allowed}; {error}" if isinstance(error, Disallowed) else variable.allowed
        # A secret's value is never shown: the parser's reason names what is wrong instead.
        raise SettingsError(variable.env, "***" if variable.secret else raw, allowed) from None


def load_settings(environ: Mapping[str, str], remote: Mapping[str, str] | None = None) -> Settings:
    """Settings from defaults < `remote` (the Hub file's values, judged by runtime.settingsfile) <
    `environ`; raises SettingsError on a bad value. Names that are no setting are not read."""
    remote = remote or {}
    values, sources = {}, {}
    for variable in VARIABLES:
        raw, source = variable.default, "default"
        if remote and variable.env in remote:
            raw, source = remote[variable.env], "remote"
        if variable.env in environ:
            raw, source = environ[variable.env], "env"
        values[variable.attr] = parse_value(variable, raw)
        sources[variable.attr] = source
    check_together(values)
    return Settings(values, sources)


def check_together(values: Mapping[str, Any]) -> None:
    """Settings that are each fine alone but not together; SettingsError names the one to change."""
    if values["desktop"] and not values["desktop_password"]:
        raise SettingsError("VL_DESKTOP", "on", "off while VL_DESKTOP_PASSWORD is empty (the desktop's port is public)")
    if values["swap"] and not values["bridge"]:
        raise SettingsError("VL_SWAP", ",".join(values["swap"]), "empty with VL_BRIDGE=off (the bridge asks for swaps)")
    check_budgets_together(values)
    if values["swap"] and not values["api_keys"]:
        raise SettingsError("VL_SWAP", ",".join(values["swap"]),
                            "empty while VL_API_KEYS is empty (anyone could stop the engine with one request)")  # fmt: skip


def check_budgets_together(values: Mapping[str, Any]) -> None:
    """Budgets are the bridge's to count, and dollars are priced at VL_COST_PER_HOUR."""
    budgeted = [entry for entry in values["api_keys"] if entry.budgets]
    if budgeted and not values["bridge"]:
        raise SettingsError(
            "VL_BRIDGE", "off", f"on while VL_API_KEYS gives {budgeted[0].name} a budget (the bridge counts it)"
        )
    dollars = [entry for entry in budgeted if any(one.unit == "usd" for one in entry.budgets)]
    if dollars and values["cost_per_hour"] is None:
        raise SettingsError("VL_COST_PER_HOUR", "",
                            f"the pod's price an hour while VL_API_KEYS gives {dollars[0].name} a budget in dollars")  # fmt: skip


def not_a_setting(name: str) -> str:
    """Why `name`, which looks like one of ours, is read by nothing: with the closest setting's name."""
    bare = {env.removeprefix("VL_"): env for env in BY_ENV}  # compared without the prefix all share
    closest = difflib.get_close_matches(name.removeprefix("VL_"), bare, n=1, cutoff=0.6)
    hint = f" (did you mean {bare[closest[0]]}?)" if closest else ""
    return f"{name} is not a setting{hint}"


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """One warning per `VL_*` variable of the environment that is no setting (`VL_MODLE`: a 30 GB download
    of the default model on a real pod); only a warning, since other tools may own `VL_` names."""
    names = sorted(name for name in environ if name.startswith("VL_") and name not in BY_ENV)
    return [f"warning: {not_a_setting(name)}; it is ignored" for name in names]


TABLE_BEGIN = "<!-- settings table: generated by `python -m runtime settings --update-docs`; do not edit -->"
TABLE_END = "<!-- end of settings table -->"
HUB_TABLE_BEGIN = "<!-- hub file table: generated by `python -m runtime settings --update-docs`; do not edit -->"
HUB_TABLE_END = "<!-- end of hub file table -->"


def markdown_table() -> str:
    """The settings table of the documentation, generated so that code and documentation cannot drift."""
    rows = ["| variable | default | allowed | a change restarts | effect |", "|---|---|---|---|---|"]
    for v in VARIABLES:
        default = f"`{v.default}`" if v.default else "(empty)"
        rows.append(f"| `{v.env}` | {default} | {v.allowed} | {v.scope.value} | {v.doc} |")
    return "\n".join(rows)


def hub_file_table() -> str:
    """What a Hub settings file may change, and what each change does: the settings table's scopes and
    secret flags, grouped (generated, like the settings table)."""

    def names(variables: Iterable[Variable]) -> str:
        return ", ".join(f"`{v.env}`" for v in variables)

    def of(scope: Scope, secret: bool = False) -> list[Variable]:
        return [v for v in VARIABLES if v.scope is scope and v.secret is secret]

    rows = [
        "| settings | from a Hub file | a change |",
        "|---|---|---|",
        f"| engine: {names(of(Scope.ENGINE))} | yes | vLLM restarts (weights stay on disk); the bridge stays |",
        f"| bridge: {names(of(Scope.BRIDGE))} | yes | the bridge alone restarts, in seconds |",
        f"| secret: {names(of(Scope.BRIDGE, True))} | only from a private repo; never empty while the pod has "
        "keys (a file cannot open a keyed pod) | the bridge alone restarts (vLLM too with `VL_BRIDGE=off`) |",
        f"| pod: {names([*of(Scope.POD), *of(Scope.POD, True)])} | never: the file is refused; set them in the pod's environment "
        "(the RunPod template) | — |",
    ]
    return "\n".join(rows)


def with_tables(document: str) -> str:
    """`document` (docs/reference/settings.md) with the text between each pair of table markers replaced by the
    current table."""
    for begin, end, table in (
        (TABLE_BEGIN, TABLE_END, markdown_table()),
        (HUB_TABLE_BEGIN, HUB_TABLE_END, hub_file_table()),
    ):
        head, found_begin, rest = document.partition(begin)
        _, found_end, tail = rest.partition(end)
        if not found_begin or not found_end:
            raise ValueError(f"the document lacks the markers {begin!r} ... {end!r}")
        document = f"{head}{begin}\n{table}\n{end}{tail}"
    return document
