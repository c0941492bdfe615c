"""The checks, one named check at a time through the pod's public path (the bridge, as Claude Code reaches it), that
prove its model answers right under the load it promises: `run_checks`, for `runtime check` and the pod's own.

The field notes' lessons, each a check: never trust a capacity on one request (two near-full-window prefills at
once killed an engine that had passed one); a token count can be right while the content is wrong (a fact hidden
deep in a long prompt must come back, exactly); `/v1/models` answered 200 while every real request failed (the last
check is a real generation). Each prompt is salted, so that the prefix cache never flatters a figure.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable

import httpx

from runtime.checks.asking import REQUEST_S, CheckFailed, Outcome, Pod, Skipped, quoted, text_of
from runtime.checks.bounded import deadline, limits, lines
from runtime.checks.endpoint import check_endpoint
from runtime.checks.images import pictures_to_show
from runtime.engine.tinymodel.script import MARK_TOOL
from runtime.headers import api_headers

NEEDLE_BUDGET_S = 300.0  # the needle's search stops growing past it, and says how far it got
NEEDLE_DEPTHS = (0.1, 0.5, 0.9)  # where the fact is hidden, as a share of the prompt
FULL_SHARE = 0.9  # "near the window": room left for the question, the answer and the chat template
CACHE_READ_SHARE = 0.9  # the second of two identical prompts reads at least this much from the prefix cache
THINKING_BUDGET = 256  # a small budget: the thought must close within it
# The tool's prompt carries the tiny demo model's tool marker (harmless to any other model): the cpu image's model
# then plays its scripted Bash call, so that the check proves the round trip on it too.
TOOL = {
    "name": "Bash",
    "description": "Run a shell command and return its output.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


async def needle(pod: Pod) -> str:
    """A fact hidden at 10, 50 and 90 % of ever longer prompts, up to near the window, within the time budget."""
    began, sizes = time.monotonic(), sorted({min(4096, int(pod.window * FULL_SHARE)), int(pod.window * FULL_SHARE)})
    reached = ""
    for size in sizes:
        for depth in NEEDLE_DEPTHS:
            if time.monotonic() - began > NEEDLE_BUDGET_S:
                return f"found everywhere tried, up to {reached}; stopped at the {NEEDLE_BUDGET_S:.0f} s budget"
            code = f"{secrets.randbelow(10**4):04d}-{secrets.token_hex(2).upper()}"
            before = await pod.filler(int(size * depth))
            after = await pod.filler(int(size * (1 - depth)) - 64)
            prompt = (
                f"{before}\nThe pass code for the vault is {code}.\n{after}\n"
                "What is the pass code for the vault? Reply with the code alone."
            )
            answer = text_of(await pod.ask([{"role": "user", "content": prompt}], max_tokens=32))
            if code not in answer:
                raise CheckFailed(f"not found at {depth:.0%} of {size:,} tokens (answered {quoted(answer)})")
            reached = f"{depth:.0%} of {size:,} tokens"
    return f"found at {', '.join(f'{d:.0%}' for d in NEEDLE_DEPTHS)} of {', '.join(f'{s:,}' for s in sizes)} tokens"


async def concurrent_prefills(pod: Pod) -> str:
    """Two near-full-window prompts at once (salted: nothing shared), both answered, the engine serving after."""
    size = int(pod.window * FULL_SHARE)
    prompts = [await pod.filler(size) + "\nSay hello." for _ in range(2)]
    began = time.monotonic()
    answers = await asyncio.gather(*(pod.ask([{"role": "user", "content": p}], max_tokens=8) for p in prompts))
    seconds = time.monotonic() - began
    if not all(answer.get("content") for answer in answers):
        raise CheckFailed("an answer came back empty")
    await engine_alive(pod)
    tokens = sum(int(answer["usage"]["input_tokens"]) for answer in answers)
    return f"two prompts of ~{size:,} tokens at once ({tokens:,} in all) answered in {seconds:.1f} s; still serving"


async def tool_round_trip(pod: Pod) -> str:
    """A tool call in Claude Code's shape, its result sent back, a final answer."""
    ask = {
        "role": "user",
        "content": f"Run `echo selfcheck` with the Bash tool, then tell me what it printed. {MARK_TOOL}",
    }
    first = await pod.ask([ask], max_tokens=256, tools=[TOOL])
    calls = [block for block in first.get("content", []) if block.get("type") == "tool_use"]
    if first.get("stop_reason") != "tool_use" or not calls:
        raise CheckFailed(f"no tool call (stop_reason {first.get('stop_reason')}, text {quoted(text_of(first))})")
    call = calls[0]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "selfcheck"}]}
    final = await pod.ask(
        [ask, {"role": "assistant", "content": first["content"]}, result], max_tokens=256, tools=[TOOL]
    )
    if final.get("stop_reason") != "end_turn" or not text_of(final):
        raise CheckFailed(f"no final answer after the tool's result (stop_reason {final.get('stop_reason')})")
    return f"{call['name']}({json.dumps(call.get('input'))[:60]}) → result → {quoted(text_of(final))}"


async def thinking(pod: Pod) -> str:
    """Thinking disabled yields no thinking block; a small budget closes the thought within it."""
    question = [{"role": "user", "content": "What is two plus two? Answer in one word."}]
    off = await pod.ask(question, max_tokens=64, thinking={"type": "disabled"})
    if any(block.get("type") == "thinking" for block in off.get("content", [])):
        raise CheckFailed("a thinking block although thinking was disabled")
    on = await pod.ask(
        question, max_tokens=4 * THINKING_BUDGET, thinking={"type": "enabled", "budget_tokens": THINKING_BUDGET}
    )
    kinds = [block.get("type") for block in on.get("content", [])]
    if "thinking" in kinds and "text" not in kinds[kinds.index("thinking") :]:
        raise CheckFailed(f"the thought did not close within {THINKING_BUDGET} tokens (stop {on.get('stop_reason')})")
    said = "thought, then answered" if "thinking" in kinds else "answered without a thought"
    return f"disabled: no thinking block; budget {THINKING_BUDGET}: {said} ({quoted(text_of(on), 30)})"


async def prefix_cache(pod: Pod) -> str:
    """The same long prompt twice: the second reads at least 90 % of it from the prefix cache."""
    prompt = [{"role": "user", "content": await pod.filler(min(16384, pod.window // 2)) + "\nSay hello."}]
    await pod.ask(prompt, max_tokens=1)
    usage = (await pod.ask(prompt, max_tokens=1))["usage"]
    read, fresh = int(usage.get("cache_read_input_tokens") or 0), int(usage.get("input_tokens") or 0)
    share = read / max(1, read + fresh)
    line = f"{read:,} of {read + fresh:,} prompt tokens read from the cache the second time ({share:.0%})"
    if share < CACHE_READ_SHARE:
        raise CheckFailed(line)
    return line


async def pings(pod: Pod) -> str:
    """A streamed answer to a long prompt comes whole: the bridge's pings keep the connection alive meanwhile."""
    body = {
        "model": pod.model,
        "max_tokens": 16,
        "stream": True,
        "messages": [{"role": "user", "content": await pod.filler(pod.window // 2) + "\nSay hello."}],
    }
    began, seen, first = time.monotonic(), {"ping": 0}, None
    url, bounds = f"{str(pod.client.base_url).rstrip('/')}/v1/messages", pod.stream_bounds
    async with deadline(bounds.deadline_s, url), pod.client.stream("POST", "/v1/messages", json=body) as response:
        if response.status_code != 200:
            raise CheckFailed(f"answered {response.status_code}")
        async for line in lines(response, bounds.max_bytes, url):
            event = line.removeprefix("event: ") if line.startswith("event: ") else None
            if event is not None:
                seen[event] = seen.get(event, 0) + 1
                first = first or (time.monotonic() - began if event == "content_block_delta" else None)
    if not seen.get("message_stop"):
        raise CheckFailed(f"the stream ended without message_stop after {time.monotonic() - began:.1f} s")
    return f"first token after {first or 0:.1f} s, {seen['ping']} pings before the end; the stream came whole"


async def vision(pod: Pod) -> str:
    """Generated images that discriminate (plain colours, counts of squares, left or right), each answer naming what
    the image shows; skipped when the model takes no images (the engine refuses any image to a text-only model)."""
    seen: list[str] = []
    for picture in pictures_to_show():
        ask = [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": picture.png}},
                    {"type": "text", "text": picture.question},
                ],
            }
        ]
        response = await pod.post("/v1/messages", {"model": pod.model, "max_tokens": 16, "messages": ask})
        if response.status_code == 400 and any(word in response.text.lower() for word in ("image", "multimodal")):
            raise Skipped(f"the model takes no images ({quoted(refusal(response.text), 80)})")
        if response.status_code != 200:
            raise CheckFailed(f"answered {response.status_code}: {response.text[:200]}")
        try:
            answer = text_of(response.json())
        except (ValueError, AttributeError, TypeError):
            raise CheckFailed(f"answered 200 with no message: {response.text[:200]}") from None
        if picture.answer not in answer.lower():
            raise CheckFailed(f"{picture.shows}: answered {quoted(answer)} ({len(seen)} right before it)")
        seen.append(picture.shows)
    return f"{len(seen)} of {len(seen)} images named right: {', '.join(seen)}"


def refusal(text: str) -> str:
    """A refusal's own words: the Messages API's error message, else its body."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text


async def engine_alive(pod: Pod) -> str:
    """A real generation, last: a dead engine can still list its models."""
    answer = await pod.ask([{"role": "user", "content": "Say hello."}], max_tokens=8)
    if not answer.get("content") or not int(answer["usage"].get("output_tokens") or 0):
        raise CheckFailed("no token generated")
    return f"{answer['usage']['output_tokens']} tokens generated ({quoted(text_of(answer), 30)})"


CHECKS: dict[str, Callable[[Pod], Awaitable[str]]] = {
    "needle": needle,
    "concurrent-prefills": concurrent_prefills,
    "tool-round-trip": tool_round_trip,
    "thinking": thinking,
    "prefix-cache": prefix_cache,
    "vision": vision,
    "pings": pings,
    "engine-alive": engine_alive,
}


async def run_checks(
    url: str,
    key: str,
    names: list[str],
    say: Callable[[Outcome], None],
    model: str | None = None,
    before_each: Callable[[], Awaitable[None]] | None = None,
) -> list[Outcome]:
    """Each named check in order against the pod at `url` (on `model`, else the served model's bare name); each
    outcome said as soon as it is known; `before_each` awaited before each check (the pod's own: its users first)."""
    bounds = limits(REQUEST_S)  # before the first request: a deadline not allowed stops here, in one line
    endpoint = await asyncio.to_thread(check_endpoint, url, key, model)
    headers = api_headers(key)
    outcomes = []
    async with httpx.AsyncClient(base_url=endpoint.base_url, headers=headers, timeout=REQUEST_S) as client:
        pod = Pod(client, endpoint.model, endpoint.window, bounds)
        for name in names:
            if before_each is not None:
                await before_each()
            try:
                outcome = Outcome(name, "passed", await CHECKS[name](pod))
            except Skipped as why:
                outcome = Outcome(name, "skipped", str(why))
            except CheckFailed as failure:
                outcome = Outcome(name, "failed", str(failure))
            except httpx.HTTPError as error:
                outcome = Outcome(name, "failed", f"{type(error).__name__}: {error}"[:300])
            except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:  # not the Messages API
                outcome = Outcome(
                    name, "failed", f"not the Messages API's answer ({type(error).__name__}: {error})"[:300]
                )
            outcomes.append(outcome)
            say(outcome)
    return outcomes
