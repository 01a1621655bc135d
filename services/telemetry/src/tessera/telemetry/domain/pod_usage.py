"""Per-pod GPU use, as published for slicing: one batch per node per sampling round. Pure.

Attribution already splits each reading among the containers that hold the GPU (`attribution`).
Slicing packs pods onto time-sliced GPUs by that use, so each round every node's shares are summed
per pod and GPU (a pod's containers together; the container is named when one alone held it) and sent as one `pod_gpu_usage` batch: the message
count grows with nodes, not with pods. Use no holder accounts for (`unknown`) and bare processes
(`pid/<n>`, NVML without Kubernetes) are left out: slicing plans for pods only. So is a reading
without a utilisation (dcgm-exporter's NaN): its use is unknown, not 0%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tessera.telemetry.domain.attributed import AttributedGpu
from tessera.telemetry.domain.attribution import MILLI_PER_GPU, SPLIT_REQUESTED, UNKNOWN


@dataclass
class PodGpuUse:
    """One pod's part of one GPU in one round."""

    namespace: str
    pod: str
    gpu_uuid: str
    gpu_index: int
    utilization_pct: float = 0.0
    allocated_milli: int = 0
    split: str = SPLIT_REQUESTED
    #: the container that held the GPU when one alone did and the holder names it; else None
    container: str | None = None
    _containers: set[str] = field(default_factory=set, repr=False, compare=False)


@dataclass
class NodeBatch:
    node: str
    pods: list[PodGpuUse] = field(default_factory=list)


def node_batches(gpus: Iterable[AttributedGpu]) -> list[NodeBatch]:
    """The round's shares per node, summed per (pod, GPU); nodes and pods in name order."""
    by_node: dict[str, dict[tuple[str, str, str], PodGpuUse]] = {}
    for gpu in gpus:
        reading = gpu.reading
        if reading.lost or not reading.utilization_known:  # unknown use is not 0% use
            continue
        uses = by_node.setdefault(reading.node, {})
        for share in gpu.shares:
            if not share.known or share.pod == UNKNOWN or share.namespace in ("", UNKNOWN, "pid"):
                continue
            key = (share.namespace, share.pod, reading.gpu_uuid)
            use = uses.get(key)
            if use is None:
                use = uses[key] = PodGpuUse(share.namespace, share.pod, reading.gpu_uuid, reading.gpu_index)
            use.utilization_pct = min(100.0, use.utilization_pct + 100.0 * max(0.0, share.used_gpus))
            use.allocated_milli = min(
                MILLI_PER_GPU, use.allocated_milli + round(MILLI_PER_GPU * max(0.0, share.allocated_gpus))
            )
            use.split = share.split  # one reading's shares are split by one rule
            use._containers.add(share.container)
            (only,) = use._containers if len(use._containers) == 1 else ("",)
            use.container = only or None
    return [
        NodeBatch(node, [uses[key] for key in sorted(uses)]) for node, uses in sorted(by_node.items()) if uses
    ]
