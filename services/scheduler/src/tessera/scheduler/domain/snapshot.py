"""The scheduler's immutable view of the cluster: what one scheduling cycle decides on.

A :class:`Snapshot` maps node names to :class:`NodeInfo` values. Every value is frozen; changing a
node means building a new ``NodeInfo`` with :meth:`NodeInfo.with_allocation` or
:meth:`NodeInfo.without_allocation`. The cache's snapshots also share its log of changed nodes and
its gang index (see :mod:`.node_changes`), which the cache changes in place: a snapshot is read and
the cache changed on one thread at a time (the service's scheduling thread, while the loop waits),
never concurrently.
Like kube-scheduler's ``NodeInfo``, this is the scheduler's own view: capacity and health from the
cluster, plus the allocations the scheduler has assumed or seen bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from types import MappingProxyType
from typing import Any

from tessera.cluster.domain.node import Taint
from tessera.scheduler.domain.node_changes import GangNodes, NodeChanges

MILLI_PER_GPU = 1000
RACK_LABEL = "topology.kubernetes.io/rack"


def _empty_map() -> Mapping[Any, Any]:
    return MappingProxyType({})


class Link(IntEnum):
    """A GPU-to-GPU link, valued by its relative transfer cost (lower is better), as in ``nvidia-smi topo -m``."""

    NVLINK = 1
    PCIE_SWITCH = 4
    PCIE_HOST = 8
    CROSS_NUMA = 16


@dataclass(frozen=True, slots=True)
class Topology:
    """The interconnect of one node's GPUs: a symmetric matrix of :class:`Link` indexed by GPU index."""

    links: tuple[tuple[Link, ...], ...]

    def __post_init__(self) -> None:
        size = len(self.links)
        for i, row in enumerate(self.links):
            if len(row) != size:
                raise ValueError(f"topology.links[{i}]: expected {size} columns, got {len(row)}")
            for j, link in enumerate(row):
                if self.links[j][i] is not link:
                    raise ValueError(f"topology.links[{i}][{j}]: the matrix must be symmetric")

    @property
    def size(self) -> int:
        return len(self.links)

    def link(self, a: int, b: int) -> Link:
        return self.links[a][b]

    def set_cost(self, gpus: Iterable[int]) -> tuple[int, int]:
        """(worst pairwise link, total pairwise cost) of a GPU set; lower is better.

        The worst link comes first because a ring all-reduce runs at the speed of its slowest hop.
        """
        worst = 0
        total = 0
        for a, b in itertools.combinations(gpus, 2):
            cost = int(self.links[a][b])
            total += cost
            worst = max(worst, cost)
        return worst, total

    @classmethod
    def build(
        cls,
        size: int,
        *,
        numa_of: Iterable[int] | None = None,
        nvlink_pairs: Iterable[tuple[int, int]] = (),
        pcie_switches: Iterable[Iterable[int]] = (),
    ) -> Topology:
        """Links from NVLink pairs, shared PCIe switches and NUMA placement; the rest goes over the host."""
        numa = tuple(numa_of) if numa_of is not None else (0,) * size
        if len(numa) != size:
            raise ValueError(f"numa_of: expected {size} entries, got {len(numa)}")
        nvlink = {frozenset(pair) for pair in nvlink_pairs}
        switch_of: dict[int, int] = {}
        for switch, members in enumerate(pcie_switches):
            for gpu in members:
                switch_of[gpu] = switch
        for pair in nvlink:
            for gpu in pair:
                if not 0 <= gpu < size:
                    raise ValueError(f"nvlink_pairs: GPU index {gpu} is outside a {size}-GPU node")

        def link(a: int, b: int) -> Link:
            if frozenset((a, b)) in nvlink:
                return Link.NVLINK
            if a in switch_of and switch_of.get(b) == switch_of[a]:
                return Link.PCIE_SWITCH
            return Link.PCIE_HOST if numa[a] == numa[b] else Link.CROSS_NUMA

        return cls(
            tuple(tuple(Link.NVLINK if a == b else link(a, b) for b in range(size)) for a in range(size))
        )

    @classmethod
    def nvswitch(cls, size: int) -> Topology:
        """Every GPU reaches every other over NVLink (an HGX/DGX board with NVSwitch)."""
        return cls(tuple(tuple(Link.NVLINK for _ in range(size)) for _ in range(size)))


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU. ``replicas`` > 1 places shares by the device plugin's time-slicing replicas (ADR 0021):
    a share takes one replica whatever its milli, a whole-GPU pod takes them all; with 1, shares are
    counted by milli within 1000. ``replicas_used`` counts the replicas held.

    ``mig``: the GPU is in MIG mode; its compute is handed out only as the node's MIG devices
    (:attr:`NodeInfo.mig_capacity`), so it is never offered whole or in shares."""

    index: int
    model: str
    milli_used: int = 0
    healthy: bool = True
    replicas: int = 1
    replicas_used: int = 0
    mig: bool = False

    @property
    def offered(self) -> bool:
        """Offered for whole-GPU and fractional placement: healthy, and not in MIG mode."""
        return self.healthy and not self.mig

    @property
    def time_sliced(self) -> bool:
        return self.replicas > 1

    @property
    def idle_milli(self) -> int:
        """Milli left; on a time-sliced GPU, its free replicas as a part of the GPU."""
        if self.replicas > 1:
            return max(0, self.replicas - self.replicas_used) * MILLI_PER_GPU // self.replicas
        return MILLI_PER_GPU - self.milli_used

    @property
    def fully_idle(self) -> bool:
        return self.milli_used == 0 and self.replicas_used == 0

    def replicas_taken(self, milli: int) -> int:
        """Replicas a pod holding ``milli`` of this GPU takes: all for a whole GPU, else one."""
        return self.replicas if milli >= MILLI_PER_GPU else 1

    def fits(self, milli: int) -> bool:
        """Whether a pod holding ``milli`` of this GPU fits beside what is on it."""
        if self.replicas > 1:
            if milli >= MILLI_PER_GPU:
                return self.fully_idle  # a whole GPU never joins pods on a time-sliced GPU
            return self.replicas_used < self.replicas
        return self.milli_used + milli <= MILLI_PER_GPU

    def idle_after(self, milli: int) -> int:
        """:attr:`idle_milli` once a pod holding ``milli`` of this GPU is on it."""
        if self.replicas > 1:
            left = self.replicas - self.replicas_used - self.replicas_taken(milli)
            return max(0, left) * MILLI_PER_GPU // self.replicas
        return self.idle_milli - milli


@dataclass(frozen=True, slots=True)
class Allocation:
    """What one pod holds on one node: milli-GPU per GPU index, CPU, memory and MIG devices."""

    pod: str
    gang: str
    node: str
    gpu_milli: tuple[tuple[int, int], ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    mig: tuple[tuple[str, int], ...] = ()

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(index for index, _ in self.gpu_milli)

    @property
    def gpu_milli_total(self) -> int:
        return sum(milli for _, milli in self.gpu_milli)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node: capacity and health from the cluster, and what the scheduler knows is allocated on it."""

    name: str
    gpus: tuple[GpuInfo, ...]
    topology: Topology
    cpu_milli: int = 0
    memory_mib: int = 0
    cpu_used: int = 0
    memory_used: int = 0
    labels: Mapping[str, str] = field(default_factory=_empty_map)
    mig_capacity: Mapping[str, int] = field(default_factory=_empty_map)
    mig_used: Mapping[str, int] = field(default_factory=_empty_map)
    schedulable: bool = True
    pods: frozenset[str] = frozenset()
    #: NoSchedule and NoExecute taints a pod must tolerate (PreferNoSchedule never blocks)
    taints: tuple[Taint, ...] = ()
    gang_members: Mapping[str, int] = field(default_factory=_empty_map)
    # Derived once at construction: filters read them for every node of every cycle.
    gpu_milli_used: int = field(init=False, repr=False, compare=False)
    free_whole_gpus: int = field(init=False, repr=False, compare=False)
    """Offered GPUs (healthy, not in MIG mode) with nothing on them."""
    idle_gpus_any_health: int = field(init=False, repr=False, compare=False)
    free_healthy_milli: int = field(init=False, repr=False, compare=False)
    max_idle_healthy_milli: int = field(init=False, repr=False, compare=False)
    free_replica: bool = field(init=False, repr=False, compare=False)
    """A healthy time-sliced GPU has a replica free (it takes a share of any milli)."""
    has_unhealthy: bool = field(init=False, repr=False, compare=False)
    models: frozenset[str] = field(init=False, repr=False, compare=False)
    offered_idle_milli: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Each GPU's idle milli, 0 for a GPU not offered (unhealthy or in MIG mode)."""

    def __post_init__(self) -> None:
        if self.topology.size != len(self.gpus):
            raise ValueError(
                f"node {self.name}.topology: covers {self.topology.size} GPUs, node has {len(self.gpus)}"
            )
        for position, gpu in enumerate(self.gpus):
            if gpu.index != position:
                raise ValueError(
                    f"node {self.name}.gpus[{position}]: index must be {position}, got {gpu.index}"
                )
        # GPUs in MIG mode count nowhere here: only their MIG devices are placed on
        offered_idle = tuple(gpu.idle_milli if gpu.offered else 0 for gpu in self.gpus)
        healthy_idle = [gpu.idle_milli for gpu in self.gpus if gpu.offered]
        derived = {
            "gpu_milli_used": sum(gpu.milli_used for gpu in self.gpus),
            "free_whole_gpus": sum(1 for gpu in self.gpus if gpu.offered and gpu.fully_idle),
            "idle_gpus_any_health": sum(1 for gpu in self.gpus if gpu.fully_idle and not gpu.mig),
            "free_healthy_milli": sum(healthy_idle),
            "max_idle_healthy_milli": max(healthy_idle, default=0),
            "free_replica": any(
                gpu.offered and gpu.replicas > 1 and gpu.replicas_used < gpu.replicas for gpu in self.gpus
            ),
            "has_unhealthy": any(not gpu.healthy for gpu in self.gpus),
            "models": frozenset(gpu.model for gpu in self.gpus),
            "offered_idle_milli": offered_idle,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    @property
    def rack(self) -> str | None:
        return self.labels.get(RACK_LABEL)

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def mig_free(self, profile: str) -> int:
        return self.mig_capacity.get(profile, 0) - self.mig_used.get(profile, 0)

    def with_allocation(self, allocation: Allocation) -> NodeInfo:
        return self._apply(allocation, +1)

    def without_allocation(self, allocation: Allocation) -> NodeInfo:
        return self._apply(allocation, -1)

    def _apply(self, allocation: Allocation, sign: int) -> NodeInfo:
        if allocation.node != self.name:
            raise ValueError(f"allocation.node: {allocation.node!r} is not node {self.name!r}")
        gpus = list(self.gpus)
        for index, milli in allocation.gpu_milli:
            gpu = gpus[index]
            gpus[index] = replace(
                gpu,
                milli_used=gpu.milli_used + sign * milli,
                replicas_used=gpu.replicas_used + sign * gpu.replicas_taken(milli),
            )
        mig_used = dict(self.mig_used)
        for profile, count in allocation.mig:
            mig_used[profile] = mig_used.get(profile, 0) + sign * count
        gangs = dict(self.gang_members)
        gangs[allocation.gang] = gangs.get(allocation.gang, 0) + sign
        if gangs[allocation.gang] <= 0:
            del gangs[allocation.gang]
        pods = self.pods | {allocation.pod} if sign > 0 else self.pods - {allocation.pod}
        return replace(
            self,
            gpus=tuple(gpus),
            cpu_used=self.cpu_used + sign * allocation.cpu_milli,
            memory_used=self.memory_used + sign * allocation.memory_mib,
            mig_used=MappingProxyType({k: v for k, v in mig_used.items() if v}),
            pods=pods,
            gang_members=MappingProxyType(gangs),
        )


@dataclass(frozen=True, slots=True)
class ClusterTotals:
    """Aggregates a gang-level quick check reads instead of walking every node per member."""

    free_whole_gpus: int
    free_healthy_milli: int
    max_free_whole_gpus_on_a_node: int
    max_idle_gpus_on_a_node: int
    schedulable_nodes: int


class RunningTotals:
    """:class:`ClusterTotals` kept up to date node by node (the cache's), so a snapshot need not sum
    them over every node."""

    __slots__ = ("_free", "_free_on_a_node", "_idle_on_a_node", "_milli", "_schedulable")

    def __init__(self) -> None:
        self._free = 0
        self._milli = 0
        self._schedulable = 0
        # How many schedulable nodes have each count of free whole GPUs, of idle GPUs.
        self._free_on_a_node: dict[int, int] = {}
        self._idle_on_a_node: dict[int, int] = {}

    def replace(self, old: NodeInfo | None, new: NodeInfo | None) -> None:
        """A node changed from ``old`` to ``new`` (None: absent)."""
        if old is not None and old.schedulable:
            self._count(old, -1)
        if new is not None and new.schedulable:
            self._count(new, 1)

    def totals(self) -> ClusterTotals:
        return ClusterTotals(
            free_whole_gpus=self._free,
            free_healthy_milli=self._milli,
            max_free_whole_gpus_on_a_node=max(self._free_on_a_node, default=0),
            max_idle_gpus_on_a_node=max(self._idle_on_a_node, default=0),
            schedulable_nodes=self._schedulable,
        )

    def _count(self, node: NodeInfo, sign: int) -> None:
        self._free += sign * node.free_whole_gpus
        self._milli += sign * node.free_healthy_milli
        self._schedulable += sign
        for counts, value in (
            (self._free_on_a_node, node.free_whole_gpus),
            (self._idle_on_a_node, node.idle_gpus_any_health),
        ):
            left = counts.get(value, 0) + sign
            if left:
                counts[value] = left
            else:
                del counts[value]


@dataclass(frozen=True)
class Snapshot:
    """An immutable, ordered map of node name to :class:`NodeInfo`, tagged with the cache generation."""

    nodes: Mapping[str, NodeInfo]
    generation: int = 0
    changes: NodeChanges | None = field(default=None, init=False, repr=False, compare=False)
    """The cache's log of changed nodes (see :mod:`.node_changes`); None for a snapshot made otherwise.
    Set only by :meth:`of_cache`: a snapshot made from another one (``dataclasses.replace``, a what-if
    with nodes changed) must not carry a log that does not name its changes, or kept verdicts and
    :meth:`holding` would trust it."""
    gangs: GangNodes | None = field(default=None, init=False, repr=False, compare=False)
    """The cache's nodes holding each gang's members, read with ``changes``."""
    _totals: list[ClusterTotals] = field(default_factory=list, init=False, repr=False, compare=False)
    _positions: list[Mapping[str, int]] = field(default_factory=list, init=False, repr=False, compare=False)
    #: what plugins derive once per snapshot (the snapshot never changes, so neither do they)
    memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, nodes: Iterable[NodeInfo], generation: int = 0) -> Snapshot:
        by_name: dict[str, NodeInfo] = {}
        for node in nodes:
            if node.name in by_name:
                raise ValueError(f"nodes: duplicate node name {node.name!r}")
            by_name[node.name] = node
        return cls(MappingProxyType(by_name), generation)

    @classmethod
    def of_cache(
        cls, nodes: Mapping[str, NodeInfo], generation: int, changes: NodeChanges, gangs: GangNodes
    ) -> Snapshot:
        """The cache's snapshot at ``generation``, with its log of changes and gang index."""
        snapshot = cls(nodes, generation)
        object.__setattr__(snapshot, "changes", changes)
        object.__setattr__(snapshot, "gangs", gangs)
        return snapshot

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> NodeInfo:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"node {name!r} is not in the snapshot") from None

    def list(self) -> tuple[NodeInfo, ...]:
        return tuple(self.nodes.values())

    @property
    def totals(self) -> ClusterTotals:
        """Computed once per snapshot on first use; the snapshot never changes, so neither do they."""
        if not self._totals:
            usable = [node for node in self.nodes.values() if node.schedulable]
            free = [node.free_whole_gpus for node in usable]
            self._totals.append(
                ClusterTotals(
                    free_whole_gpus=sum(free),
                    free_healthy_milli=sum(n.free_healthy_milli for n in usable),
                    max_free_whole_gpus_on_a_node=max(free, default=0),
                    max_idle_gpus_on_a_node=max((n.idle_gpus_any_health for n in usable), default=0),
                    schedulable_nodes=len(usable),
                )
            )
        return self._totals[0]

    def holding(self, gang: str) -> frozenset[str]:
        """The nodes holding members of ``gang``."""
        later = self.changes.since(self.generation) if self.changes is not None else None
        if self.gangs is not None and later is not None:
            return self.gangs.holding(gang, self.nodes, later)
        return frozenset(name for name, node in self.nodes.items() if gang in node.gang_members)

    def positions(self) -> Mapping[str, int]:
        """Each node's place in snapshot order, computed once (or handed on by the cache while no
        node was added or removed, which is all that changes the order)."""
        if not self._positions:
            self._positions.append({name: i for i, name in enumerate(self.nodes)})
        return self._positions[0]

    def with_node(self, node: NodeInfo, generation: int | None = None) -> Snapshot:
        nodes = dict(self.nodes)
        nodes[node.name] = node
        return Snapshot(MappingProxyType(nodes), self.generation if generation is None else generation)
