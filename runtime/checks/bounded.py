"""Every answer a command reads from a pod, bounded: a total deadline on the whole request (a byte dripped every few
seconds or a ping streamed without end never resets it, as httpx's per-read timeout does) and a cap on the bytes read
(a server that declares 2 GiB gets read up to the cap, never into memory whole). Past either, `OverLimit` says so in
one line; it is an httpx.HTTPError, so that a caller's "cannot reach" path takes it too.

`request` reads a whole answer (JSON, a status page); `deadline` and `lines` bound a streamed one (the Messages API's
events): the caller holds the stream inside `deadline` and reads its lines through `lines`. `request_sync` is
`request` for a command with no event loop of its own (a fresh one, and a fresh client, per call).

The deadlines are each caller's own; `VLLM_POD_DEADLINE_S` replaces every one of them (a user on a slow link, a test
that needs seconds): a value outside DEADLINE_RULE stops the command in one line, as a setting's does.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from runtime.settings import decimal, quoted

DEADLINE_VARIABLE = "VLLM_POD_DEADLINE_S"
DEADLINE_RULE = decimal(0.1, 86_400.0, unit="seconds")
MIB = 2**20
ANSWER_BYTES = 32 * MIB  # a whole JSON answer (the pod's status with every key and session is well under 1 MiB)
STREAM_BYTES = 64 * MIB  # one streamed answer's events (a 256-token answer is tens of kB; a ping ~50 bytes)
CONNECT_S = 10.0  # httpx's own per-step timeout under the deadline: a silent socket fails before a long deadline


class OverLimit(httpx.HTTPError):
    """An answer that did not come whole within its deadline, or that came larger than its cap: one line."""


class DeadlineSettingError(ValueError):
    """VLLM_POD_DEADLINE_S holds a value DEADLINE_RULE does not allow; `str()` is the one line to show."""


@dataclass(frozen=True)
class Limits:
    """A request's total deadline (seconds) and the most bytes read of its answer."""

    deadline_s: float
    max_bytes: int = ANSWER_BYTES


def limits(deadline_s: float, max_bytes: int = ANSWER_BYTES, environ: Mapping[str, str] = os.environ) -> Limits:
    """A caller's limits, its deadline replaced by VLLM_POD_DEADLINE_S when that is set (DeadlineSettingError for a
    value not allowed)."""
    raw = environ.get(DEADLINE_VARIABLE, "")
    if raw.strip():
        try:
            deadline_s = float(DEADLINE_RULE.parse(raw))
        except ValueError:
            raise DeadlineSettingError(
                f"{DEADLINE_VARIABLE}={quoted(raw)} is not allowed: expected {DEADLINE_RULE.allowed}"
            ) from None
    return Limits(deadline_s, max_bytes)


@dataclass(frozen=True)
class Answer:
    """A whole answer, read within its limits."""

    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.content)


def size(count: int) -> str:
    return f"{count / MIB:g} MiB" if count >= MIB else f"{count:,} bytes"


@asynccontextmanager
async def deadline(seconds: float, url: str) -> AsyncIterator[None]:
    """The block's whole run within `seconds` of wall-clock time: past it, OverLimit (the block is cancelled)."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise OverLimit(f"{url}: no complete answer within {seconds:g} s (the request's total deadline)") from None


async def chunks(response: httpx.Response, max_bytes: int, url: str) -> AsyncIterator[bytes]:
    """The answer's bytes, OverLimit once more than `max_bytes` came (a declared Content-Length over it fails first,
    before any byte is read)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise OverLimit(f"{url}: an answer of {size(int(declared))} declared, over the {size(max_bytes)} read at most")
    seen = 0
    async for chunk in response.aiter_bytes():
        seen += len(chunk)
        if seen > max_bytes:
            raise OverLimit(f"{url}: the answer went past {size(max_bytes)}, the most read of one; stopped there")
        yield chunk


async def lines(response: httpx.Response, max_bytes: int, url: str) -> AsyncIterator[str]:
    """The answer's lines (without their ends), decoded as UTF-8, read within `max_bytes` in all (a line without end
    grows in place: no copy of what came before at each chunk)."""
    line = bytearray()
    async for chunk in chunks(response, max_bytes, url):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            line += chunk[start:end]
            yield decoded(line)
            line.clear()
            start = end + 1
        line += chunk[start:]
    if line:
        yield decoded(line)


def decoded(line: bytearray) -> str:
    return line.removesuffix(b"\r").decode("utf-8", "replace")


async def request(client: httpx.AsyncClient, method: str, path: str, bounds: Limits, body: Any = None) -> Answer:
    """One request, its whole answer read within `bounds` (OverLimit past them; httpx's errors as they come)."""
    url = f"{str(client.base_url).rstrip('/')}{path}"
    async with deadline(bounds.deadline_s, url), client.stream(method, path, json=body) as response:
        content = b"".join([chunk async for chunk in chunks(response, bounds.max_bytes, url)])
        return Answer(response.status_code, content)


def request_sync(
    base_url: str, headers: Mapping[str, str], method: str, path: str, bounds: Limits, body: Any = None
) -> Answer:
    """`request` for a caller with no event loop (a command's main, a worker thread): its own loop and client."""

    async def asked() -> Answer:
        timeout = httpx.Timeout(min(CONNECT_S, bounds.deadline_s), read=bounds.deadline_s)
        async with httpx.AsyncClient(base_url=base_url, headers=dict(headers), timeout=timeout) as client:
            return await request(client, method, path, bounds, body)

    return asyncio.run(asked())
