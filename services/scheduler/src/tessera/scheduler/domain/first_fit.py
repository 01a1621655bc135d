"""First-fit, all-or-nothing placement of a job's pod groups over the free inventory. Pure.

This is the walking skeleton's policy; the plugin framework and the fragmentation-aware policies
replace it as the scheduler's default, and it stays as a simple baseline."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tessera.contracts.events import GpuAssignment, PodPlacement
from tessera.contracts.jobs import JobSpec, PodGroupSpec

FULL = 1000


@dataclass
class FreeGpu:
    index: int
    uuid: str
    model: str
    free_milli: int
    healthy: bool = True


@dataclass
class FreeNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: list[FreeGpu] = field(default_factory=list)


@dataclass(frozen=True)
class GangFit:
    placements: list[PodPlacement]
    rejected: dict[str, int]

    @property
    def placed(self) -> bool:
        return bool(self.placements)

    def message(self) -> str:
        parts = [
            f"{reason} on {count:,} node{'s' if count != 1 else ''}"
            for reason, count in sorted(self.rejected.items(), key=lambda kv: -kv[1])
        ]
        return "; ".join(parts) or "no nodes in the inventory"


def _fit_pod(group: PodGroupSpec, node: FreeNode) -> tuple[list[GpuAssignment] | None, str]:
    if node.cpu_milli < group.cpu_milli:
        return None, "insufficient cpu"
    if node.memory_mib < group.memory_mib:
        return None, "insufficient memory"
    gpu = group.gpu
    if gpu is None:
        return [], ""
    if gpu.mig_profile is not None:
        return None, "MIG slices not offered"
    allowed = [g for g in node.gpus if not gpu.models or g.model in gpu.models]
    if not allowed:
        return None, "GPU model not allowed"
    healthy = [g for g in allowed if g.healthy]
    if not healthy:
        return None, "unhealthy GPU"
    if gpu.count is not None:
        idle = [g for g in healthy if g.free_milli == FULL][: gpu.count]
        if len(idle) < gpu.count:
            return None, "insufficient GPU"
        return [GpuAssignment(index=g.index, uuid=g.uuid, milli=FULL) for g in idle], ""
    assert gpu.milli is not None
    shared = next((g for g in healthy if g.free_milli >= gpu.milli), None)
    if shared is None:
        return None, "insufficient GPU"
    return [GpuAssignment(index=shared.index, uuid=shared.uuid, milli=gpu.milli)], ""


def _take(node: FreeNode, group: PodGroupSpec, gpus: list[GpuAssignment]) -> None:
    node.cpu_milli -= group.cpu_milli
    node.memory_mib -= group.memory_mib
    by_index = {g.index: g for g in node.gpus}
    for assignment in gpus:
        by_index[assignment.index].free_milli -= assignment.milli


def place_gang(job_name: str, spec: JobSpec, nodes: list[FreeNode]) -> GangFit:
    """Place `min_available` pods of every group, first fit in node order, or nothing at all.
    `nodes` is consumed as scratch state: pass copies."""
    placements: list[PodPlacement] = []
    rejected: Counter[str] = Counter()
    for group in spec.pod_groups:
        for replica in range(group.quorum):
            reasons: dict[str, str] = {}
            for node in nodes:
                gpus, reason = _fit_pod(group, node)
                if gpus is None:
                    reasons[node.name] = reason
                    continue
                _take(node, group, gpus)
                placements.append(
                    PodPlacement(
                        pod=f"{job_name}-{group.name}-{replica}", group=group.name, node=node.name, gpus=gpus
                    )
                )
                break
            else:
                rejected.update(reasons.values())
                return GangFit([], dict(rejected))
    return GangFit(placements, {})
