"""The cluster's free shape as admission sees it: the GPU inventory telemetry publishes, less
the GPUs the scheduler's placements hold, less what admitted but not yet placed jobs will take."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.admission.domain.queueing import (
    FlavorSpec,
    FreeShapeOracle,
    NodeFree,
    Placement,
    PodGroup,
    ShapeOracle,
    Workload,
)
from tessera.admission.domain.queueing.flavors import flavor_of_node
from tessera.admission.domain.queueing.resources import GPU, MIG_PREFIX
from tessera.admission.domain.queueing.shape import FULL_GPU_MILLI


@dataclass(frozen=True)
class NodeShape:
    """A node as the inventory describes it: every GPU, used or not, and its labels."""

    name: str
    gpus: int
    model: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def may_hold(self, group: PodGroup) -> bool:
        """Whether the node's labels allow the group's pods (unknown labels allow any pod)."""
        return not group.node or not self.labels or group.node.may_match_node(self.labels, self.name)

    @property
    def described(self) -> str:
        return f"{self.gpus} x {self.model}" if self.model else f"{self.gpus} GPUs"


class GpuShapeOracle:
    """`FreeShapeOracle` over whole and fractional GPUs. Telemetry's inventory does not describe
    MIG slices, so MIG pods are left to the scheduler (and to quota). Knowing every node's shape and
    labels, it says which pods no node could ever hold (too many GPUs for the largest node their
    nodeSelector and required affinity allow, or no such node at all); such a job waits (a node may
    join) saying so."""

    def __init__(self, inner: FreeShapeOracle, shapes: Sequence[NodeShape] = ()) -> None:
        self.inner = inner
        self.shapes = tuple(shapes)

    def never_fits(self, workload: Workload) -> str | None:
        if not self.shapes:
            return None
        for group in workload.pod_groups:
            allowed = [s for s in self.shapes if s.may_hold(group)]
            if not allowed:
                return (
                    f"no node shape holds a pod of {group.name!r}: no node matches its required node "
                    f"affinity: {group.node.describe()}"
                )
            largest = max(allowed, key=lambda s: s.gpus)
            wanted = group.requests.get(GPU, 0)
            if wanted > largest.gpus:
                where = (
                    "the largest node" if len(allowed) == len(self.shapes) else "the largest node it may use"
                )
                return (
                    f"no node shape holds a pod of {group.name!r} ({wanted} GPUs): "
                    f"{where}, {largest.name}, has {largest.described}"
                )
        return None

    def try_place(self, workload: Workload, flavors: Sequence[str]) -> Placement | None:
        return self.inner.try_place(_without_mig(workload), flavors)

    def commit(self, placement: Placement) -> None:
        self.inner.commit(placement)


def _without_mig(workload: Workload) -> Workload:
    if not any(r.startswith(MIG_PREFIX) for g in workload.pod_groups for r in g.requests):
        return workload
    groups = tuple(
        PodGroup(
            g.name,
            g.count,
            {r: q for r, q in g.requests.items() if not r.startswith(MIG_PREFIX)},
            g.flavors,
            g.node,
        )
        for g in workload.pod_groups
    )
    return Workload(
        workload.name,
        workload.queue,
        groups,
        workload.priority,
        workload.created_at,
        workload.preemptible,
        workload.checkpointable,
    )


def free_shape(
    nodes: Iterable[tuple[str, list[dict[str, Any]]]],
    used_milli_by_gpu: Mapping[str, int],
    flavor_for_model: Mapping[str, str],
    single_flavor: str | None = None,
    flavors: Sequence[FlavorSpec] = (),
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> ShapeOracle | None:
    """None when telemetry has published no inventory yet: the shape is unknown, not empty.

    A node's flavor is the one of ``flavors`` its GPU model and ``labels`` (by node) say
    (`flavor_of_node`), else the one ``flavor_for_model`` names for its GPU model."""
    labels = labels or {}
    free: list[NodeFree] = []
    shapes: list[NodeShape] = []
    for name, gpus in nodes:
        node_labels = dict(labels.get(name, {}))
        if gpus:
            shapes.append(NodeShape(name, len(gpus), str(gpus[0].get("model", "")), node_labels))
        healthy = [g for g in gpus if g.get("healthy", True)]
        if not healthy:
            continue
        model = str(healthy[0].get("model", ""))
        flavor = (
            single_flavor
            or flavor_of_node(model, node_labels, flavors)
            or flavor_for_model.get(model.lower(), model.lower())
        )
        whole = 0
        partial = []
        for g in healthy:
            used = used_milli_by_gpu.get(str(g.get("uuid")), 0)
            if used <= 0:
                whole += 1
            elif used < FULL_GPU_MILLI:
                partial.append(FULL_GPU_MILLI - used)
        free.append(NodeFree(name, flavor, whole, tuple(partial), labels=node_labels))
    if not free:
        return None
    return GpuShapeOracle(FreeShapeOracle(free), shapes)
