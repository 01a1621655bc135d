"""Allocations: which pod holds which GPU, how many milli-GPU of it, or which MIG slice."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.cluster.domain.gpu import MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class MigSlice:
    """A MIG slice held by a pod: the profile, where it sits on the GPU, and its MIG UUID if known."""

    profile: str
    start: int
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class GpuShare:
    """A pod's hold on one GPU: ``milli`` of it (1000 = whole), or one MIG slice of it."""

    gpu_uuid: str
    milli: int = MILLI_PER_GPU
    mig: MigSlice | None = None

    def __post_init__(self) -> None:
        if not self.gpu_uuid:
            raise ValueError("gpu share.uuid: must not be empty")
        if not 0 < self.milli <= MILLI_PER_GPU:
            raise ValueError(f"gpu share.milli: must be in 1..1000, got {self.milli}")
        if self.mig is not None and self.milli != MILLI_PER_GPU:
            raise ValueError("gpu share.milli: a MIG slice is held whole (milli 1000)")


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    """The devices a pod was given on its node (written to the pod as an annotation).

    ``pod_uid``: the uid of the pod it was written for, when the writer names it (the scheduler's
    bind does): a copy of the annotation onto another pod does not match that pod's uid."""

    node: str
    shares: tuple[GpuShare, ...]
    pod_uid: str | None = None

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("assignment.node: must not be empty")
        seen: set[tuple[str, int | None]] = set()
        for share in self.shares:
            key = (share.gpu_uuid, share.mig.start if share.mig else None)
            if key in seen:
                raise ValueError(f"assignment.gpus: GPU {share.gpu_uuid} is listed twice")
            seen.add(key)

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(share.gpu_uuid for share in self.shares)

    @property
    def total_milli(self) -> int:
        return sum(share.milli for share in self.shares if share.mig is None)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A pod's assignment keyed by the pod (namespace/name)."""

    namespace: str
    pod: str
    assignment: DeviceAssignment

    @property
    def node(self) -> str:
        return self.assignment.node
