"""`python -m runtime bench [URL] [--key K] [--quick] [--json]`: how fast this pod runs, measured as the field notes
measured (through the bridge, as Claude Code reaches it), next to what the notes measured for the same model and card.

- solo decode: one stream at a time, at growing prompt lengths (the notes' 3k, 32k, 114k, 282k, 1M, up to the window);
- aggregate: 1, 2, 4, 8 and 16 sessions at once, the output tokens of all of them over the round's time;
- prefill: a long prompt cold (salted) and warm (the same prompt again, read from the prefix cache), with the time to
  the first token of each.
Every prompt starts with a fresh salt, so that the prefix cache never flatters a cold figure (the notes measured a
false "cold" 40k tokens/s before they salted), and asks the model to count without end, so that every answer runs to
its `max_tokens` (each row gives the tokens its answer had: one that stopped early is a rate from fewer).

The client is httpx, the runtime's own: measured against NVIDIA's AIPerf on one paced stand-in behind the bridge
(benchmarks/client.py), it spends a quarter of AIPerf's CPU per token (102-114 µs against 431-534) and installs nothing
(AIPerf: 142 packages, 1.2 GB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from runtime.checks.asking import DEFAULT_URL, REQUEST_S, CheckFailed, Pod
from runtime.checks.bounded import DeadlineSettingError, Limits, chunks, deadline, limits, lines, request
from runtime.checks.endpoint import EndpointError, check_endpoint
from runtime.client.identity import pod_key, pod_url
from runtime.engine.tinymodel.script import MARK_LONG
from runtime.headers import KEY_DEFAULT, api_headers
from runtime.logsafe import strip_controls, terminal_line

CONTEXTS = (3_000, 32_000, 114_000, 282_000, 1_000_000)  # the notes' solo columns (Ornith NVFP4 on an Ada)
SESSIONS = (1, 2, 4, 8, 16)  # the notes' aggregate columns
DECODE_TOKENS = 256  # per answer: enough steps that the first token's cost fades from the rate
PREFILL_TOKENS = 32_000  # the cold and warm prompt (or half the window, if smaller)
SESSION_PROMPT_TOKENS = 1_000  # each aggregate session's prompt: short, so that the round measures decoding
NAME_CHARS = 120  # of a model's or a GPU's name from the pod's status, as printed
ROOM = 512  # tokens kept free in the window for the chat template and the answer
# Controlled output: the notes' "sortie contrôlée". The tiny model's own marker makes it talk until cut off too.
COUNT = f"\n\nNow count upward from 1, one number per line, and never stop on your own. {MARK_LONG}"
# The notes' figures for a model on a card (solo decode at a short prompt, aggregate at 8 sessions), by recipe and
# by a piece of the GPU's name: this pod's ratio to them is printed where both match. Ornith's session table does not
# say which of its two quantizations it measured (its 1-session figure is the AWQ's): only its solo is taken.
REFERENCES: dict[tuple[str, str], tuple[float, float | None]] = {
    ("nemotron", "RTX 6000 Ada"): (209.9, 648.0),
    ("nemotron", "RTX PRO 6000"): (282.0, 1045.0),
    ("ornithnvfp4", "RTX 6000 Ada"): (201.0, None),
    ("flashnext", "RTX PRO 6000"): (83.2, 426.0),
}


@dataclass(frozen=True)
class Plan:
    """What a run measures: the solo prompt lengths, the session counts, each answer's length, the prefill prompt."""

    contexts: tuple[int, ...] = CONTEXTS
    sessions: tuple[int, ...] = SESSIONS
    decode_tokens: int = DECODE_TOKENS
    prefill_tokens: int = PREFILL_TOKENS


QUICK = Plan(CONTEXTS[:2], SESSIONS[:3], 64, 8_000)  # minutes on a GPU, a few on the cpu image's tiny model


@dataclass
class Answer:
    """One streamed answer, timed: when its first and last tokens came, and its usage."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    first_s: float | None = None  # from the request's start
    last_s: float | None = None

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first: the decoding's own pace."""
        if self.first_s is None or self.last_s is None or self.output_tokens < 2 or self.last_s <= self.first_s:
            return None
        return (self.output_tokens - 1) / (self.last_s - self.first_s)

    @property
    def pace(self) -> float | None:
        """Tokens per second over the whole answer, its wait and prefill included: a session's pace as its user sees
        it (an engine that merges tokens into few chunks under load leaves no decoding phase of its own to time)."""
        return self.output_tokens / self.last_s if self.last_s else None


@dataclass
class Report:
    model: str
    gpu: str | None
    solo: list[dict[str, Any]] = field(default_factory=list)
    aggregate: list[dict[str, Any]] = field(default_factory=list)
    prefill: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] | None = None
    kept: str = ""  # what became of it on the pod

    def sent(self) -> dict[str, Any]:
        """The report as the pod keeps it (`PUT /v1/pod/bench`): all but what became of it."""
        return {name: value for name, value in asdict(self).items() if name != "kept"}


async def stream(pod: Pod, content: str, max_tokens: int) -> Answer:
    """One streamed /v1/messages, read to its end; CheckFailed on a refusal or an error event."""
    body = {
        "model": pod.model,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    }
    answer, began, event = Answer(), time.monotonic(), ""
    url, bounds = f"{str(pod.client.base_url).rstrip('/')}/v1/messages", pod.stream_bounds
    async with deadline(bounds.deadline_s, url), pod.client.stream("POST", "/v1/messages", json=body) as response:
        if response.status_code != 200:
            head = b"".join([chunk async for chunk in chunks(response, bounds.max_bytes, url)])
            raise CheckFailed(f"answered {response.status_code}: {head[:200]!r}")
        async for line in lines(response, bounds.max_bytes, url):
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: "):
                took(answer, event, json.loads(line.removeprefix("data: ")), time.monotonic() - began)
    return answer


def took(answer: Answer, event: str, data: dict[str, Any], at_s: float) -> None:
    """What one event says: the prompt's size first (the final usage may correct it), each token's time, the answer's
    size (the last usage holds it)."""
    if event == "message_start":
        counted(answer, data["message"]["usage"])
    elif event == "content_block_delta":
        answer.first_s = at_s if answer.first_s is None else answer.first_s
        answer.last_s = at_s
    elif event == "message_delta":
        counted(answer, data.get("usage") or {})
    elif event == "error":
        raise CheckFailed(f"the stream ended in an error: {data.get('error', {}).get('message', data)}")


def counted(answer: Answer, usage: dict[str, Any]) -> None:
    if "input_tokens" in usage:  # Anthropic's: the tokens not read from the cache, then those read
        answer.cached_tokens = int(usage.get("cache_read_input_tokens") or 0)
        answer.prompt_tokens = int(usage["input_tokens"] or 0) + answer.cached_tokens
    answer.output_tokens = int(usage.get("output_tokens") or answer.output_tokens)


async def solo(pod: Pod, contexts: tuple[int, ...], max_tokens: int) -> list[dict[str, Any]]:
    """One stream at each prompt length that fits the window (and the window itself, when it is below the next)."""
    fitting = [size for size in contexts if size + max_tokens + ROOM <= pod.window]
    if len(fitting) < len(contexts):
        fitting.append(pod.window - max_tokens - ROOM)
    rows = []
    for size in fitting:
        answer = await stream(pod, await pod.filler(size) + COUNT, max_tokens)
        rows.append(
            {
                "context": answer.prompt_tokens,
                "tokens": answer.output_tokens,
                "decode_tok_s": rounded(answer.decode_rate),
                "ttft_s": rounded(answer.first_s, 3),
            }
        )
    return rows


async def aggregate(pod: Pod, sessions: tuple[int, ...], max_tokens: int) -> list[dict[str, Any]]:
    """`n` sessions at once: all their output tokens over the time from the round's start to its last token."""
    rows = []
    for n in sessions:
        prompts = [await pod.filler(SESSION_PROMPT_TOKENS) + COUNT for _ in range(n)]
        began = time.monotonic()
        answers = await asyncio.gather(*(stream(pod, prompt, max_tokens) for prompt in prompts))
        wall = time.monotonic() - began
        tokens = sum(answer.output_tokens for answer in answers)
        paces = [pace for answer in answers if (pace := answer.pace) is not None]
        rows.append(
            {
                "sessions": n,
                "tokens": tokens,
                "aggregate_tok_s": rounded(tokens / wall),
                "slowest_session_tok_s": rounded(min(paces) if paces else None),
            }
        )
    return rows


async def prefill(pod: Pod, tokens: int) -> dict[str, Any]:
    """The same salted prompt twice, one token asked: cold, then warm from the prefix cache."""
    prompt = await pod.filler(min(tokens, pod.window // 2)) + "\n\nSay hello."
    cold, warm = await stream(pod, prompt, 1), await stream(pod, prompt, 1)

    def row(answer: Answer) -> dict[str, Any]:
        rate = answer.prompt_tokens / answer.first_s if answer.first_s else None  # warm: the cache's worth
        return {
            "prompt_tokens": answer.prompt_tokens,
            "cached_tokens": answer.cached_tokens,
            "ttft_s": rounded(answer.first_s, 3),
            "prefill_tok_s": rounded(rate),
        }

    return {"cold": row(cold), "warm": row(warm)}


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def reference_for(model: str, gpu: str | None) -> tuple[str, float, float | None] | None:
    """The notes' (card, solo, aggregate at 8) for this model on this card, if they measured it."""
    for (recipe, card), (solo_rate, at_eight) in REFERENCES.items():
        if recipe == model and gpu is not None and card.lower() in gpu.lower():
            return card, solo_rate, at_eight
    return None


def compared(report: Report) -> dict[str, Any] | None:
    found = reference_for(report.model, report.gpu)
    if found is None:
        return None
    card, solo_rate, at_eight = found
    ours_solo = report.solo[0]["decode_tok_s"] if report.solo else None
    ours_eight = next((row["aggregate_tok_s"] for row in report.aggregate if row["sessions"] == 8), None)
    return {
        "card": card,
        "solo_tok_s": solo_rate,
        "aggregate_at_8_tok_s": at_eight,
        "solo_ratio": rounded(ours_solo / solo_rate, 2) if ours_solo else None,
        "aggregate_at_8_ratio": rounded(ours_eight / at_eight, 2) if ours_eight and at_eight else None,
    }


async def pod_facts(client: httpx.AsyncClient, bounds: Limits) -> tuple[str | None, str | None]:
    """The recipe and the first GPU's name, from the pod's status (None where it does not say)."""
    try:
        status = (await request(client, "GET", "/v1/pod/status", bounds)).json()
    except (httpx.HTTPError, ValueError):
        return None, None
    facts = status.get("model") if isinstance(status, dict) else None
    model = facts.get("name") if isinstance(facts, dict) else None
    gpus = status.get("gpus") if isinstance(status, dict) else None
    gpu = gpus[0].get("name") if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) else None
    return shown_name(model), shown_name(gpu)


def shown_name(value: object) -> str | None:
    """A name the pod's status gives, as a terminal may show it: text without controls, cut; None for anything else."""
    if not isinstance(value, str):
        return None
    return terminal_line(value, NAME_CHARS) or None


async def run_bench(url: str, key: str, quick: bool, say: Any) -> Report:
    bounds = limits(REQUEST_S)  # before the first request: a deadline not allowed stops here, in one line
    endpoint = await asyncio.to_thread(check_endpoint, url, key)
    plan = QUICK if quick else Plan()
    headers = api_headers(key)
    async with httpx.AsyncClient(base_url=endpoint.base_url, headers=headers, timeout=REQUEST_S) as client:
        pod = Pod(client, endpoint.model, endpoint.window, bounds)
        recipe, gpu = await pod_facts(client, bounds)
        report = Report(recipe or endpoint.model, gpu)
        say(
            f"{endpoint.base_url}: {report.model} ({endpoint.window:,}-token window) on {gpu or 'a machine that reads no GPU'}"
        )
        report.solo = await solo(pod, plan.contexts, plan.decode_tokens)
        say(f"\n{solo_table(report.solo)}")
        report.aggregate = await aggregate(pod, plan.sessions, plan.decode_tokens)
        say(f"\n{aggregate_table(report.aggregate)}")
        report.prefill = await prefill(pod, plan.prefill_tokens)
        say(f"\n{prefill_table(report.prefill)}")
        report.reference = compared(report)
        if report.reference is not None:
            say(reference_line(report.reference))
        report.kept = await kept_on_the_pod(client, report, bounds)
        say(f"\n{report.kept}")
    return report


async def kept_on_the_pod(client: httpx.AsyncClient, report: Report, bounds: Limits) -> str:
    """The report sent to the pod, which keeps the last one on its volume for the console and `runtime status`."""
    try:
        answer = await request(client, "PUT", "/v1/pod/bench", bounds, report.sent())
    except httpx.HTTPError as error:
        return f"not kept on the pod: {type(error).__name__}"
    if answer.status_code == 204:
        return "kept on the pod: its console and `runtime status` show it"
    if answer.status_code == 403:
        return "not kept on the pod: it keeps a report sent with an admin key"
    if answer.status_code in (404, 405, 501):
        return "not kept on the pod: its bridge is older than this command"
    return f"not kept on the pod: it answered {answer.status_code} {terminal_line(answer.text, 200)}"


def solo_table(rows: list[dict[str, Any]]) -> str:
    head = "solo: prompt     " + "".join(f"{row['context']:>12,}" for row in rows)
    rates = "decode tok/s     " + "".join(f"{shown(row['decode_tok_s']):>12}" for row in rows)
    ttft = "first token (s)  " + "".join(f"{shown(row['ttft_s']):>12}" for row in rows)
    return "\n".join([head, rates, ttft])


def aggregate_table(rows: list[dict[str, Any]]) -> str:
    head = "sessions         " + "".join(f"{row['sessions']:>10}" for row in rows)
    total = "aggregate tok/s  " + "".join(f"{shown(row['aggregate_tok_s']):>10}" for row in rows)
    each = "slowest session  " + "".join(f"{shown(row['slowest_session_tok_s']):>10}" for row in rows)
    return "\n".join([head, total, each])


def prefill_table(result: dict[str, Any]) -> str:
    lines = [f"{'prefill':<10}{'prompt':>10}{'cached':>10}{'first token (s)':>17}{'tok/s':>11}"]
    for name in ("cold", "warm"):
        row = result[name]
        rate = "—" if row["prefill_tok_s"] is None else f"{row['prefill_tok_s']:,.0f}"
        lines.append(
            f"{name:<10}{row['prompt_tokens']:>10,}{row['cached_tokens']:>10,}{shown(row['ttft_s']):>17}{rate:>11}"
        )
    return "\n".join(lines)


def reference_line(reference: dict[str, Any]) -> str:
    line = f"against the field notes on an {reference['card']}: solo {shown(reference['solo_ratio'])} of their "
    line += f"{reference['solo_tok_s']} tok/s"
    if reference["aggregate_at_8_tok_s"] is not None:
        line += f", 8 sessions {shown(reference['aggregate_at_8_ratio'])} of their {reference['aggregate_at_8_tok_s']} tok/s"
    return line


def one_line(text: str) -> str:
    """A failure's one line on the terminal: no control, no line break, cut at 300 characters."""
    return terminal_line(text, 300)


def shown(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "url", nargs="?", help=f"the pod's URL (default: the pod `pod up` last brought up, else {DEFAULT_URL})"
    )
    parser.add_argument("--key", help=f"a key of the pod's VL_API_KEYS (default: {KEY_DEFAULT})")
    parser.add_argument("--quick", action="store_true", help="two prompt lengths, up to 4 sessions, 64-token answers")
    parser.add_argument("--json", action="store_true", help='print {"solo": […], "aggregate": […], "prefill": {…}}')


def run(args: argparse.Namespace) -> int:
    say = (lambda line: None) if args.json else (lambda line: print(strip_controls(line), flush=True))
    try:
        url = pod_url(args.url) or DEFAULT_URL
        report = asyncio.run(run_bench(url, pod_key(args.key, url) or "", args.quick, say))
    except (EndpointError, DeadlineSettingError) as error:
        print(one_line(f"runtime bench: {error}"), file=sys.stderr)
        return 2
    except (CheckFailed, httpx.HTTPError) as error:
        print(one_line(f"runtime bench: {type(error).__name__}: {error}"), file=sys.stderr)
        return 1
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as error:  # not Anthropic's: no traceback
        print(
            one_line(f"runtime bench: the pod's stream is not the Messages API's ({type(error).__name__}: {error})"),
            file=sys.stderr,
        )
        return 1
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    return 0
