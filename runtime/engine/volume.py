"""Where the pod keeps what is slow to make: weights and compile caches, on the pod's volume when it has one.

A RunPod pod's volume (`/workspace` by default) survives a restart and a stop; its container disk does
not survive a stop. The seeds paid for every fresh disk: 135 GB of weights again (~25 min for Flash-Next)
and a cold compile (71 s + 65 s of warm-up, against 7 s + 2 s warm).
"""

from __future__ import annotations

import os
from pathlib import Path

from runtime.settings import Settings

MOUNTINFO = Path("/proc/self/mountinfo")
CACHE_ON_VOLUME = "vllm-pod-cache"
CACHE_MODE = 0o750  # the pod's user (and group) only: a shared volume holds other people's folders too


def mount_points(mountinfo: str) -> set[str]:
    """The mount points listed in /proc/self/mountinfo's text (its 5th field, with `\\040` for a space)."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(fields[4].encode().decode("unicode_escape"))
    return points


def is_mount_point(path: str, mountinfo: str | None = None) -> bool:
    """Whether `path` is mounted on its own (a volume, a bind mount): `os.path.ismount` misses a bind
    mount from the same filesystem, which is how Docker mounts a host folder."""
    text = MOUNTINFO.read_text() if mountinfo is None else mountinfo
    return os.path.normpath(path) in mount_points(text)


def cache_root(settings: Settings, mountinfo: str | None = None) -> Path:
    """VL_CACHE_DIR, else a folder on the volume when VL_VOLUME is mounted, else one on the container disk."""
    if settings.cache_dir:
        return Path(settings.cache_dir)
    if is_mount_point(settings.volume, mountinfo):
        return Path(settings.volume) / CACHE_ON_VOLUME
    return Path(settings.state_dir) / "cache"


def hub_cache(root: Path) -> Path:
    """The huggingface_hub cache (`models--owner--name/…`) under the cache root."""
    return root / "huggingface" / "hub"


def cache_env(root: Path) -> dict[str, str]:
    """The variables that send every cache vLLM and its libraries write to a folder under `root`."""
    return {
        "HF_HUB_CACHE": str(hub_cache(root)),
        "HF_XET_CACHE": str(root / "huggingface" / "xet"),
        "VLLM_CACHE_ROOT": str(root / "vllm"),  # torch.compile artifacts: the 71 s cold compile
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torchinductor"),
        "TRITON_CACHE_DIR": str(root / "triton"),
        "FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"),  # FlashInfer's JIT kernels (it appends .cache/)
        "TVM_FFI_CACHE_DIR": str(root / "tvm-ffi"),  # FlashInfer's JIT bindings
        "TORCH_EXTENSIONS_DIR": str(root / "torch_extensions"),
        "CUDA_CACHE_PATH": str(root / "nvidia"),  # the driver's PTX JIT cache
    }


def make_cache_dirs(root: Path) -> None:
    """Create the cache root and its folders (owner and group only), keeping what is already there."""
    for folder in (root, *map(Path, cache_env(root).values())):
        folder.mkdir(mode=CACHE_MODE, parents=True, exist_ok=True)
    root.chmod(CACHE_MODE)
