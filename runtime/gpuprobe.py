"""A sick host found by probing its GPUs: what `nvidia-smi` lists against what CUDA sees, the faults `nvidia-smi -q`
and the kernel's Xid lines report, and a small CUDA probe on every device.

Two grades of evidence. `sick`: the host cannot serve (a GPU lost to the driver or to CUDA, a probe that fails, the
driver asking for a reset or a reboot, a memory row that could not be remapped), so the pod refuses to start on it.
`suspect`: the host may be at fault (an Xid that names hardware, an uncorrectable ECC error since the driver loaded, a
page or row waiting for a reset), which only corroborates a CUDA fault the engine died of: "CUDA error: an illegal
memory access" is as often a kernel bug for one model and shape as a bad GPU (runtime/pod/diagnosis.py).

Every probe is a subprocess with a deadline, and only the first OUTPUT_CAP bytes of what it prints are read: a
wedged driver hangs `nvidia-smi` and `cuInit` alike, and nothing it prints may fill the pod's memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

NVIDIA_SMI = "nvidia-smi"
KERNEL_LOG = ("dmesg",)  # the NVRM Xid lines; most containers may not read it (then: nothing to say)
SMI_DEADLINE_S = 20.0  # `nvidia-smi -q` on eight GPUs takes seconds; one that hangs is itself a verdict
CUDA_DEADLINE_S = 90.0  # import torch (seconds) and a context on every device (a second or two each)
OUTPUT_CAP = 256 * 1024  # `nvidia-smi -q` on eight GPUs prints ~60 KB

# Xids that name the hardware (NVIDIA's Xid catalogue): a double-bit ECC error (48), a page or row retirement
# (63, 64), NVLink (74), the GPU off the bus (79), contained or uncontained memory errors (94, 95), the GSP
# firmware (119, 120), an unrecovered ECC error (140), a recovery action (154). Xid 13, 31, 43 and 45 follow an
# application's own fault, an illegal address among them: they corroborate nothing.
HARDWARE_XIDS = {
    48: "double-bit ECC error",
    63: "memory page or row retired",
    64: "memory page or row retirement failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    154: "GPU recovery action changed",
}

# Run in the engine's Python: how many devices CUDA sees, then a context, an allocation and a matmul on each, whose
# result is checked (`item()` synchronises, so an asynchronous fault is reported on its own device).
CUDA_PROBE = """\
import torch
count = torch.cuda.device_count()
print("devices", count, flush=True)
for index in range(count):
    try:
        ones = torch.ones((256, 256), device=f"cuda:{index}")
        value = (ones @ ones).sum().item()
        print(f"ok {index}" if value == 256.0**3 else f"wrong {index} a matmul gave {value}", flush=True)
    except Exception as error:
        print("failed", index, f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}", flush=True)
"""


@dataclass(frozen=True)
class Ran:
    """A probe's output (stdout and stderr together, at most OUTPUT_CAP bytes), and how it ended."""

    text: str
    returncode: int | None  # None: it could not run, or was killed (its deadline)
    timed_out: bool = False


def run_bounded(
    argv: Sequence[str], deadline_s: float, env: Mapping[str, str] | None = None, cap: int = OUTPUT_CAP
) -> Ran:
    """Run `argv` until it exits, `deadline_s` passes or it printed `cap` bytes; its process group is then killed."""
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,  # its group: a hung probe's children die with it
        )
    except OSError:
        return Ran("", None)
    assert process.stdout is not None
    chunks: list[bytes] = []
    size, ends_at, timed_out = 0, time.monotonic() + deadline_s, False
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while size < cap:
            left = ends_at - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if not selector.select(left):
                continue
            chunk = os.read(process.stdout.fileno(), min(65536, cap - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    if timed_out or size >= cap:
        _kill_group(process.pid)
    try:
        returncode = process.wait(max(0.1, ends_at - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        returncode, timed_out = process.wait(), True
    process.stdout.close()
    return Ran(b"".join(chunks).decode(errors="replace"), None if timed_out else returncode, timed_out)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# --- what nvidia-smi says ---

LOST = re.compile(r"Unable to determine the device handle for ([^\n]*)|GPU is lost[^\n]*|No devices were found")
BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d")


def listed_gpus(text: str) -> tuple[int, list[str]]:
    """`nvidia-smi -L`: how many GPUs the driver lists (those it lost included), and a line for each lost one."""
    listed = len(re.findall(r"^GPU \d+: ", text, re.MULTILINE))
    lost = [_lost_line(found) for found in LOST.finditer(text)]
    return listed + sum(1 for line in lost if "cannot reach" in line), lost


def _lost_line(found: re.Match[str]) -> str:
    """One line for nvidia-smi's words about a GPU it lost: `Unable to determine the device handle for GPU3:
    0000:5D:00.0: Unknown Error`, `GPU is lost. Reboot the system…`, `No devices were found`."""
    if found.group(0).startswith("No devices"):
        return "nvidia-smi finds no GPU (No devices were found)"
    if found.group(1) is None:
        return "the driver has lost a GPU (GPU is lost)"
    what = found.group(1).strip()
    bus = BUS_ID.search(what)
    reason = what.rsplit(": ", 1)[-1].strip() if ": " in what else ""
    return f"the driver cannot reach the GPU at {bus.group(0) if bus else what[:40]} ({reason[:80] or 'no reason'})"


def query_faults(text: str) -> tuple[list[str], list[str]]:
    """`nvidia-smi -q`: (what makes the host sick, what makes it suspect), one line each, per GPU."""
    sick: list[str] = []
    suspect: list[str] = []
    gpu, sections = "the GPU", [(-1, "")]
    for line in text.splitlines():
        if not line.strip():
            continue
        if found := re.match(r"GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.\d)\s*$", line):
            gpu, sections = f"GPU {found.group(1)}", [(-1, "")]
            continue
        indent = len(line) - len(line.lstrip())
        while sections[-1][0] >= indent:
            sections.pop()
        key, colon, value = (part.strip() for part in line.partition(":"))
        if not colon:
            sections.append((indent, key))
            continue
        path = " / ".join([*(name for _, name in sections[1:]), key])
        _judge(f"{gpu}", path, value, sick, suspect)
    sick += [_lost_line(found) for found in LOST.finditer(text)]
    return sick, suspect


def _judge(gpu: str, path: str, value: str, sick: list[str], suspect: list[str]) -> None:
    if path == "GPU Recovery Action" and value not in ("None", "N/A", ""):
        sick.append(f"{gpu} asks for {value} (GPU Recovery Action)")
    elif path == "Remapped Rows / Remapping Failure Occurred" and value == "Yes":
        sick.append(f"{gpu} could not remap a faulty memory row (Remapping Failure Occurred: Yes)")
    elif path == "Remapped Rows / Pending" and value == "Yes":
        suspect.append(f"{gpu} has a remapped memory row waiting for a reset (Remapped Rows Pending: Yes)")
    elif path == "Retired Pages / Pending Page Blacklist" and value == "Yes":
        suspect.append(f"{gpu} has a retired memory page waiting for a reset (Pending Page Blacklist: Yes)")
    elif re.match(r"ECC Errors / Volatile / (.*Uncorrectable|Double Bit / Total)", path) and _count(value) > 0:
        suspect.append(f"{gpu} had {_count(value)} uncorrectable ECC errors since the driver loaded ({path})")


def _count(value: str) -> int:
    return int(value) if value.isdigit() else 0


def bus_ids(query: str) -> set[str]:
    """The PCI addresses of the GPUs `nvidia-smi -q` names, as the kernel's Xid lines write them (`0000:18:00`)."""
    found = re.findall(r"^GPU ([0-9A-Fa-f]+):([0-9A-Fa-f]+:[0-9A-Fa-f]+)\.", query, re.MULTILINE)
    return {f"{domain[-4:]}:{bus}".lower() for domain, bus in found}


def kernel_xids(text: str, ours: set[str]) -> list[str]:
    """The kernel log's hardware Xids on this pod's GPUs (a container may see the whole host's), one line per kind."""
    found: dict[tuple[int, str], str] = {}
    for pci, code in re.findall(r"NVRM: Xid \(PCI:([0-9A-Fa-f:]+)\): (\d+),", text):
        xid = int(code)
        if xid in HARDWARE_XIDS and (not ours or pci.lower() in ours):
            found.setdefault((xid, pci), f"Xid {xid} on {pci} ({HARDWARE_XIDS[xid]})")
    return list(found.values())


# --- what CUDA says ---


@dataclass(frozen=True)
class CudaAnswer:
    """The CUDA probe's answer: the devices CUDA counts (None: it did not say) and a line per device that failed."""

    devices: int | None
    failed: tuple[str, ...] = ()
    busy: tuple[str, ...] = ()  # out of memory: a process still holds the GPU, which proves nothing of the host
    ran: bool = True  # False: no engine Python, or no torch in it (nvidia-smi alone judges)


def cuda_probe(python: Path, env: Mapping[str, str], deadline_s: float = CUDA_DEADLINE_S) -> CudaAnswer:
    """Run CUDA_PROBE in the engine's Python (its venv, its environment: the compat library included)."""
    if not python.exists():
        return CudaAnswer(None, ran=False)
    ran = run_bounded([str(python), "-c", CUDA_PROBE], deadline_s, env)
    if "No module named 'torch'" in ran.text:
        return CudaAnswer(None, ran=False)
    devices: int | None = None
    answered: set[str] = set()
    failed: list[str] = []
    busy: list[str] = []
    for line in ran.text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "devices" and rest.strip().isdigit():
            devices = int(rest)
        elif word == "ok":
            answered.add(rest.strip())
        elif word in ("failed", "wrong"):
            index, _, why = rest.partition(" ")
            answered.add(index)
            (busy if "out of memory" in why else failed).append(f"GPU {index} failed the CUDA probe: {why[:160]}")
    if devices is None:
        last = next((line.strip() for line in reversed(ran.text.splitlines()) if line.strip()), "")
        if not ran.timed_out and "cuda" not in last.lower():
            return CudaAnswer(None, ran=False)  # torch itself broken (an image's fault, not the host's): no verdict
        why = f"no answer within {deadline_s:g} s" if ran.timed_out else last[:160]
        return CudaAnswer(None, (f"CUDA could not be initialised: {why}",))
    if ran.timed_out:
        failed += [
            f"GPU {index} did not answer the CUDA probe within {deadline_s:g} s"
            for index in map(str, range(devices))
            if index not in answered
        ][:1]  # the probe stops at the first device that hangs
    return CudaAnswer(devices, tuple(failed), tuple(busy))


# --- the verdict ---


@dataclass(frozen=True)
class HostHealth:
    """What the probes found: `sick` (the host cannot serve), `suspect` (it may be at fault), and what was checked."""

    sick: tuple[str, ...] = ()
    suspect: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()

    @property
    def evidence(self) -> tuple[str, ...]:
        return self.sick + self.suspect

    def summary(self) -> str:
        """One line: the evidence, or what was checked and found sound."""
        if self.evidence:
            more = f" (and {len(self.evidence) - 3} more)" if len(self.evidence) > 3 else ""
            return "; ".join(self.evidence[:3]) + more
        return f"no fault ({'; '.join(self.checked) or 'nothing could be checked'})"


def examine(
    python: Path | None,
    env: Mapping[str, str],
    *,
    nvidia_smi: str = NVIDIA_SMI,
    kernel_log: Sequence[str] = KERNEL_LOG,
    smi_deadline_s: float = SMI_DEADLINE_S,
    cuda_deadline_s: float = CUDA_DEADLINE_S,
) -> HostHealth:
    """Every probe, bounded: `nvidia-smi -L` and `-q`, the kernel log's Xids, and the CUDA probe in `python` (None:
    none). A probe that cannot run (no nvidia-smi, no torch, a kernel log the container may not read) says nothing."""
    sick: list[str] = []
    suspect: list[str] = []
    checked: list[str] = []
    listing = run_bounded([nvidia_smi, "-L"], smi_deadline_s, env)
    if listing.timed_out:
        sick.append(f"nvidia-smi -L did not answer within {smi_deadline_s:g} s")
    listed, lost = listed_gpus(listing.text)
    query = run_bounded([nvidia_smi, "-q"], smi_deadline_s, env)
    if query.timed_out:
        sick.append(f"nvidia-smi -q did not answer within {smi_deadline_s:g} s")
    faulty, suspicious = query_faults(query.text)
    sick += list(dict.fromkeys(lost + faulty))  # a GPU lost is in both
    suspect += suspicious
    if listing.text or query.text:
        checked.append(f"nvidia-smi: {listed} GPU{'s' if listed != 1 else ''}")
    xids = kernel_xids(run_bounded(kernel_log, smi_deadline_s, env).text, bus_ids(query.text)) if kernel_log else []
    suspect += xids
    if python is not None:
        cuda = cuda_probe(python, env, cuda_deadline_s)
        if cuda.ran:
            sick += cuda.failed
            expected = _visible(listed, env)
            if cuda.devices is not None and expected and cuda.devices < expected:
                sick.append(f"nvidia-smi lists {expected} GPUs but CUDA sees {cuda.devices}")
            checked.append(f"a CUDA probe on {cuda.devices if cuda.devices is not None else '?'} devices")
    return HostHealth(tuple(sick), tuple(suspect), tuple(checked))


def _visible(listed: int, env: Mapping[str, str]) -> int:
    """How many devices CUDA should see: those listed, fewer when CUDA_VISIBLE_DEVICES picks some."""
    chosen = [part for part in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    return min(listed, len(chosen)) if chosen else listed
