"""GPU models: memory, MIG support, and resolving a reported product string to a catalogue model."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from tessera.cluster.catalogue.mig import (
    A30_MIG,
    A100_40GB_MIG,
    A100_80GB_MIG,
    H100_80GB_MIG,
    H200_141GB_MIG,
    MigGeometry,
)

GIB_MIB = 1024
UNKNOWN_MODEL = "unknown"


class GpuModelName(StrEnum):
    """Stable names of the models the catalogue knows."""

    T4 = "T4"
    A10 = "A10"
    L4 = "L4"
    P100 = "P100"
    V100_16GB = "V100-16GB"
    V100_32GB = "V100-32GB"
    A100_40GB = "A100-40GB"
    A100_80GB = "A100-80GB"
    A30 = "A30"
    H100_80GB = "H100-80GB"
    H200_141GB = "H200-141GB"


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_mib: int
    architecture: str
    mig: MigGeometry | None = None
    known: bool = True

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None


CATALOGUE: dict[str, GpuModel] = {
    model.name: model
    for model in (
        GpuModel(GpuModelName.T4, 16 * GIB_MIB, "Turing"),
        GpuModel(GpuModelName.A10, 24 * GIB_MIB, "Ampere"),
        GpuModel(GpuModelName.L4, 24 * GIB_MIB, "Ada Lovelace"),
        GpuModel(GpuModelName.P100, 16 * GIB_MIB, "Pascal"),
        GpuModel(GpuModelName.V100_16GB, 16 * GIB_MIB, "Volta"),
        GpuModel(GpuModelName.V100_32GB, 32 * GIB_MIB, "Volta"),
        GpuModel(GpuModelName.A100_40GB, 40 * GIB_MIB, "Ampere", A100_40GB_MIG),
        GpuModel(GpuModelName.A100_80GB, 80 * GIB_MIB, "Ampere", A100_80GB_MIG),
        GpuModel(GpuModelName.A30, 24 * GIB_MIB, "Ampere", A30_MIG),
        GpuModel(GpuModelName.H100_80GB, 80 * GIB_MIB, "Hopper", H100_80GB_MIG),
        GpuModel(GpuModelName.H200_141GB, 141 * GIB_MIB, "Hopper", H200_141GB_MIG),
    )
}

# Names used by traces and by people for the same models (the openb trace writes V100M16).
_ALIASES: dict[str, GpuModelName] = {
    "V100M16": GpuModelName.V100_16GB,
    "V100M32": GpuModelName.V100_32GB,
    "V100": GpuModelName.V100_16GB,
    "A100": GpuModelName.A100_40GB,
    "H100": GpuModelName.H100_80GB,
    "H200": GpuModelName.H200_141GB,
}

# Families whose size variant is told apart by memory: (family, variant above the threshold, below).
_BY_MEMORY: dict[str, tuple[int, GpuModelName, GpuModelName]] = {
    "V100": (24 * GIB_MIB, GpuModelName.V100_32GB, GpuModelName.V100_16GB),
    "A100": (60 * GIB_MIB, GpuModelName.A100_80GB, GpuModelName.A100_40GB),
}
_SIMPLE_FAMILIES: dict[str, GpuModelName] = {
    "T4": GpuModelName.T4,
    "A10": GpuModelName.A10,
    "L4": GpuModelName.L4,
    "P100": GpuModelName.P100,
    "A30": GpuModelName.A30,
    "H200": GpuModelName.H200_141GB,
}
_MEMORY_TOKEN = re.compile(r"^(\d+)GB$")
_MIG_SUFFIX = re.compile(r"-MIG-.*$")


def model(name: str) -> GpuModel:
    """The catalogue entry for a model name or alias; an 'unknown' entry for anything else."""
    canonical = normalise_model_name(name)
    if canonical in CATALOGUE:
        return CATALOGUE[canonical]
    return unknown_model(name)


def unknown_model(name: str, memory_mib: int = 0) -> GpuModel:
    """A GPU the catalogue does not know: it keeps its reported name, has no MIG, and the given memory."""
    return GpuModel(name=name or UNKNOWN_MODEL, memory_mib=memory_mib, architecture="unknown", known=False)


def normalise_model_name(name: str) -> str:
    """Map a catalogue name or alias (case-insensitive) to the catalogue name, or return it unchanged."""
    upper = name.strip().upper()
    for known in GpuModelName:
        if known.value.upper() == upper:
            return known.value
    alias = _ALIASES.get(upper)
    return alias.value if alias else name


def resolve_product(product: str, memory_mib: int | None = None) -> GpuModel:
    """Resolve a GPU Feature Discovery product label (``nvidia.com/gpu.product``) to a model.

    Accepts forms such as ``Tesla-T4``, ``NVIDIA-A100-SXM4-80GB``, ``NVIDIA-H100-80GB-HBM3``,
    ``NVIDIA-A100-80GB-PCIe-SHARED`` (time-sliced) and ``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` (MIG
    single strategy). A model the catalogue lacks comes back as an unknown model that keeps the
    product name and the reported memory.
    """
    text = _MIG_SUFFIX.sub("", product.strip()).upper().replace(" ", "-")
    if text.endswith("-SHARED"):
        text = text[: -len("-SHARED")]
    tokens = [t for t in text.split("-") if t and t not in ("NVIDIA", "TESLA", "GEFORCE")]
    if not tokens:
        return unknown_model(product, memory_mib or 0)
    direct = normalise_model_name(tokens[0])
    family = tokens[0]
    if family in _BY_MEMORY:
        threshold, big, small = _BY_MEMORY[family]
        stated = _stated_memory_mib(tokens)
        size = stated if stated is not None else memory_mib
        return CATALOGUE[big if size is not None and size > threshold else small]
    if family == "H100":
        stated = _stated_memory_mib(tokens)
        if stated not in (None, 80 * GIB_MIB) or "NVL" in tokens:
            return unknown_model(product, memory_mib or stated or 0)
        return CATALOGUE[GpuModelName.H100_80GB]
    if family in _SIMPLE_FAMILIES:
        return CATALOGUE[_SIMPLE_FAMILIES[family]]
    if direct in CATALOGUE:
        return CATALOGUE[direct]
    return unknown_model(product, memory_mib or 0)


def _stated_memory_mib(tokens: list[str]) -> int | None:
    for token in tokens:
        match = _MEMORY_TOKEN.match(token)
        if match:
            return int(match[1]) * GIB_MIB
    return None
