"""What pods and pod groups ask for, and the state of a pod as the cluster reports it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from tessera.cluster.domain.affinity import NodeSelectorTerm
from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.gpu import MILLI_PER_GPU
from tessera.cluster.domain.node import Toleration


class GpuRequestKind(StrEnum):
    NONE = "none"
    WHOLE = "whole"
    FRACTIONAL = "fractional"
    MIG = "mig"


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A pod's GPU demand.

    WHOLE: ``count`` GPUs, each 1000 milli. FRACTIONAL: one GPU share of ``milli`` (< 1000).
    MIG: ``count`` MIG slices of ``mig_profile``. ``allowed_models`` empty means any model.
    """

    kind: GpuRequestKind = GpuRequestKind.NONE
    count: int = 0
    milli: int = 0
    mig_profile: str | None = None
    allowed_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        kind = self.kind
        if kind is GpuRequestKind.NONE and (self.count or self.milli or self.mig_profile):
            raise ValueError("gpu request: kind 'none' must ask for no GPU")
        if kind is GpuRequestKind.WHOLE and (self.count < 1 or self.milli != MILLI_PER_GPU):
            raise ValueError(f"gpu request: whole GPUs need count >= 1 and milli 1000, got {self}")
        if kind is GpuRequestKind.FRACTIONAL and (self.count != 1 or not 0 < self.milli < MILLI_PER_GPU):
            raise ValueError(f"gpu request: a fractional GPU needs count 1 and 0 < milli < 1000, got {self}")
        if kind is GpuRequestKind.MIG and (self.count < 1 or not self.mig_profile):
            raise ValueError(f"gpu request: MIG slices need count >= 1 and a profile, got {self}")

    @classmethod
    def none(cls) -> GpuRequest:
        return cls()

    @classmethod
    def whole(cls, count: int, allowed_models: frozenset[str] = frozenset()) -> GpuRequest:
        return cls(GpuRequestKind.WHOLE, count, MILLI_PER_GPU, None, allowed_models)

    @classmethod
    def fraction(cls, milli: int, allowed_models: frozenset[str] = frozenset()) -> GpuRequest:
        return cls(GpuRequestKind.FRACTIONAL, 1, milli, None, allowed_models)

    @classmethod
    def mig(cls, profile: str, count: int = 1) -> GpuRequest:
        return cls(GpuRequestKind.MIG, count, 0, profile)

    @property
    def total_milli(self) -> int:
        """Milli-GPU demand over whole or fractional GPUs (0 for MIG and none)."""
        if self.kind in (GpuRequestKind.WHOLE, GpuRequestKind.FRACTIONAL):
            return self.count * self.milli
        return 0

    def allows_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models


@dataclass(frozen=True, slots=True)
class PodRequirements:
    """Everything placement needs to know about one pod's demand and constraints."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu: GpuRequest = field(default_factory=GpuRequest)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    priority: int = 0
    #: required node affinity: the nodeSelectorTerms, any of which a node must match
    node_affinity: tuple[NodeSelectorTerm, ...] = ()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0:
            raise ValueError(f"pod.cpu_milli: must be >= 0, got {self.cpu_milli}")
        if self.memory_mib < 0:
            raise ValueError(f"pod.memory_mib: must be >= 0, got {self.memory_mib}")
        object.__setattr__(self, "node_selector", MappingProxyType(dict(self.node_selector)))

    def __hash__(self) -> int:
        return hash((self.cpu_milli, self.memory_mib, self.gpu, self.tolerations, self.priority))


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> PodRef:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name:
            raise ValueError(f"pod ref: expected 'namespace/name', got {text!r}")
        return cls(namespace, name)


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod as the cluster reports it: identity, requirements, where it runs and what it holds.

    ``problem`` is set when the pod's requests could not be read (a malformed annotation, say); its
    requirements are then empty and the scheduler should report the problem rather than place it.
    """

    namespace: str
    name: str
    requirements: PodRequirements = field(default_factory=PodRequirements)
    uid: str = ""
    scheduler_name: str = ""
    node_name: str | None = None
    phase: PodPhase = PodPhase.PENDING
    pod_group: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    assignment: DeviceAssignment | None = None
    resource_version: str | None = None
    deleting: bool = False
    problem: str | None = None
    gated: bool = False
    """The pod has scheduling gates (`spec.schedulingGates`): no scheduler may place it yet."""

    def __post_init__(self) -> None:
        if not self.namespace:
            raise ValueError("pod.namespace: must not be empty")
        if not self.name:
            raise ValueError("pod.name: must not be empty")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "annotations", MappingProxyType(dict(self.annotations)))

    def __hash__(self) -> int:
        return hash((self.namespace, self.name, self.resource_version, self.node_name))

    @property
    def ref(self) -> PodRef:
        return PodRef(self.namespace, self.name)

    @property
    def bound(self) -> bool:
        return bool(self.node_name)

    @property
    def terminated(self) -> bool:
        return self.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)


@dataclass(frozen=True, slots=True)
class PodGroup:
    """A gang (scheduler-plugins PodGroup): no member runs until ``min_member`` of them can."""

    namespace: str
    name: str
    min_member: int
    schedule_timeout_seconds: int | None = None
    phase: str | None = None
    uid: str = ""
    resource_version: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("podgroup.name: must not be empty")
        if self.min_member < 1:
            raise ValueError(f"podgroup.spec.minMember: must be >= 1, got {self.min_member}")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
