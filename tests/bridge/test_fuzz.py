"""Generated hostile requests on the public port (Hypothesis): every one is answered below 500, every
error in Anthropic's envelope, never a traceback; `/health` answers throughout and memory stays flat.

One real bridge, keys configured, in front of the stand-in upstream (`tests/support/upstream.py`), serves
every example of the module. Deterministic (derandomized, no example database): CI sees the same
requests on every run. The counts go to the terminal as a `[fuzz]` line that closing notes quote.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from runtime.bridge.errors import error_type
from runtime.bridge.nesting import MAX_JSON_DEPTH
from tests.support.bridge import SLOW_WAIT_S, Process, start_bridge, start_stand_in

pytestmark = pytest.mark.slow  # thousands of requests to a bridge process

KEY, SECOND_KEY = "sk-fuzz-0123456789abcdef", "sk-other-fedcba9876543210"
# Examples per route; together at least the 1,000 hostile requests the suite promises.
EXAMPLES = {"/v1/messages": 600, "/v1/messages/count_tokens": 400, "/v1/chat/completions": 350, "/v1/completions": 250}
HEALTH_EVERY = 25  # requests between two checks that /health still answers
RSS_GROWTH_BOUND = 50 * 2**20  # a leak of a few KB per request would cross it; allocator noise does not

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgABSK+kcQAAAABJRU5ErkJggg=="
# A valid conversation that visits every kind of block the bridge translates.
CONVERSATION = [
    {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                                 {"type": "document", "title": "notes", "source": {"type": "text", "data": "a note"}}]},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan", "signature": "sig"}, {"type": "redacted_thinking", "data": "x"},
                                      {"type": "text", "text": "running it"},
                                      {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                                  "content": [{"type": "text", "text": "out"}, {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]},
                                 {"type": "text", "text": "go on"}]},
    {"role": "system", "content": "mid-conversation system"},
    {"role": "user", "content": "and?"},
]  # fmt: skip
COUNT_TOKENS = {
    "model": "claude-fake",
    "system": [{"type": "text", "text": "be brief"}],
    "messages": CONVERSATION,
    "tools": [{"name": "Bash", "description": "runs a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}},
              {"type": "web_search_20250305", "name": "web_search"}],
    "tool_choice": {"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
    "thinking": {"type": "enabled", "budget_tokens": 64},
    "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
    "metadata": {"user_id": "u-1"},
}  # fmt: skip
MESSAGES = COUNT_TOKENS | {
    "max_tokens": 4,
    "stop_sequences": ["\n\nHuman:"],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 5,
}
# The stand-in reads `max_tokens` and drops the connection on a wrong type, where vLLM answers a 400:
# the relays' skeletons keep it, and no generated key is that long (the bridge itself never reads it).
STAND_IN_READS = ("max_tokens",)
SKELETONS: dict[str, dict[str, Any]] = {
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": COUNT_TOKENS,
    "/v1/chat/completions": {
        "model": "fake",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.5,
    },
    "/v1/completions": {"model": "fake", "max_tokens": 2, "prompt": "hi"},
}
RELAYS = frozenset({"/v1/chat/completions", "/v1/completions"})
HOLE = "\ue000hole\ue000"  # where a hostile JSON fragment goes in the serialized skeleton

# Key headers the bridge accepts (either of its two keys), and ones it must answer with a 401.
AUTHORIZED = [((b"x-api-key", KEY.encode()),), ((b"authorization", b"Bearer " + KEY.encode()),),
              ((b"authorization", b"bearer " + SECOND_KEY.encode()),),
              ((b"x-api-key", KEY.encode()), (b"authorization", b"Bearer " + KEY.encode()))]  # fmt: skip
REFUSED = [(), ((b"x-api-key", b""),), ((b"x-api-key", KEY[:-1].encode()),), ((b"x-api-key", KEY.encode() + b"0"),),
           ((b"authorization", KEY.encode()),), ((b"authorization", b"Basic " + KEY.encode()),),
           ((b"authorization", b"Bearer"),), ((b"x-api-key", "\xe9\xff".encode("latin-1")),),
           ((b"x-api-key", KEY.encode()), (b"authorization", b"Bearer " + SECOND_KEY.encode())),
           ((b"x-api-key", (KEY * 64).encode()),)]  # fmt: skip
CONTENT_TYPES = [b"application/json", None, b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x",
                 b"application/json; charset=latin-1", b"application/json; charset=utf-16", b"", b"*/*", b"\xff\xfe;;="]  # fmt: skip
# Methods the HTTP parser knows (an unknown one gets uvicorn's plain-text 400 before the bridge sees it).
OTHER_METHODS = ["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "TRACE", "PROPFIND"]
HEADER_NAMES = ["x-request-id", "anthropic-version", "anthropic-beta", "accept", "accept-encoding", "user-agent", "cookie",
                "origin", "x-forwarded-for", "x-stainless-retry-count"]  # fmt: skip
# A field value as HTTP allows it on the wire: visible ASCII, inner spaces and tabs, and obs-text bytes.
HEADER_VALUE_BYTES = bytes([9, *range(0x20, 0x7F), *range(0x80, 0x100)])

EDGE_STRINGS = ["", "\x00", "a\x00b", "\ufeff", "\u202egnp.exe", "\U0010ffff", "\ud800", "\udfff", "\udbff\udfff", "e\u0301" * 64,
                "\x1b]52;c;aGk=\x07", "\x1b[2J", "a\nfake-log-line key=admin", "\r\n\r\nHTTP/1.1 200 OK", "%s%n{0}", "../../etc/passwd"]  # fmt: skip
ODD_LITERALS = [b"1e309", b"-1e309", b"NaN", b"Infinity", b"-0", b"1" + b"0" * 400, b"1e-400", b"01", b"1.", b".5", b"+1",
                b"0x10", b"18446744073709551616", b"-9223372036854775809", b"", b"tru", b"nul", b"'x'", b'"unterminated',
                b"[1,]", b"{,}", b"\\", b'"\\x41"', b'"\\u12"', b'"\x00"', b'"a\\u0000b"', b'"\xc0\xaf"', b'"\xf4\x90\x80\x80"',
                b'"\xed\xa0\x80"', b'{"a":1,"a":2}']  # fmt: skip
DEPTHS = [MAX_JSON_DEPTH - 4, MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 1000, 5000, 100_000]
HUGE = [2**12, 2**16, 2**20]

FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip


# --- what is sent ---


@dataclass(frozen=True)
class Hostile:
    """One generated request: method, headers and body; `keyed` says whether its key is a valid one."""

    method: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    keyed: bool

    def shown(self, route: str) -> str:
        """The request as the failing example's note prints it, a long body cut in the middle."""
        body = self.body if len(self.body) <= 600 else self.body[:300] + b"..." + self.body[-100:]
        return f"{self.method} {route} headers={list(self.headers)!r} body ({len(self.body)} bytes)={body!r}"


def dump(value: Any) -> bytes:
    return json.dumps(value).encode()


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, picked in proportion to its weight (`a | b` gives every branch of a
    flattened union the same share, which lets the many kinds of broken bytes crowd out the rest)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda n: table[n])


def json_values() -> st.SearchStrategy[Any]:
    """Any JSON value, nested a few levels: the wrong type for whatever field it lands in."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=16)
    )
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                        max_leaves=16)  # fmt: skip


def unicode_edges() -> st.SearchStrategy[bytes]:
    """Strings with surrogates, NUL, controls and escapes, as JSON escapes or as raw (possibly invalid) UTF-8."""
    text = st.sampled_from(EDGE_STRINGS) | st.text(st.characters(exclude_categories=()), max_size=32)
    escaped = text.map(dump)
    raw = text.map(lambda s: json.dumps(s, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return escaped | raw


def deep_nesting() -> st.SearchStrategy[bytes]:
    """Arrays or objects nested around the bridge's limit and far beyond it, written by hand
    (`json.dumps` itself stops near 1000 levels)."""

    def nested(depth: int, kind: str) -> bytes:
        return b"[" * depth + b"]" * depth if kind == "array" else b'{"k":' * depth + b"0" + b"}" * depth

    return st.builds(nested, st.sampled_from(DEPTHS), st.sampled_from(["array", "object"]))


def hostile_fragments() -> st.SearchStrategy[bytes]:
    """A JSON text (or a broken one) to put where a field's value belongs."""
    huge = st.sampled_from(HUGE).map(lambda n: b'"' + b"x" * n + b'"')
    return weighted(
        (6, json_values().map(dump)),
        (5, unicode_edges()),
        (3, deep_nesting()),
        (2, huge),
        (4, st.sampled_from(ODD_LITERALS)),
    )


def paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value where a value sits, and an unknown key in every object."""
    if isinstance(value, dict):
        yield (*at, "zz_unknown")
        for key, inner in value.items():
            yield (*at, key)
            yield from paths(inner, (*at, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield (*at, index)
            yield from paths(inner, (*at, index))


def replaced(skeleton: dict[str, Any], path: tuple[Any, ...], fragment: bytes) -> bytes:
    """The skeleton's JSON text with the value at `path` replaced by `fragment`, byte for byte."""
    body = copy.deepcopy(skeleton)
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = HOLE
    return dump(body).replace(dump(HOLE), fragment, 1)


def not_json(valid: bytes) -> st.SearchStrategy[bytes]:
    """Bytes that are not one JSON text: random ones, and a valid body cut, corrupted, wrapped or re-encoded."""
    cut = st.integers(0, len(valid) - 1).map(lambda n: valid[:n])
    flipped = st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)).map(
        lambda p: valid[: p[0]] + bytes([p[1]]) + valid[p[0] + 1 :]
    )
    wrapped = st.sampled_from([b"\xef\xbb\xbf" + valid, valid + b" trailing", valid + valid, valid.decode().encode("utf-16"),
                               b"model=fake&max_tokens=1", b"\x00" * 64])  # fmt: skip
    return st.binary(max_size=512) | cut | flipped | wrapped


def bodies(route: str) -> st.SearchStrategy[bytes]:
    """Bodies for `route`: not JSON, JSON of any type, and the route's valid skeleton (streamed or
    not) with one value, anywhere in it, replaced by a hostile one."""
    skeleton = SKELETONS[route]
    places = [p for p in paths(skeleton) if not (route in RELAYS and p[0] in STAND_IN_READS)]
    shaped = st.builds(lambda stream, path, fragment: replaced(skeleton | {"stream": stream}, path, fragment),
                       st.booleans(), st.sampled_from(places), hostile_fragments())  # fmt: skip
    return weighted((2, not_json(dump(skeleton))), (2, json_values().map(dump)), (6, shaped))


def extra_headers() -> st.SearchStrategy[list[tuple[bytes, bytes]]]:
    """A few headers with hostile values: request ids, versions, cookies and names of its own; under
    20 KiB in all, below any sane cap on headers (those over a cap are another test's)."""
    names = st.sampled_from(HEADER_NAMES) | st.from_regex(r"\Ax-[a-z0-9-]{1,24}\Z")
    values = st.binary(max_size=256).map(
        lambda raw: bytes(HEADER_VALUE_BYTES[b % len(HEADER_VALUE_BYTES)] for b in raw).strip()
    )
    big = st.sampled_from([2**10, 2**12]).map(lambda n: b"v" * n)
    return st.lists(st.tuples(names.map(str.encode), values | big), max_size=4)


@st.composite
def hostile_requests(draw: st.DrawFn, route: str) -> Hostile:
    """Mostly a POST with a valid key and a hostile body; sometimes another method, a missing or
    wrong key, an odd content type, odd headers."""
    keyed = draw(st.integers(0, 9)) < 8
    auth = draw(st.sampled_from(AUTHORIZED if keyed else REFUSED))
    method = "POST" if draw(st.integers(0, 9)) < 9 else draw(st.sampled_from(OTHER_METHODS))
    content_type = draw(st.sampled_from(CONTENT_TYPES))
    headers = [*auth, *([(b"content-type", content_type)] if content_type is not None else []), *draw(extra_headers())]
    return Hostile(method, tuple(headers), draw(bodies(route)), keyed)


# --- what must hold ---


@dataclass
class Fuzzed:
    """The bridge under fuzz, its client, and what it answered so far."""

    bridge: Process
    client: httpx.Client
    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    health_checks: int = 0
    rss_after_warm_up: int = 0

    @property
    def pid(self) -> int:
        return self.bridge.process.pid

    def send(self, route: str, request: Hostile) -> httpx.Response:
        """Send one request, count its status, and every HEALTH_EVERY requests ask /health."""
        try:
            response = self.client.request(request.method, route, content=request.body, headers=list(request.headers))
        except httpx.TransportError as error:
            raise AssertionError(f"no answer: the connection broke ({error!r})") from None
        self.statuses.setdefault(route, Counter())[response.status_code] += 1
        if sum(self.sent().values()) % HEALTH_EVERY == 0:
            self.expect_healthy()
        return response

    def sent(self) -> dict[str, int]:
        return {route: counts.total() for route, counts in self.statuses.items()}

    def expect_healthy(self) -> None:
        health = self.client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        self.health_checks += 1

    def rss(self) -> int:
        """The bridge's resident memory in bytes (VmRSS of /proc/<pid>/status)."""
        line = next(
            line for line in Path(f"/proc/{self.pid}/status").read_text().splitlines() if line.startswith("VmRSS:")
        )
        return int(line.split()[1]) * 1024

    def summary(self) -> str:
        per_route = "; ".join(f"{route} {counts.total()} ({', '.join(f'{s}: {n}' for s, n in sorted(counts.items()))})"
                              for route, counts in self.statuses.items())  # fmt: skip
        return (f"{sum(self.sent().values())} hostile requests: {per_route}; /health answered {self.health_checks} checks; "
                f"bridge RSS {self.rss_after_warm_up / 2**20:.1f} MB after warm-up, {self.rss() / 2**20:.1f} MB now")  # fmt: skip


def parsed(text: str) -> Any:
    """The JSON in an answer's body, or None when it is not JSON (then no envelope can match)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def is_envelope(body: Any, status: int) -> bool:
    """Anthropic's error envelope, with the type that belongs to `status`."""
    error = body.get("error") if isinstance(body, dict) else None
    return (isinstance(error, dict) and body.get("type") == "error" and error.get("type") == error_type(status)
            and isinstance(error.get("message"), str))  # fmt: skip


def is_relayed_error(body: Any) -> bool:
    """vLLM's (OpenAI's) error shape, which the relays pass through from the upstream as it came."""
    return (
        isinstance(body, dict) and isinstance(body.get("error"), dict) and isinstance(body["error"].get("message"), str)
    )


def check(route: str, request: Hostile, response: httpx.Response) -> None:
    """What every answer must be: below 500, 401 exactly when the key is not a valid one, errors in
    the envelope (relays: or the upstream's own), no traceback, no error event inside a 200 stream."""
    text = response.text
    assert response.status_code < 500, f"{response.status_code} {text[:2000]}"
    assert (response.status_code == 401) == (not request.keyed), f"{response.status_code} {text[:2000]}"
    assert "Traceback" not in text and 'File "/' not in text, text[:4000]
    if response.status_code >= 400 and request.method != "HEAD":
        body = parsed(text)
        assert is_envelope(body, response.status_code) or (route in RELAYS and is_relayed_error(body)), text[:2000]
    if response.status_code == 200:
        assert "event: error" not in text and '"api_error"' not in text, text[-2000:]


# --- the bridge and the runs ---


def report(request: pytest.FixtureRequest, line: str) -> None:
    """A line on the terminal, even without -s: the closing notes quote it."""
    plugins = request.config.pluginmanager
    with plugins.get_plugin("capturemanager").global_and_fixture_disabled():
        plugins.get_plugin("terminalreporter").write_line(f"[fuzz] {line}")


def warm_up(fuzzed: Fuzzed) -> None:
    """Valid requests on every route, and the largest body once, before memory is measured: what the
    first requests allocate for good (pools, caches, buffers) is not growth."""
    headers = dict(AUTHORIZED[0])
    for route, skeleton in SKELETONS.items():
        for body in [dump(skeleton)] * 10 + [dump(skeleton | {"stream": True})] * 10 + [b'"' + b"x" * 2**20 + b'"']:
            fuzzed.send(route, Hostile("POST", tuple(headers.items()), body, True))


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Fuzzed]:
    """One bridge with two named keys (no salt file to make) in front of the stand-in (4 tokens an
    answer), for the whole module."""
    logs = tmp_path_factory.mktemp("fuzz")
    with (start_stand_in(logs / "upstream.log", "--tokens", "4") as upstream,
          start_bridge(upstream.url, logs / "bridge.log", {"VL_API_KEYS": f"fuzz:{KEY}, other:{SECOND_KEY}"}) as bridge,
          httpx.Client(base_url=bridge.url, timeout=SLOW_WAIT_S) as client):  # fmt: skip
        running = Fuzzed(bridge, client)
        warm_up(running)
        running.rss_after_warm_up = running.rss()
        running.statuses.clear()  # the counts are the generated requests'
        yield running
        report(request, running.summary())


def expect_still_well(fuzzed: Fuzzed) -> None:
    """After a run: /health answers, no traceback in the bridge's log, resident memory flat."""
    fuzzed.expect_healthy()
    assert "Traceback" not in fuzzed.bridge.log(), fuzzed.bridge.log()[-6000:]
    growth = fuzzed.rss() - fuzzed.rss_after_warm_up
    assert growth < RSS_GROWTH_BOUND, f"the bridge's RSS grew {growth / 2**20:.1f} MB since the warm-up"


@pytest.mark.parametrize("route", EXAMPLES)
def test_hostile_requests_get_clean_answers(fuzzed: Fuzzed, route: str) -> None:
    before = fuzzed.sent().get(route, 0)

    @settings(FUZZ, max_examples=EXAMPLES[route])
    @given(hostile_requests(route))
    def answered_cleanly(request: Hostile) -> None:
        note(request.shown(route))
        check(route, request, fuzzed.send(route, request))

    answered_cleanly()
    assert fuzzed.sent()[route] - before >= EXAMPLES[route]
    expect_still_well(fuzzed)
