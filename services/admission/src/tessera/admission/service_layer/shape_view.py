"""The cluster's free shape as admission sees it: the GPU inventory telemetry publishes, less
the GPUs the scheduler's placements hold, less what admitted but not yet placed jobs will take."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tessera.admission.domain.queueing import (
    FreeShapeOracle,
    NodeFree,
    Placement,
    PodGroup,
    ShapeOracle,
    Workload,
)
from tessera.admission.domain.queueing.resources import MIG_PREFIX
from tessera.admission.domain.queueing.shape import FULL_GPU_MILLI


class GpuShapeOracle:
    """`FreeShapeOracle` over whole and fractional GPUs. Telemetry's inventory does not describe
    MIG slices, so MIG pods are left to the scheduler (and to quota)."""

    def __init__(self, inner: FreeShapeOracle) -> None:
        self.inner = inner

    def try_place(self, workload: Workload, flavors: Sequence[str]) -> Placement | None:
        return self.inner.try_place(_without_mig(workload), flavors)

    def commit(self, placement: Placement) -> None:
        self.inner.commit(placement)


def _without_mig(workload: Workload) -> Workload:
    if not any(r.startswith(MIG_PREFIX) for g in workload.pod_groups for r in g.requests):
        return workload
    groups = tuple(
        PodGroup(
            g.name, g.count, {r: q for r, q in g.requests.items() if not r.startswith(MIG_PREFIX)}, g.flavors
        )
        for g in workload.pod_groups
    )
    return Workload(workload.name, workload.queue, groups, workload.priority, workload.created_at)


def free_shape(
    nodes: Iterable[tuple[str, list[dict[str, Any]]]],
    used_milli_by_gpu: Mapping[str, int],
    flavor_for_model: Mapping[str, str],
    single_flavor: str | None = None,
) -> ShapeOracle | None:
    """None when telemetry has published no inventory yet: the shape is unknown, not empty."""
    free: list[NodeFree] = []
    for name, gpus in nodes:
        healthy = [g for g in gpus if g.get("healthy", True)]
        if not healthy:
            continue
        model = str(healthy[0].get("model", ""))
        flavor = single_flavor or flavor_for_model.get(model.lower(), model.lower())
        whole = 0
        partial = []
        for g in healthy:
            used = used_milli_by_gpu.get(str(g.get("uuid")), 0)
            if used <= 0:
                whole += 1
            elif used < FULL_GPU_MILLI:
                partial.append(FULL_GPU_MILLI - used)
        free.append(NodeFree(name, flavor, whole, tuple(partial)))
    if not free:
        return None
    return GpuShapeOracle(FreeShapeOracle(free))
