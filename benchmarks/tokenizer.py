"""Benchmark: fastokens against Hugging Face `tokenizers`, encoding a Claude Code-sized prompt. Prints JSON.

    python benchmarks/tokenizer.py [--rounds N] [--chars N]

What VL_FASTOK decides: the tokenizer vLLM's API server runs on every request's prompt before prefill
(the seeds measured -12% median TTFT on a GPU with Qwen's tokenizer). Two worker processes load the tiny
model's tokenizer with transformers, one with `fastokens.patch_transformers()` as vLLM applies it, and
encode the same prompt in interleaved rounds, so machine noise hits both alike. The tiny model's tokenizer
is a small byte-level BPE: the ratio, not the milliseconds, is what carries over to a real vocabulary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Claude Code's requests are prose and code: this project's own guides and sources, as a stand-in.
SOURCES = (
    "docs/guide/run-a-pod.md",
    "docs/explanation/bridge.md",
    "runtime/bridge/exchange.py",
    "runtime/bridge/stream.py",
    "runtime/pod/start.py",
    "runtime/settings.py",
)


def worker(model: str, fastokens: bool, prompt_chars: int) -> None:
    """Load the tokenizer, then encode the prompt once per `go` line on stdin; answer with ms and token count."""
    if fastokens:
        import fastokens as fast

        with contextlib.redirect_stdout(sys.stderr):  # its own line, as in vLLM's log; stdout is the answers'
            fast.patch_transformers()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    material = "\n".join((ROOT / name).read_text() for name in SOURCES)
    prompt = (material * (prompt_chars // len(material) + 1))[:prompt_chars]
    tokenizer(prompt)  # warm-up
    for line in sys.stdin:
        text = f"Turn {line.strip()}. {prompt}"  # never twice the same text: no cache of whole prompts helps
        started = time.perf_counter()
        count = len(tokenizer(text)["input_ids"])
        print(json.dumps({"ms": (time.perf_counter() - started) * 1000, "tokens": count}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--chars", type=int, default=70_000, help="prompt length in characters (~17k tokens)")
    parser.add_argument("--worker", choices=["on", "off"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.model, args.worker == "on", args.chars)
    sys.path.insert(0, str(ROOT))
    from runtime.engine.tinymodel import write_tiny_model

    with tempfile.TemporaryDirectory() as folder:
        model = write_tiny_model(Path(folder) / "tiny")
        workers = {
            name: subprocess.Popen([sys.executable, __file__, "--worker", name, "--model", str(model), "--chars", str(args.chars)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for name in ("off", "on")
        }  # fmt: skip
        times: dict[str, list[float]] = {"off": [], "on": []}
        tokens: dict[str, int] = {}
        for turn in range(args.rounds):
            for name, process in workers.items():
                process.stdin.write(f"{turn}\n")
                process.stdin.flush()
                answer = json.loads(process.stdout.readline())
                times[name].append(answer["ms"])
                tokens[name] = answer["tokens"]
        for process in workers.values():
            process.stdin.close()
            process.wait()
    p50 = {name: statistics.median(values) for name, values in times.items()}
    print(json.dumps({
        "prompt_tokens": tokens, "rounds": args.rounds,
        "encode_ms_p50": {"tokenizers": round(p50["off"], 2), "fastokens": round(p50["on"], 2)},
        "fastokens_over_tokenizers": round(p50["on"] / p50["off"], 3),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
