"""Topology-aware admission: can the cluster's free shape place a gang right now?

Quota counts 1x8 GPUs the same as 8x1, so a job can fit its quota and still be unplaceable.
Before admitting, the cycle asks a `ShapeOracle`. `FreeShapeOracle` is a simple pure one over a
view of free capacity per node: whole free GPUs, partly used GPUs (free milli each) and free
MIG slices per profile. Pods are placed largest first; each takes the tightest node that can
hold it (first-fit-decreasing over nodes visited from fewest free GPUs up), among the nodes whose
labels match what its pod group requires of a node (`NodeRequirement`). A gang is placed whole or
not at all. Committed placements reduce the view for the rest of the cycle.
CPU and memory are left to the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.admission.domain.queueing.affinity import ANY_NODE, NodeRequirement
from tessera.admission.domain.queueing.model import Workload
from tessera.admission.domain.queueing.resources import GPU, GPU_MILLI, MIG_PREFIX

FULL_GPU_MILLI = 1000


@dataclass(frozen=True, slots=True)
class NodeFree:
    name: str
    flavor: str
    free_gpus: int
    """Wholly idle GPUs."""
    partial_gpu_milli: tuple[int, ...] = ()
    """Free milli of each partly used GPU."""
    free_mig: Mapping[str, int] = field(default_factory=dict)
    """Free MIG slices by profile, e.g. {"1g.10gb": 3}."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The node's labels, which pods' node selectors and required affinity are matched against
    (none: not known, and any pod may go there)."""


@dataclass(frozen=True, slots=True)
class PodSlot:
    pod_group: str
    index: int
    node: str


@dataclass(frozen=True, slots=True)
class Placement:
    workload: str
    slots: tuple[PodSlot, ...]
    reservations: tuple[tuple[str, str, int], ...] = ()
    """What committing takes from the view: (kind, node, amount), replayed in order."""


class ShapeOracle(Protocol):
    """A port: places a gang on the free shape, tentatively, then commits it if admitted."""

    def try_place(self, workload: Workload, flavors: Sequence[str]) -> Placement | None: ...

    def commit(self, placement: Placement) -> None: ...

    def never_fits(self, workload: Workload) -> str | None:
        """Why no node shape could ever hold a pod of the workload (naming the shape), or None."""
        ...


@dataclass(slots=True)
class _Node:
    name: str
    flavor: str
    free_gpus: int
    partial: list[int]
    mig: dict[str, int]
    labels: Mapping[str, str]

    def fits(self, node: NodeRequirement) -> bool:
        """A node whose labels are not known (its source reports none) may hold any pod."""
        return not node or not self.labels or node.may_match_node(self.labels, self.name)


class FreeShapeOracle:
    """First-fit-decreasing gang placement over a free-shape view; pure and cycle-local."""

    def __init__(self, nodes: Sequence[NodeFree]) -> None:
        self._nodes: dict[str, _Node] = {}
        # flavor -> free whole GPU count -> node names (dicts keep insertion order)
        self._buckets: dict[str, dict[int, dict[str, None]]] = {}
        for n in nodes:
            node = _Node(
                n.name, n.flavor, n.free_gpus, list(n.partial_gpu_milli), dict(n.free_mig), dict(n.labels)
            )
            self._nodes[n.name] = node
            self._buckets.setdefault(n.flavor, {}).setdefault(n.free_gpus, {})[n.name] = None

    def free_gpus(self, node: str) -> int:
        return self._nodes[node].free_gpus

    def try_place(self, workload: Workload, flavors: Sequence[str]) -> Placement | None:
        pods: list[tuple[tuple[int, int], str, int, str, Mapping[str, int], NodeRequirement]] = []
        for group, flavor in zip(workload.pod_groups, flavors, strict=True):
            size = (group.requests.get(GPU, 0), group.requests.get(GPU_MILLI, 0))
            for i in range(group.count):
                pods.append((size, group.name, i, flavor, group.requests, group.node))
        pods.sort(key=lambda p: p[0], reverse=True)
        undo: list[tuple[str, str, int]] = []
        slots: list[PodSlot] = []
        for _, group_name, index, flavor, requests, wanted in pods:
            node = self._place_pod(flavor, requests, undo, wanted)
            if node is None:
                self._rollback(undo)
                return None
            if node:
                slots.append(PodSlot(group_name, index, node))
        # try_place leaves the view as it was; commit replays the reservations. Commit right
        # after try_place, before placing anything else.
        self._rollback(undo)
        return Placement(workload.name, tuple(slots), tuple(undo))

    def commit(self, placement: Placement) -> None:
        for kind, node_name, amount in placement.reservations:
            self._apply(kind, node_name, amount)

    def never_fits(self, workload: Workload) -> str | None:
        """None: a view of free capacity alone cannot tell what the nodes could ever hold."""
        return None

    # ---- internals -----------------------------------------------------------------------------

    def _place_pod(
        self,
        flavor: str,
        requests: Mapping[str, int],
        undo: list[tuple[str, str, int]],
        wanted: NodeRequirement = ANY_NODE,
    ) -> str | None:
        gpus = requests.get(GPU, 0)
        milli = requests.get(GPU_MILLI, 0)
        migs = [(res[len(MIG_PREFIX) :], qty) for res, qty in requests.items() if res.startswith(MIG_PREFIX)]
        if gpus:
            name = self._tightest_with_gpus(flavor, gpus, wanted)
            if name is None:
                return None
            self._record(undo, "gpus", name, gpus)
            return name
        if milli:
            name = self._node_for_milli(flavor, milli, undo, wanted)
            return name
        if migs:
            for node in self._nodes.values():
                if (
                    node.flavor == flavor
                    and all(node.mig.get(p, 0) >= q for p, q in migs)
                    and node.fits(wanted)
                ):
                    for profile, qty in migs:
                        self._record(undo, "mig:" + profile, node.name, qty)
                    return node.name
            return None
        # A pod without GPUs is the scheduler's concern alone.
        return ""

    def _tightest_with_gpus(self, flavor: str, gpus: int, wanted: NodeRequirement = ANY_NODE) -> str | None:
        buckets = self._buckets.get(flavor, {})
        for free in sorted(k for k in buckets if k >= gpus and buckets[k]):
            if not wanted:
                return next(iter(buckets[free]))
            for name in buckets[free]:
                if self._nodes[name].fits(wanted):
                    return name
        return None

    def _node_for_milli(
        self,
        flavor: str,
        milli: int,
        undo: list[tuple[str, str, int]],
        wanted: NodeRequirement = ANY_NODE,
    ) -> str | None:
        best: tuple[int, str, int] | None = None
        for node in self._nodes.values():
            if node.flavor != flavor or not node.fits(wanted):
                continue
            for i, free in enumerate(node.partial):
                if free >= milli and (best is None or free < best[0]):
                    best = (free, node.name, i)
        if best is not None:
            self._record(undo, f"milli:{best[2]}", best[1], milli)
            return best[1]
        name = self._tightest_with_gpus(flavor, 1, wanted)
        if name is None:
            return None
        self._record(undo, "gpus", name, 1)
        self._record(undo, "open", name, FULL_GPU_MILLI - milli)
        return name

    def _record(self, undo: list[tuple[str, str, int]], kind: str, node: str, amount: int) -> None:
        self._apply(kind, node, amount)
        undo.append((kind, node, amount))

    def _apply(self, kind: str, node_name: str, amount: int) -> None:
        node = self._nodes[node_name]
        if kind == "gpus":
            self._move(node, node.free_gpus - amount)
        elif kind == "open":
            node.partial.append(amount)
        elif kind.startswith("milli:"):
            node.partial[int(kind[6:])] -= amount
        else:
            profile = kind[4:]
            node.mig[profile] = node.mig.get(profile, 0) - amount

    def _rollback(self, undo: list[tuple[str, str, int]]) -> None:
        for kind, node_name, amount in reversed(undo):
            node = self._nodes[node_name]
            if kind == "gpus":
                self._move(node, node.free_gpus + amount)
            elif kind == "open":
                node.partial.pop()
            elif kind.startswith("milli:"):
                node.partial[int(kind[6:])] += amount
            else:
                profile = kind[4:]
                node.mig[profile] = node.mig.get(profile, 0) + amount

    def _move(self, node: _Node, free: int) -> None:
        buckets = self._buckets[node.flavor]
        del buckets[node.free_gpus][node.name]
        node.free_gpus = free
        buckets.setdefault(free, {})[node.name] = None
