"""The GPUs people rent on RunPod, as `runtime plan` and `pod up` size them: each card's RunPod id, its memory as
nvidia-smi counts it, its architecture, and the image of ours that serves that architecture (if any)."""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 2**20
GIB = 2**30
# The architectures our images are built for (docker/targets.toml): any other is refused, never tried.
IMAGES = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm120")  # each image is named after its architecture
OURS = ", ".join(IMAGES)


@dataclass(frozen=True)
class Card:
    id: str  # RunPod's GPU type id (what `pod up --gpu` takes)
    name: str
    memory_mib: int  # nvidia-smi's total: a "48 GB" card holds 49,140 MiB, an "80 GB" A100 81,920
    arch: str  # CUDA compute capability, as our targets name it

    @property
    def memory_gib(self) -> float:
        return self.memory_mib * MIB / GIB

    @property
    def image(self) -> str | None:
        return self.arch if self.arch in IMAGES else None

    def answers_to(self, asked: str) -> bool:
        """Whether `asked` names this card: RunPod's id or the name the tables show ("RTX 4090"), in any case,
        since a user copies either from RunPod's console or from `plan`'s table."""
        return asked.strip().casefold() in (self.id.casefold(), self.name.casefold())


# Without a RunPod key: the notes' cards and the common ones (prices unknown; RunPod's catalogue has them).
CARDS = (
    Card("NVIDIA GeForce RTX 4090", "RTX 4090", 24_564, "sm89"),
    Card("NVIDIA L40S", "L40S", 46_068, "sm89"),
    Card("NVIDIA L40", "L40", 46_068, "sm89"),
    Card("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", 49_140, "sm89"),
    Card("NVIDIA GeForce RTX 5090", "RTX 5090", 32_607, "sm120"),
    Card("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000", 97_887, "sm120"),
    Card("NVIDIA GeForce RTX 3090", "RTX 3090", 24_576, "sm86"),
    Card("NVIDIA A40", "A40", 46_068, "sm86"),
    Card("NVIDIA RTX A6000", "RTX A6000", 49_140, "sm86"),
    Card("NVIDIA A100 80GB PCIe", "A100 PCIe 80 GB", 81_920, "sm80"),
    Card("NVIDIA A100-SXM4-80GB", "A100 SXM 80 GB", 81_920, "sm80"),
    Card("NVIDIA H100 80GB HBM3", "H100 SXM", 81_559, "sm90"),
    Card("NVIDIA H100 NVL", "H100 NVL", 95_830, "sm90"),
    Card("NVIDIA H200", "H200", 143_771, "sm90"),
    Card("NVIDIA B200", "B200", 183_359, "sm100"),
)
BY_ID = {card.id: card for card in CARDS}
# RunPod's catalogue gives no RAM per GPU; it gives a pod 125-283 GB per H100/H200/B200 (issue 46's survey). `plan`
# sizes VL_KV_OFFLOAD=auto for those cards at the low end, 125 GB (10^9 bytes) a GPU; others it does not guess.
RUNPOD_RAM_GB_PER_GPU = 125
RAM_KNOWN = re.compile(r"\b(?:H100|H200|B200)\b")  # the names the tables show ("H100 SXM"), not GH200


def runpod_ram_gib(card: Card, gpus: int = 1) -> float | None:
    """The RAM, in GiB, RunPod gives a pod of `gpus` of `card` at least, when the survey knows the card."""
    return RUNPOD_RAM_GB_PER_GPU * 10**9 * gpus / GIB if RAM_KNOWN.search(card.name) else None


# A target's GPUs, the best buy first (the field notes: the RTX 6000 Ada's 48 GB hold the 30B recipes).
DEFAULT_GPUS = {
    "sm80": ["NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"],
    "sm86": ["NVIDIA RTX A6000", "NVIDIA A40", "NVIDIA GeForce RTX 3090"],
    "sm89": ["NVIDIA RTX 6000 Ada Generation", "NVIDIA L40S", "NVIDIA L40", "NVIDIA GeForce RTX 4090"],
    "sm90": ["NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", "NVIDIA H200"],
    "sm100": ["NVIDIA B200"],
    "sm120": ["NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA GeForce RTX 5090"],
}
# A card RunPod lists that the table lacks: its architecture from its name, its memory from the catalogue's GB.
FAMILIES = (
    ("RTX PRO", "sm120"),
    ("5090", "sm120"),
    ("5080", "sm120"),
    ("B200", "sm100"),
    ("B300", "sm100"),
    ("H100", "sm90"),
    ("H200", "sm90"),
    ("GH200", "sm90"),
    ("A100", "sm80"),
    ("A30", "sm80"),
    ("Ada", "sm89"),
    ("L40", "sm89"),
    ("L4", "sm89"),
    ("4090", "sm89"),
    ("4080", "sm89"),
    ("4070", "sm89"),
    ("A40", "sm86"),
    ("A6000", "sm86"),
    ("A5000", "sm86"),
    ("A4500", "sm86"),
    ("A4000", "sm86"),
    ("3090", "sm86"),
    ("3080", "sm86"),
    ("3070", "sm86"),
)


def card_of(gpu_id: str, memory_gb: float | None = None, name: str = "") -> Card:
    """The card `gpu_id`: from the table, else from RunPod's catalogue entry (its GB as nvidia-smi's GiB, a little
    less than it says: 48 GB cards show 47.99 GiB); an unknown family's architecture is "unknown"."""
    if gpu_id in BY_ID:
        return BY_ID[gpu_id]
    arch = next((arch for family, arch in FAMILIES if family in gpu_id), "unknown")
    return Card(
        gpu_id, name or gpu_id.removeprefix("NVIDIA ").removeprefix("GeForce "), round((memory_gb or 0) * 1023.5), arch
    )
