"""Benchmark: what `runtime bench`'s client costs next to NVIDIA's AIPerf, measuring the same streams. Prints JSON.

    python benchmarks/client.py [--aiperf PATH] [--streams 8] [--answers 64] [--tokens 256] [--pace-ms 5]

One stand-in upstream paced like an engine (`tests/support/upstream.py`), the real bridge in front of it; then
`runtime.client.bench`'s own stream reader, and (with `--aiperf`, an `aiperf` executable installed apart: it is no
dependency of ours) AIPerf's `messages` endpoint type, each sending the same answers. The figure is each client's CPU
time per streamed token, from its own processes' counters; AIPerf's start-up (its services) is taken out by the
difference of a full run and one of an answer per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.bridge import BRIDGE_ENV, LISTENING, UPSTREAM_ARGV, bridge_command, process  # noqa: E402
from runtime.checks.asking import Pod  # noqa: E402
from runtime.client.bench import stream  # noqa: E402
from runtime.engine.tinymodel import write_tiny_model  # noqa: E402

MODEL = "claude-fake"  # the stand-in's


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def ours(url: str, streams: int, answers: int, tokens: int) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, headers={"anthropic-version": "2023-06-01"}, timeout=600) as client:
        pod, queue, total = Pod(client, MODEL, 65536), iter(range(answers)), 0

        async def worker() -> None:
            nonlocal total
            for _ in queue:
                answer = await stream(pod, "hello", tokens)  # awaited first: `total +=` would read a stale total
                total += answer.output_tokens

        before = own_cpu_s()
        await asyncio.gather(*(worker() for _ in range(streams)))
        used = own_cpu_s() - before
    return {"tokens": total, "cpu_s": round(used, 2), "cpu_us_per_token": round(used / total * 1e6, 1)}


def aiperf(executable: str, url: str, streams: int, answers: int, tokens: int, tokenizer: Path) -> float:
    """CPU seconds of one AIPerf run (its processes, start-up included)."""
    with tempfile.TemporaryDirectory() as artifacts:
        argv = [
            executable,
            "profile",
            "--url",
            url,
            "--endpoint-type",
            "messages",
            "--streaming",
            "-m",
            MODEL,
            "--tokenizer",
            str(tokenizer),
            "--use-server-token-count",
            "--concurrency",
            str(streams),
            "--request-count",
            str(answers),
            "--output-tokens-mean",
            str(tokens),
            "--prompt-input-tokens-mean",
            "8",
            "--ui-type",
            "none",
            "--artifact-dir",
            artifacts,
        ]
        before = children_cpu_s()
        ran = subprocess.run(argv, capture_output=True, text=True)
        if ran.returncode != 0:
            raise SystemExit(f"aiperf failed:\n{ran.stdout[-2000:]}\n{ran.stderr[-2000:]}")
        return children_cpu_s() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aiperf", help="an aiperf executable (pip install aiperf, in a virtual environment apart)")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--answers", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--pace-ms", default="5", help="the stand-in's time between tokens (an engine's pace)")
    args = parser.parse_args()
    upstream_argv = [*UPSTREAM_ARGV, "--pace-ms", args.pace_ms]  # benchmarks/bridge.py's fast one, at an engine's pace
    report: dict[str, object] = {"streams": args.streams, "answers": args.answers, "tokens": args.tokens}
    with (
        process(upstream_argv, LISTENING) as (_, upstream),
        process(bridge_command(int(upstream.group(1))), LISTENING, BRIDGE_ENV) as (_, bridge),
    ):
        url = f"http://127.0.0.1:{bridge.group(1)}"
        report["runtime_bench"] = asyncio.run(ours(url, args.streams, args.answers, args.tokens))
        if args.aiperf:
            with tempfile.TemporaryDirectory() as directory:
                tokenizer = write_tiny_model(Path(directory) / "tiny")  # AIPerf loads one, even to count nothing
                small = aiperf(args.aiperf, url, args.streams, args.streams, args.tokens, tokenizer)
                full = aiperf(args.aiperf, url, args.streams, args.answers, args.tokens, tokenizer)
            extra = (args.answers - args.streams) * args.tokens
            report["aiperf"] = {
                f"cpu_s_with_{args.streams}_answers": round(small, 2),
                "full_run_cpu_s": round(full, 2),
                "cpu_us_per_token": round((full - small) / extra * 1e6, 1),
            }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
