"""A streamed `/v1/messages` request read as raw SSE, with when each kind of event first came: what a test
of a long wait (a model swap) checks, pings included, which the SDKs hide."""

from __future__ import annotations

import json
import time

import httpx


def stream_events(
    url: str, key: str, body: dict, timeout_s: float, seen: dict[str, float] | None = None
) -> list[tuple[str, dict]]:
    """POST `body` (streamed) to `url`/v1/messages; its events in order. `seen`: each event name → seconds from
    the request to its first occurrence."""
    began, seen = time.monotonic(), seen if seen is not None else {}
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    events: list[tuple[str, dict]] = []
    with httpx.stream("POST", f"{url}/v1/messages", json={**body, "stream": True}, headers=headers,
                      timeout=timeout_s) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
                seen.setdefault(name, time.monotonic() - began)
    return events


def text_of(events: list[tuple[str, dict]]) -> str:
    """The text the events' deltas carry."""
    return "".join(data["delta"].get("text", "") for name, data in events if name == "content_block_delta")
