"""GPU telemetry: each GPU's utilization, memory, temperature and power, sampled by one background task.

`nvidia-smi --query-gpu` rather than NVML bindings: it is wherever the driver is (no extra pin), and its
CSV can be recorded on real machines and replayed in tests. It is asked every INTERVAL_S, never per
request (a call costs tens of milliseconds of CPU), and the readings of the last HISTORY_S are kept.
"""

from __future__ import annotations

import asyncio
import csv
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from runtime.logsafe import strip_controls

log = logging.getLogger(__name__)

FIELDS = ("index", "name", "utilization.gpu", "memory.used", "memory.total", "temperature.gpu", "power.draw")
QUERY = ("nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits")
INTERVAL_S = 2.0
HISTORY_S = 120.0  # what the console's chart shows
SMI_TIMEOUT_S = 10.0  # a GPU fallen off the bus can make nvidia-smi hang for many seconds
NOTE_CHARS = 200
NO_GPU = "no GPU on this machine (nvidia-smi not found)"


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one moment; temperature and power are None where the GPU does not report them."""

    index: int
    name: str
    utilization_pct: float
    memory_used_mib: float
    memory_total_mib: float
    temperature_c: float | None
    power_w: float | None


@dataclass(frozen=True)
class Sample:
    """One call of nvidia-smi: the GPUs read, what went wrong (None: nothing), and whether to stop asking."""

    gpus: tuple[GpuReading, ...]
    note: str | None = None
    final: bool = False


def number(text: str) -> float | None:
    """A CSV value as a number; None for nvidia-smi's `[N/A]`, `[Not Supported]`, `[Unknown Error]`…"""
    try:
        return float(text)
    except ValueError:
        return None


def parse_query(text: str) -> Sample:
    """The GPUs in QUERY's output. A GPU without utilization or memory (MIG mode answers `[N/A]`) is
    left out, and the note says so: the console shows numbers it has, not zeros it made up."""
    gpus, problems = [], []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row:
            continue
        values = [value.strip() for value in row]
        if len(values) != len(FIELDS) or not values[0].isdigit():
            problems.append(f"unreadable nvidia-smi line: {', '.join(values)}")
            continue
        index, name = int(values[0]), values[1]
        utilization, used, total, temperature, power = map(number, values[2:])
        if utilization is None or used is None or total is None:
            problems.append(f"GPU {index} ({name}) reports no utilization or memory (MIG mode?)")
            continue
        gpus.append(GpuReading(index, name, utilization, used, total, temperature, power))
    note = "; ".join(problems) or (None if gpus else "nvidia-smi lists no GPU")
    return Sample(tuple(gpus), strip_controls(note)[:NOTE_CHARS] if note else None)


async def read_gpus(argv: Sequence[str] = QUERY, timeout_s: float = SMI_TIMEOUT_S) -> Sample:
    """Ask nvidia-smi once, without blocking the event loop; a machine without it gets a final note."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
    except FileNotFoundError:
        return Sample((), NO_GPU, final=True)
    except OSError as error:
        return Sample((), f"nvidia-smi cannot run ({error.strerror})", final=True)
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        return Sample((), f"nvidia-smi did not answer within {timeout_s:g} s")
    text = output.decode("utf-8", "replace")
    if process.returncode != 0:
        first = next((line.strip() for line in text.splitlines() if line.strip()), f"exit status {process.returncode}")
        return Sample((), strip_controls(f"nvidia-smi failed: {first}")[:NOTE_CHARS])
    return parse_query(text)


class GpuTelemetry:
    """The latest GPU sample and those of the last `history_s`; `run()` is the one task that samples."""

    def __init__(
        self,
        argv: Sequence[str] = QUERY,
        interval_s: float = INTERVAL_S,
        history_s: float = HISTORY_S,
        on_sample: Callable[[Sequence[GpuReading]], None] | None = None,
    ) -> None:
        self.argv = tuple(argv)
        self.interval_s = interval_s
        self.history_s = history_s
        self.on_sample = on_sample  # e.g. the Prometheus gauges
        self.latest = Sample((), "GPUs not sampled yet")
        self.history: deque[tuple[float, tuple[GpuReading, ...]]] = deque()

    async def run(self) -> None:
        """Sample every `interval_s` until cancelled, or once only where there is no nvidia-smi."""
        while True:
            sample = await read_gpus(self.argv)
            self.record(time.time(), sample)
            if sample.final:
                log.info("gpu telemetry: %s", sample.note)
                return
            await asyncio.sleep(self.interval_s)

    def record(self, at: float, sample: Sample) -> None:
        self.latest = sample
        self.history.append((at, sample.gpus))
        while self.history and self.history[0][0] < at - self.history_s:
            self.history.popleft()
        if self.on_sample is not None:
            self.on_sample(sample.gpus)

    def status(self) -> tuple[list[dict[str, Any]], str | None]:
        """The GPUs as `/v1/pod/status` shows them (each with its history), and the note."""
        gpus = []
        for gpu in self.latest.gpus:
            history = [
                {"t": at, "utilization_pct": past.utilization_pct, "memory_used_mib": past.memory_used_mib}
                for at, readings in self.history
                for past in readings
                if past.index == gpu.index
            ]
            gpus.append({**asdict(gpu), "history": history})
        return gpus, self.latest.note
