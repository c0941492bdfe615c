"""`python build.py --arch sm89 --verify-deps`: a GPU image's pip layers resolved, and its engine's native
code checked, without building it (no GPU here, and PyTorch's CUDA index may be out of reach: torch then
comes from the index this machine's pip is configured with, another build of the same version).

What breaks a CUDA image before it ever runs: pins that conflict (pip's own resolver says so, layer by
layer as the Dockerfile installs them), an engine library linked against another CUDA runtime than the
base's (a `libcudart.so.12` on a CUDA 13 base loads nowhere), or one that needs a newer glibc than the
base distribution has. Resolutions and wheels are cached under .cache/verify-deps.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import io
import json
import re
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.units import human_bytes
from space import BuildError
from space.pip_index import configured_index
from space.targets import ROOT, Target, target_packages

CACHE = ROOT / ".cache" / "verify-deps"
# Engine wheels with compiled code, and torch when its CUDA index is reachable (pip's index has another build).
NATIVE = ("vllm", "flashinfer-python", "fastokens")
LEGACY_MANYLINUX = {"2_17": "manylinux2014", "2_12": "manylinux2010", "2_5": "manylinux1"}
CUDART = re.compile(r"libcudart\.so\.(\d+)")
GLIBC = re.compile(r"GLIBC_(\d+)\.(\d+)")
RESOLUTION_TTL_S = 24 * 3600  # an index moves: a cached resolution serves a day at most


@dataclasses.dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    url: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[1].split("#", 1)[0]

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


def verify(target: Target, versions: dict[str, Any], say: Callable[[str], None]) -> None:
    """Resolve the target's layers in the Dockerfile's order, print their sizes, check the engine's
    libraries; BuildError with pip's message or the problems found."""
    if target.kind != "gpu":
        raise BuildError(f"--verify-deps checks the GPU images; {target.name} is built and tested on this machine")
    packages = target_packages(target, versions)
    platform = platform_args(versions["glibc"][target.kind], versions["python"][target.kind])
    index = configured_index()
    torch_index = packages.torch_index if reachable(packages.torch_index) else None
    torch = list(packages.torch) if torch_index else [pin.split("+", 1)[0] for pin in packages.torch]
    if torch_index is None:
        variant = packages.torch[0].split("+", 1)[1]
        say(
            f"{target.name}: PyTorch's index {packages.torch_index} is unreachable from here: torch is resolved "
            f"from pip's index {index} (its own CUDA build), not the image's +{variant} wheels"
        )
    # The later layers come from pip's index; PyTorch's stays an extra one, where the torch pins they carry
    # (installed already in the image) are found.
    the_rest = [index, *([torch_index] if torch_index else [])]
    layers = (
        ("torch", torch, [torch_index or index]),
        ("engine", list(packages.engine), the_rest),
        ("runtime", list(packages.runtime), the_rest),
    )
    pinned: list[str] = []  # the layers' own pins stay as they are; what they pulled in may move, as pip moves it
    installed: dict[str, Wheel] = {}
    for name, requirements, indexes in layers:
        wheels = {w.name: w for w in resolve(pinned + requirements, indexes, platform)}
        added = [w for w in wheels.values() if w.name not in installed or installed[w.name].version != w.version]
        moved = [
            f"{n} {installed[n].version} → {w.version}"
            for n, w in wheels.items()
            if n in installed and installed[n].version != w.version
        ]
        say(
            f"{target.name}: {name} layer: {len(added)} packages, {human_bytes(sum(sizes(added)))} of wheels "
            f"({', '.join(requirements)})" + (f"; it replaces {', '.join(moved)}" if moved else "")
        )
        installed |= wheels
        pinned += requirements
    cuda_major = versions["cuda"]["version"].split(".")[0]
    problems = []
    for name in NATIVE + (("torch",) if torch_index else ()):
        wheel = installed[name]
        if wheel.filename.endswith("-none-any.whl"):  # its tags say so: nothing compiled, nothing to download
            say(f"{target.name}: {wheel.pin}: {Libraries().summary()}")
            continue
        libraries = check_wheel(download(wheel, platform), cuda_major, versions["glibc"][target.kind], target.cuda_arch)
        problems += [f"{wheel.pin}: {problem}" for problem in libraries.problems]
        say(f"{target.name}: {wheel.pin}: {libraries.summary()}")
    if problems:
        raise BuildError(f"{target.name}: the engine layer would not load in the image: " + "; ".join(problems))


def platform_args(glibc: str, python: str) -> list[str]:
    """pip's options for the image's interpreter and platform: CPython `python` on x86_64 Linux, and
    every manylinux tag its glibc satisfies (with the legacy aliases, which pip does not expand)."""
    major, minor = (int(part) for part in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    tags += [f"{LEGACY_MANYLINUX[t]}_x86_64" for t in LEGACY_MANYLINUX if int(t.split("_")[1]) <= minor]
    abi = "cp" + python.replace(".", "")
    args = [
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for tag in tags:
        args += ["--platform", tag]
    return args


def reachable(index: str) -> bool:
    try:
        with urllib.request.urlopen(index.rstrip("/") + "/", timeout=10):
            return True
    except (urllib.error.URLError, OSError):
        return False


def resolve(requirements: list[str], indexes: list[str], platform: list[str]) -> list[Wheel]:
    """What pip would install for `requirements` from `indexes` (the first is the index, the others
    extra ones), for the image's platform: its real resolver, dry-run, with nothing else of this machine's
    configuration (`--isolated`: its constraints or find-links are not the image's); BuildError with pip's
    message on a conflict."""
    args = [
        "--index-url",
        indexes[0],
        *(a for i in indexes[1:] for a in ("--extra-index-url", i)),
        *platform,
        *requirements,
    ]
    cached = CACHE / "resolutions" / (hashlib.sha256("\n".join(args).encode()).hexdigest()[:24] + ".json")
    if not (cached.is_file() and time.time() - cached.stat().st_mtime < RESOLUTION_TTL_S):
        cached.parent.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(cached.with_suffix(".tmp")),
            *args,
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            lines = [line for line in result.stderr.splitlines() if line.strip() and "WARNING" not in line]
            raise BuildError("pip cannot resolve " + " ".join(requirements[-6:]) + ":\n" + "\n".join(lines[-25:]))
        cached.with_suffix(".tmp").rename(cached)
    report = json.loads(cached.read_text())
    return [
        Wheel(item["metadata"]["name"].lower(), item["metadata"]["version"], item["download_info"]["url"])
        for item in report["install"]
    ]


def sizes(wheels: list[Wheel]) -> list[int]:
    """Each wheel's size in bytes, from its index's Content-Length (0 when the index does not say)."""
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        return list(pool.map(wheel_size, (wheel.url.split("#", 1)[0] for wheel in wheels)))


@functools.cache
def wheel_size(url: str) -> int:
    """One HEAD request per wheel and process: every GPU target shares the same layers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30) as response:
            return int(response.headers.get("Content-Length") or 0)
    except (urllib.error.URLError, OSError, ValueError):
        return 0


def download(wheel: Wheel, platform: list[str]) -> Path:
    """The wheel file, from the cache or downloaded once into it."""
    folder = CACHE / "wheels"
    path = folder / wheel.filename
    if not path.is_file():
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--isolated",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "--dest",
            str(folder),
            *platform,
            wheel.url.split("#", 1)[0],
        ]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not path.is_file():
            raise BuildError(f"could not download {wheel.filename}: {result.stderr.strip()[-500:]}")
    return path


@dataclasses.dataclass(frozen=True)
class Library:
    """One ELF library of a wheel: the CUDA runtimes it links, the newest glibc symbol version it needs, and the
    GPU architectures its embedded CUDA code runs on (compute capabilities as 80, 89, 120)."""

    member: str
    cudart: frozenset[str]
    glibc: tuple[int, int]
    sass: frozenset[int]  # machine code, for one major architecture from its minor up
    ptx: frozenset[int]  # portable code the driver compiles for any later architecture

    def runs_on(self, capability: int) -> bool:
        return any(s // 10 == capability // 10 and s <= capability for s in self.sass) or any(
            p <= capability for p in self.ptx
        )


@dataclasses.dataclass
class Libraries:
    """What a wheel's ELF libraries link and carry, and what is wrong with them for one image."""

    count: int = 0
    cudart: set[str] = dataclasses.field(default_factory=set)
    glibc: tuple[int, int] = (0, 0)
    kernels: set[int] = dataclasses.field(default_factory=set)
    problems: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        if not self.count:
            return "no compiled library (pure Python; kernels are compiled at run time)"
        links = f"links {', '.join(sorted(self.cudart))}" if self.cudart else "links no CUDA runtime"
        kernels = f", kernels for {', '.join(f'sm{k}' for k in sorted(self.kernels))}" if self.kernels else ""
        verdict = "; ".join(self.problems) or "ok"
        return (
            f"{self.count} {'library' if self.count == 1 else 'libraries'}, {links}{kernels}, "
            f"needs glibc {self.glibc[0]}.{self.glibc[1]}: {verdict}"
        )


def check_wheel(path: Path, cuda_major: str, glibc: str, cuda_arch: str | None = None) -> Libraries:
    """Judge the wheel's libraries for an image: a `libcudart.so.N` other than the base's CUDA major, a GLIBC_x.y
    above the base's glibc, or (given the image's `cuda_arch`) a core library with no code for that GPU, is a
    problem (one line each, naming the first library concerned)."""
    found = Libraries()
    base = tuple(int(part) for part in glibc.split("."))
    wrong_cuda: dict[str, list[str]] = {}
    too_new: list[str] = []
    libraries = read_libraries(path)
    for library in libraries:
        found.count += 1
        found.cudart |= library.cudart
        found.kernels |= library.sass
        found.glibc = max(found.glibc, library.glibc)
        for linked in library.cudart:
            if CUDART.fullmatch(linked)[1] != cuda_major:  # type: ignore[index]  # read_libraries matched it
                wrong_cuda.setdefault(linked, []).append(library.member)
        if library.glibc > base:
            too_new.append(library.member)
    for linked, members in wrong_cuda.items():
        found.problems.append(
            f"{count(members, 'library', 'libraries')} link {linked} ({members[0]}…), but the base has CUDA {cuda_major}"
        )
    if too_new:
        found.problems.append(
            f"{count(too_new, 'library needs', 'libraries need')} up to GLIBC_{found.glibc[0]}."
            f"{found.glibc[1]} ({too_new[0]}…), but the base has glibc {glibc}"
        )
    compiled = [library for library in libraries if library.sass or library.ptx]
    if cuda_arch and compiled:
        # The library built for the most architectures holds the engine's own kernels (vLLM's `_C`); the
        # others are per-architecture extras (FlashAttention 3 on Hopper, FlashMLA, …) the engine picks between.
        core = max(compiled, key=lambda library: len(library.sass | library.ptx))
        capability = int(cuda_arch.replace(".", "").rstrip("af"))
        if not core.runs_on(capability):
            has = ", ".join(f"sm{k}" for k in sorted(core.sass)) or "none"
            found.problems.append(f"{core.member} has no kernels for sm{capability} (it has {has})")
    return found


@functools.cache
def read_libraries(path: Path) -> tuple[Library, ...]:
    """Every ELF library in the wheel, read once per process: the six GPU targets share the engine's wheels."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    found = []
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if not re.search(r"\.so(\.\d+)*$", member):
                continue
            data = archive.read(member)
            try:
                elf = ELFFile(io.BytesIO(data))
            except ELFError:
                continue
            dynamic = elf.get_section_by_name(".dynamic")
            needed = dynamic.iter_tags("DT_NEEDED") if isinstance(dynamic, DynamicSection) else ()
            # pyelftools sets a DT_NEEDED tag's `needed` (the library's name) by setattr: its types miss it.
            cudart = frozenset(tag.needed for tag in needed if CUDART.fullmatch(tag.needed))  # type: ignore[attr-defined]
            requirements = elf.get_section_by_name(".gnu.version_r")
            versions = requirements.iter_versions() if isinstance(requirements, GNUVerNeedSection) else ()
            names = [aux.name for _, auxes in versions for aux in auxes]
            newest = max(((int(m[1]), int(m[2])) for m in map(GLIBC.fullmatch, names) if m), default=(0, 0))
            sass, ptx = fatbin_architectures(data)
            found.append(Library(member, cudart, newest, sass, ptx))
    return tuple(found)


# A CUDA fat binary: a header (magic, version, header size, payload size), then entries, each with a header
# whose `kind` is 1 for PTX and 2 for machine code, and whose `arch` is the compute capability (80, 89, 120).
FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
FATBIN_HEADER = struct.Struct("<IHHQ")
FATBIN_ENTRY = struct.Struct("<HHIQ12xI")  # kind, _, header size, payload size, 12 bytes, arch


def fatbin_architectures(data: bytes) -> tuple[frozenset[int], frozenset[int]]:
    """The compute capabilities of the machine code and of the PTX embedded in a library (what `cuobjdump
    --list-elf` and `--list-ptx` list), read from its fat binaries' entry headers."""
    sass: set[int] = set()
    ptx: set[int] = set()
    at = data.find(FATBIN_MAGIC)
    while at != -1 and at + FATBIN_HEADER.size <= len(data):
        _, _, header_size, payload = FATBIN_HEADER.unpack_from(data, at)
        entry, end = at + header_size, min(at + header_size + payload, len(data))
        while entry + FATBIN_ENTRY.size <= end:
            kind, _, entry_size, size, arch = FATBIN_ENTRY.unpack_from(data, entry)
            if kind not in (1, 2) or entry_size < FATBIN_ENTRY.size:
                break
            (ptx if kind == 1 else sass).add(arch)
            entry += entry_size + size
        at = data.find(FATBIN_MAGIC, max(end, at + 4))
    return frozenset(sass), frozenset(ptx)


def count(items: list[str], one: str, many: str) -> str:
    return f"1 {one}" if len(items) == 1 else f"{len(items)} {many}"
