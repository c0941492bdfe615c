"""Stand-ins for a GPU host, for the probes in runtime.gpuprobe to run as they run on a pod: an `nvidia-smi` that
prints recorded outputs (tests/data/gpu), a `dmesg` that prints a recorded kernel log, and an engine Python whose
`torch` is a stand-in for CUDA alone (the probe's own code runs, in a real interpreter, as a subprocess)."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

DATA = Path(__file__).parents[1] / "data" / "gpu"
CAT = shutil.which("cat") or "/bin/cat"  # the scripts run with whatever PATH a test gives


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def fake_nvidia_smi(
    bin_dir: Path, listing: str | None, query: str | None, kernel_log: str | None = None, hang: bool = False
) -> Path:
    """`nvidia-smi -L` and `-q` printing tests/data/gpu's files (None: a driver that answers nothing), `dmesg` printing
    `kernel_log` (None: a container that may not read it); `hang`: an nvidia-smi that never answers. Returns the
    folder to put first on PATH."""
    cat = lambda name: f"{CAT} {shlex.quote(str(DATA / name))}" if name else "exit 9"  # noqa: E731
    hung = f"exec {shutil.which('sleep')} 600\n" if hang else ""
    _script(
        bin_dir / "nvidia-smi",
        f'{hung}case "$1" in\n  -L) {cat(listing)} ;;\n  -q) {cat(query)} ;;\n  *) exit 2 ;;\nesac',
    )
    denied = "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1"
    _script(bin_dir / "dmesg", cat(kernel_log) if kernel_log else denied)
    return bin_dir


def fake_engine_python(
    venv: Path, devices: int, faults: dict[int, str] | None = None, torch: bool = True, init_error: str = ""
) -> Path:
    """The engine venv's `bin/python`: this interpreter, with a stand-in `torch` first on its path. CUDA counts
    `devices`; `faults` maps a device to what it does: `hang`, `wrong` (a matmul's wrong result) or an error
    message its first synchronisation raises. `torch=False`: a venv without torch; `init_error`: what counting the
    devices raises (`CUDA driver error: unknown error` on a wedged driver)."""
    shim = venv / "faketorch" / "torch"
    shim.mkdir(parents=True, exist_ok=True)
    if not torch:
        (shim / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    else:
        (shim / "__init__.py").write_text(
            FAKE_TORCH.format(devices=devices, faults=dict(faults or {}), init_error=init_error)
        )
    python = venv / "bin" / "python"
    env = f"PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={shlex.quote(str(shim.parent))}"  # a rewritten torch is read anew
    return _script(python, f'{env} exec {shlex.quote(sys.executable)} "$@"')


FAKE_TORCH = '''\
"""A stand-in for torch's CUDA: only what runtime.gpuprobe.CUDA_PROBE calls."""
import time

_DEVICES = {devices}
_FAULTS = {faults!r}
_INIT_ERROR = {init_error!r}


class cuda:
    @staticmethod
    def device_count():
        if _INIT_ERROR:
            raise RuntimeError(_INIT_ERROR)
        return _DEVICES


class _Value:
    def __init__(self, device, value):
        self.device, self.value = device, value

    def item(self):  # a synchronisation: where an asynchronous CUDA fault surfaces
        fault = _FAULTS.get(self.device)
        if fault == "hang":
            time.sleep(600)
        if fault == "wrong":
            return self.value - 1.0
        if fault:
            raise RuntimeError(fault)
        return self.value


class _Matrix:
    def __init__(self, device, size, fill):
        self.device, self.size, self.fill = device, size, fill

    def __matmul__(self, other):
        return _Matrix(self.device, self.size, self.fill * other.fill * self.size)

    def sum(self):
        return _Value(self.device, self.fill * self.size * self.size)


def ones(shape, device):
    index = int(device.split(":")[1])
    if index >= _DEVICES:
        raise RuntimeError("CUDA error: invalid device ordinal")
    return _Matrix(index, shape[0], 1.0)
'''
