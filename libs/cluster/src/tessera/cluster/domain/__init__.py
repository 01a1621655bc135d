"""The pure domain model of a GPU cluster: nodes, GPUs, topology, allocations and requirements."""

from tessera.cluster.domain.allocation import Allocation, DeviceAssignment, GpuShare, MigSlice
from tessera.cluster.domain.gpu import MILLI_PER_GPU, Gpu, GpuHealth, MigInstance, MigMode, MigStrategy
from tessera.cluster.domain.node import (
    MigConfigState,
    Node,
    Taint,
    TaintEffect,
    Toleration,
    TolerationOperator,
)
from tessera.cluster.domain.requirements import (
    GpuRequest,
    GpuRequestKind,
    Pod,
    PodGroup,
    PodPhase,
    PodRef,
    PodRequirements,
)
from tessera.cluster.domain.topology import InterconnectMatrix, Link

__all__ = [
    "MILLI_PER_GPU",
    "Allocation",
    "DeviceAssignment",
    "Gpu",
    "GpuHealth",
    "GpuRequest",
    "GpuRequestKind",
    "GpuShare",
    "InterconnectMatrix",
    "Link",
    "MigConfigState",
    "MigInstance",
    "MigMode",
    "MigSlice",
    "MigStrategy",
    "Node",
    "Pod",
    "PodGroup",
    "PodPhase",
    "PodRef",
    "PodRequirements",
    "Taint",
    "TaintEffect",
    "Toleration",
    "TolerationOperator",
]
