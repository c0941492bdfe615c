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
        libraries = check_wheel(download(wheel, platform), cuda_major, versions["glibc"][target.kind])
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


@dataclasses.dataclass
class Libraries:
    """What a wheel's ELF libraries link: the CUDA runtimes, the newest glibc symbol version, and what is wrong."""

    count: int = 0
    cudart: set[str] = dataclasses.field(default_factory=set)
    glibc: tuple[int, int] = (0, 0)
    problems: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        if not self.count:
            return "no compiled library (pure Python; kernels are compiled at run time)"
        links = f"links {', '.join(sorted(self.cudart))}" if self.cudart else "links no CUDA runtime"
        verdict = "; ".join(self.problems) or "ok"
        return f"{self.count} {'library' if self.count == 1 else 'libraries'}, {links}, needs glibc {self.glibc[0]}.{self.glibc[1]}: {verdict}"


def check_wheel(path: Path, cuda_major: str, glibc: str) -> Libraries:
    """Read every ELF library in the wheel: a `libcudart.so.N` other than the base's CUDA major, or a
    GLIBC_x.y above the base's glibc, is a problem (one line each, naming the first library concerned)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    found = Libraries()
    base = tuple(int(part) for part in glibc.split("."))
    wrong_cuda: dict[str, list[str]] = {}
    too_new: list[str] = []
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if not re.search(r"\.so(\.\d+)*$", member):
                continue
            try:
                elf = ELFFile(io.BytesIO(archive.read(member)))
            except ELFError:
                continue
            found.count += 1
            dynamic = elf.get_section_by_name(".dynamic")
            needed = dynamic.iter_tags("DT_NEEDED") if isinstance(dynamic, DynamicSection) else ()
            # pyelftools sets a DT_NEEDED tag's `needed` (the library's name) by setattr: its types miss it.
            for library in [tag.needed for tag in needed]:  # type: ignore[attr-defined]
                if match := CUDART.fullmatch(library):
                    found.cudart.add(library)
                    if match[1] != cuda_major:
                        wrong_cuda.setdefault(library, []).append(member)
            requirements = elf.get_section_by_name(".gnu.version_r")
            versions = requirements.iter_versions() if isinstance(requirements, GNUVerNeedSection) else ()
            names = [aux.name for _, auxes in versions for aux in auxes]
            newest = max(((int(m[1]), int(m[2])) for m in map(GLIBC.fullmatch, names) if m), default=(0, 0))
            found.glibc = max(found.glibc, newest)
            if newest > base:
                too_new.append(member)
    for library, members in wrong_cuda.items():
        found.problems.append(
            f"{count(members, 'library', 'libraries')} link {library} ({members[0]}…), "
            f"but the base has CUDA {cuda_major}"
        )
    if too_new:
        found.problems.append(
            f"{count(too_new, 'library needs', 'libraries need')} up to GLIBC_{found.glibc[0]}."
            f"{found.glibc[1]} ({too_new[0]}…), but the base has glibc {glibc}"
        )
    return found


def count(items: list[str], one: str, many: str) -> str:
    return f"1 {one}" if len(items) == 1 else f"{len(items)} {many}"
