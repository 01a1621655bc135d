"""Nodes: labels, taints, allocatable CPU and memory, GPUs, how they are wired and how they are sliced."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from tessera.cluster.domain.gpu import Gpu, MigStrategy
from tessera.cluster.domain.topology import InterconnectMatrix


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class MigConfigState(StrEnum):
    """The MIG manager's progress on a requested layout (`nvidia.com/mig.config.state`).

    `rebooting` is set by NVIDIA's mig-manager while it reboots the node to apply a layout (on GPUs
    that need it); the layout is not in place yet, as with `pending`."""

    PENDING = "pending"
    REBOOTING = "rebooting"
    SUCCESS = "success"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    effect: TaintEffect
    value: str = ""


class TolerationOperator(StrEnum):
    EQUAL = "Equal"
    EXISTS = "Exists"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = ""
    effect: TaintEffect | None = None

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes semantics: an empty key with Exists matches every taint; no effect matches all."""
        if self.effect is not None and self.effect is not taint.effect:
            return False
        if not self.key:
            return self.operator is TolerationOperator.EXISTS
        if self.key != taint.key:
            return False
        return self.operator is TolerationOperator.EXISTS or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Node:
    """A node as scheduling sees it.

    ``extended_allocatable`` holds the countable extended resources the kubelet reports, such as
    ``nvidia.com/gpu`` or ``nvidia.com/mig-1g.10gb``; ``gpu_replicas`` is the time-slicing replica
    count the device plugin applies to each GPU (1 when GPUs are not shared).
    """

    name: str
    allocatable_cpu_milli: int
    allocatable_memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True
    interconnect: InterconnectMatrix | None = None
    mig_strategy: MigStrategy = MigStrategy.NONE
    mig_config: str | None = None
    mig_config_state: MigConfigState | None = None
    gpu_replicas: int = 1
    extended_allocatable: Mapping[str, int] = field(default_factory=dict)
    resource_version: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("node.name: must not be empty")
        if self.allocatable_cpu_milli < 0:
            raise ValueError(f"node.allocatable_cpu_milli: must be >= 0, got {self.allocatable_cpu_milli}")
        if self.allocatable_memory_mib < 0:
            raise ValueError(f"node.allocatable_memory_mib: must be >= 0, got {self.allocatable_memory_mib}")
        if self.gpu_replicas < 1:
            raise ValueError(f"node.gpu_replicas: must be >= 1, got {self.gpu_replicas}")
        indexes = [gpu.index for gpu in self.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError(f"node.gpus: duplicate GPU index on node {self.name}: {sorted(indexes)}")
        uuids = [gpu.uuid for gpu in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"node.gpus: duplicate GPU UUID on node {self.name}")
        if self.interconnect is not None and self.gpus and self.interconnect.size < max(indexes) + 1:
            raise ValueError(
                f"node.interconnect: {self.interconnect.size}x{self.interconnect.size} matrix is too small "
                f"for GPU index {max(indexes)} on node {self.name}"
            )
        # Freeze the mappings so a shared snapshot cannot be changed under a reader's feet.
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "annotations", MappingProxyType(dict(self.annotations)))
        object.__setattr__(self, "extended_allocatable", MappingProxyType(dict(self.extended_allocatable)))

    def __hash__(self) -> int:
        # Equal nodes share name and version; the read-only mappings themselves are not hashable.
        return hash((self.name, self.resource_version, self.gpus))

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def healthy_gpus(self) -> tuple[Gpu, ...]:
        return tuple(gpu for gpu in self.gpus if gpu.healthy)

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        return next((gpu for gpu in self.gpus if gpu.uuid == uuid), None)

    def gpu_by_index(self, index: int) -> Gpu | None:
        return next((gpu for gpu in self.gpus if gpu.index == index), None)

    def tolerated_by(self, tolerations: tuple[Toleration, ...]) -> bool:
        """True when every NoSchedule/NoExecute taint is tolerated (PreferNoSchedule never blocks)."""
        return all(
            taint.effect is TaintEffect.PREFER_NO_SCHEDULE or any(t.tolerates(taint) for t in tolerations)
            for taint in self.taints
        )

    def matches_selector(self, selector: Mapping[str, str]) -> bool:
        return all(self.labels.get(key) == value for key, value in selector.items())
