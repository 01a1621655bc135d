"""GPUs as the scheduler and the slicer see them: identity, model, memory, health and MIG state."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

MILLI_PER_GPU = 1000


class GpuHealth(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


class MigMode(StrEnum):
    DISABLED = "disabled"
    ENABLED = "enabled"


class MigStrategy(StrEnum):
    """How the NVIDIA device plugin advertises MIG devices (`nvidia.com/mig.strategy`)."""

    NONE = "none"
    SINGLE = "single"
    MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG GPU instance: a profile placed at a start index on the GPU's memory-slice axis."""

    profile: str
    start: int
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU on a node.

    ``model`` is a catalogue model name (see :mod:`tessera.cluster.catalogue`) or, for a GPU the
    catalogue does not know, the product string as reported. ``index`` is the device index on its
    node, which is also the row of the node's interconnect matrix.
    """

    index: int
    uuid: str
    model: str
    memory_mib: int
    health: GpuHealth = GpuHealth.HEALTHY
    mig_mode: MigMode = MigMode.DISABLED
    mig_instances: tuple[MigInstance, ...] = ()
    numa_node: int | None = None

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"gpu.index: must be >= 0, got {self.index}")
        if not self.uuid:
            raise ValueError("gpu.uuid: must not be empty")
        if self.memory_mib < 0:
            raise ValueError(f"gpu.memory_mib: must be >= 0, got {self.memory_mib}")
        if self.mig_instances and self.mig_mode is not MigMode.ENABLED:
            raise ValueError(f"gpu.mig_instances: GPU {self.uuid} has MIG instances but MIG is disabled")

    @property
    def healthy(self) -> bool:
        return self.health is GpuHealth.HEALTHY

    @property
    def mig_enabled(self) -> bool:
        return self.mig_mode is MigMode.ENABLED

    @property
    def mig_profiles(self) -> tuple[str, ...]:
        return tuple(instance.profile for instance in self.mig_instances)
