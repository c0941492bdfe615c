"""The host's NVIDIA driver against the image's CUDA: say what both are, gate CUDA forward compatibility.

RunPod places a pod on a 12.4, 12.8 or 13.0 host at random, and a CUDA 13 torch dies on a 12.8 driver
("The NVIDIA driver on your system is too old"). The compat library (/usr/local/cuda/compat) bridges
that gap only on data-center GPUs (elsewhere CUDA answers error 804) and must never shadow a newer
host driver (error 803): so it is enabled per start, for the engine's environment only, or the start
stops with one line that says what the host has, what the image needs, and the fix. A sick host stops it too: a GPU the driver or CUDA
lost, one that fails a CUDA probe, one whose driver asks for a reset (runtime.gpuprobe, asked by the pod only).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.gpuprobe import examine
from runtime.image import read_image_facts
from runtime.settings import Settings

log = logging.getLogger(__name__)

PROC_VERSION = Path("/proc/driver/nvidia/version")
NVIDIA_SMI = ("nvidia-smi", "-q")
# `-q` names an architecture ("Ampere": 8.0 and 8.6 alike); this asks each GPU's compute capability (driver >= 510).
CAPABILITIES = ("nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader")
COMPAT_DIR = Path("/usr/local/cuda/compat")
SICK_HOST = "this host is sick: recreate the pod (python -m runtime pod replace POD: a new pod lands elsewhere)"

# The first Linux driver of each CUDA release (NVIDIA's release notes): a driver runs every CUDA up to
# the newest one whose minimum it meets. Used when nvidia-smi cannot say, and to name the fix.
CUDA_MIN_DRIVER: tuple[tuple[str, str], ...] = (
    ("11.8", "520.61.05"),
    ("12.0", "525.60.13"),
    ("12.1", "530.30.02"),
    ("12.2", "535.54.03"),
    ("12.3", "545.23.06"),
    ("12.4", "550.54.14"),
    ("12.5", "555.42.02"),
    ("12.6", "560.28.03"),
    ("12.8", "570.26"),
    ("12.9", "575.51.03"),
    ("13.0", "580.65.06"),
    ("13.1", "590.44.01"),
)
# Forward compatibility is for data-center GPUs (and a few server SKUs): A40, A100, H100, L40S, T4, …
DATA_CENTER = re.compile(r"^(?:NVIDIA |Tesla )*(?:[ABHLTVPK]\d{1,3}[A-Z]?|G[HB]\d{3})\b|Server Edition|^Tesla ")


class GpuError(RuntimeError):
    """The host cannot run the image; `str()` is one line: what the host has, what it needs, the fix."""


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


@dataclass(frozen=True)
class HostGpu:
    """What the host offers: its driver (None: no NVIDIA driver), the newest CUDA it runs, its GPUs."""

    driver: str | None
    cuda: str | None = None
    gpus: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()  # each GPU's compute capability ("8.9"), where nvidia-smi says


@dataclass(frozen=True)
class GpuReport:
    """The verdict for this start: which accelerator, and the compat library when it is needed."""

    host: HostGpu
    image_cuda: str | None
    compat: Path | None = None  # the compat directory the engine must load, when forward compatibility is on
    compat_driver: str | None = None

    @property
    def accelerator(self) -> str:
        return "cuda" if self.host.driver else "cpu"

    def engine_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The engine's LD_LIBRARY_PATH when forward compatibility is on (never set globally)."""
        if not self.compat:
            return {}
        paths = [str(self.compat), *filter(None, environ.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
        return {"LD_LIBRARY_PATH": os.pathsep.join(dict.fromkeys(paths))}

    def summary(self) -> str:
        if not self.host.driver:
            return "no NVIDIA driver on this machine: CPU only"
        gpus = ", ".join(f"{n}x {name}" for name, n in _counted(self.host.gpus)) or "GPU model unknown"
        line = f"{gpus}; host driver {self.host.driver} (CUDA {self.host.cuda or '?'}); image CUDA {self.image_cuda or '?'}"
        if self.compat:
            return f"{line}; CUDA forward compatibility on ({self.compat}, libcuda {self.compat_driver})"
        return f"{line}; native driver"


def _counted(names: Sequence[str]) -> list[tuple[str, int]]:
    return [(name, names.count(name)) for name in dict.fromkeys(names)]


def parse_proc_version(text: str) -> str | None:
    """The driver version in /proc/driver/nvidia/version (proprietary or open kernel module)."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else None


def parse_nvidia_smi(text: str) -> HostGpu:
    """Driver, CUDA version and product names from `nvidia-smi -q`."""
    fields = re.findall(r"^\s*(Driver Version|CUDA Version|Product Name)\s*:\s*(.+?)\s*$", text, re.MULTILINE)
    first = {key: value for key, value in reversed(fields)}
    names = tuple(value for key, value in fields if key == "Product Name")
    return HostGpu(first.get("Driver Version"), first.get("CUDA Version"), names)


def cuda_for_driver(driver: str) -> str | None:
    """The newest CUDA release whose minimum driver `driver` meets."""
    runs = [cuda for cuda, minimum in CUDA_MIN_DRIVER if version_key(driver) >= version_key(minimum)]
    return runs[-1] if runs else None


def read_host(
    proc_version: Path = PROC_VERSION,
    nvidia_smi: Sequence[str] = NVIDIA_SMI,
    capabilities: Sequence[str] = CAPABILITIES,
) -> HostGpu:
    """The host as the container sees it: the kernel module's version, then nvidia-smi for the rest."""
    try:
        driver = parse_proc_version(proc_version.read_text())
    except OSError:
        driver = None
    smi = parse_nvidia_smi(run_quietly(nvidia_smi))
    driver = driver or smi.driver
    if not driver:
        return HostGpu(None)
    found = tuple(
        line.strip() for line in run_quietly(capabilities).splitlines() if re.fullmatch(r"\d+\.\d+", line.strip())
    )
    return HostGpu(driver, smi.cuda or cuda_for_driver(driver), smi.gpus, found)


def run_quietly(command: Sequence[str]) -> str:
    """A command's output; empty when it cannot run (no nvidia-smi: a CPU machine, or a broken driver)."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def compat_library(compat_dir: Path) -> str | None:
    """The driver version of the compat libcuda (`libcuda.so.580.65.06` → `580.65.06`), if any."""
    versions = [p.name.removeprefix("libcuda.so.") for p in compat_dir.glob("libcuda.so.*.*")]
    return max(versions, key=version_key, default=None)


def check_architecture(host: HostGpu, image_arch: str | None) -> None:
    """GpuError when a GPU's compute capability is not the one the image compiles its kernels for: FlashInfer's
    and torch's JIT build for the image's architecture only, so an sm89 image on an A100 would fail mid-start."""
    if not image_arch:
        return  # the cpu image, or one that does not say
    for index, capability in enumerate(host.capabilities):
        if capability != image_arch:
            name = host.gpus[index] if index < len(host.gpus) else f"GPU {index}"
            wanted = "sm" + capability.replace(".", "")
            raise GpuError(
                f"{name} has compute capability {capability} but this image compiles its kernels for "
                f"{image_arch} (sm{image_arch.replace('.', '')}): start an image built for {wanted} "
                f"(python build.py --arch {wanted})"
            )


def decide(host: HostGpu, image_cuda: str | None, compat_dir: Path = COMPAT_DIR, mode: str = "auto") -> GpuReport:
    """Native driver, forward compatibility, or GpuError; `mode` is VL_CUDA_COMPAT (auto, on, off)."""
    if not host.driver or not image_cuda:
        return GpuReport(host, image_cuda)  # a CPU machine, or an image that does not say its CUDA
    host_cuda = host.cuda or cuda_for_driver(host.driver) or "0.0"
    if version_key(host_cuda)[0] >= version_key(image_cuda)[0]:
        return GpuReport(host, image_cuda)  # same major release: minor version compatibility suffices
    compat_driver = compat_library(compat_dir)
    refusal = _compat_refusal(host, compat_driver, compat_dir, mode)
    if refusal:
        needs = dict(CUDA_MIN_DRIVER).get(image_cuda)
        raise GpuError(
            f"host driver {host.driver} runs CUDA {host_cuda} but this image needs CUDA {image_cuda}"
            f"{f' (driver >= {needs})' if needs else ''}, and {refusal}: start the pod on a CUDA {image_cuda} "
            f'host (RunPod: "allowedCudaVersions": ["{image_cuda}"])'
        )
    return GpuReport(host, image_cuda, compat_dir, compat_driver)


def _compat_refusal(host: HostGpu, compat_driver: str | None, compat_dir: Path, mode: str) -> str | None:
    """Why forward compatibility cannot bridge the gap, or None when it can."""
    if mode == "off":
        return "VL_CUDA_COMPAT=off forbids forward compatibility"
    if not compat_driver:
        return f"the image has no CUDA compat library in {compat_dir}"
    if version_key(compat_driver) <= version_key(host.driver or ""):
        return f"its compat library ({compat_driver}) is not newer than the host driver"
    unsupported = [name for name in host.gpus if not DATA_CENTER.search(name)]
    if mode == "auto" and (unsupported or not host.gpus):
        which = unsupported[0] if unsupported else "an unidentified GPU"
        return f"{which} cannot use CUDA forward compatibility (data-center GPUs only; error 804)"
    return None


def image_cuda_version(facts: Mapping[str, object] | None, environ: Mapping[str, str]) -> str | None:
    """The image's CUDA as `major.minor`: from its build facts, else the base image's CUDA_VERSION."""
    raw = (facts or {}).get("cuda") or environ.get("CUDA_VERSION")
    return ".".join(map(str, version_key(str(raw))[:2])) if raw else None


def inspect_gpu(
    settings: Settings,
    environ: Mapping[str, str] = os.environ,
    *,
    proc_version: Path = PROC_VERSION,
    nvidia_smi: Sequence[str] = NVIDIA_SMI,
    capabilities: Sequence[str] = CAPABILITIES,
    compat_dir: Path = COMPAT_DIR,
    probe: bool = False,
) -> GpuReport:
    """Reads the host, decides, logs the verdict; raises GpuError when the host cannot run the image. With `probe`
    (the pod, before its engine starts), a host with a driver is probed too and a sick one refused."""
    host = read_host(proc_version, nvidia_smi, capabilities)
    facts = read_image_facts(Path(settings.prebaked_marker)) or {}
    check_architecture(host, facts.get("cuda_arch"))
    report = decide(host, image_cuda_version(facts, environ), compat_dir, settings.cuda_compat)
    log.info("gpu: %s", report.summary())
    if probe and report.accelerator == "cuda":
        check_health(settings, {**environ, **report.engine_env(environ)})
    return report


def check_health(settings: Settings, engine_env: Mapping[str, str]) -> None:
    """The probes in the engine's Python and environment: GpuError naming the evidence when the host is sick; what may
    be wrong but lets it serve (an Xid, a page waiting for a reset) is logged, for a crash to be judged by."""
    health = examine(engine_python(settings), engine_env)
    if health.sick:
        raise GpuError(f"{SICK_HOST}: {health.summary()}")
    log.log(logging.WARNING if health.suspect else logging.INFO, "gpu probes: %s", health.summary())


def engine_python(settings: Settings) -> Path:
    """The engine venv's Python, whose torch probes CUDA as vLLM will use it."""
    return Path(settings.venv) / "bin" / "python"
