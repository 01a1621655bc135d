"""The scheduler cache: a mutable view of the cluster fed by watches, from which cycles take snapshots.

Capacity and health come in through node upserts and health, schedulability and slice-inventory
events; telemetry's "GPU unhealthy" marks are kept apart from the node records (an overlay applied to
every record the node gets, so a later node update does not make the GPU healthy again); allocations come in through the scheduler's own decisions. A placement is *assumed* here at
once (the next cycle already sees it), the bind follows, and on failure the assumption is
*forgotten*. Everything the cache holds is the nodes plus a set of allocations, so
:meth:`SchedulerCache.rebuild` restores it after a restart from persisted or listed placements.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from enum import StrEnum
from types import MappingProxyType

from tessera.scheduler.domain.node_changes import GangNodes, NodeChanges
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, Allocation, NodeInfo, RunningTotals, Snapshot


class CacheConflict(ValueError):
    """An allocation that cannot be true of the cache: an unknown node, a pod placed twice, an overcommit."""


class PodState(StrEnum):
    ASSUMED = "assumed"
    BOUND = "bound"


class SchedulerCache:
    def __init__(self) -> None:
        self._base: dict[str, NodeInfo] = {}
        self._marked_unhealthy: dict[str, set[int]] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._allocations: dict[str, Allocation] = {}
        self._states: dict[str, PodState] = {}
        self._on_node: dict[str, set[str]] = {}
        self._generation = 0
        self._snapshot: Snapshot | None = None
        self._changes = NodeChanges()
        self._totals = RunningTotals()
        self._gangs = GangNodes()
        # A node was added or removed since the last snapshot (the order of the nodes changed).
        self._reordered = True

    @classmethod
    def rebuild(cls, nodes: Iterable[NodeInfo], bound: Iterable[Allocation] = ()) -> SchedulerCache:
        """A cache restored from the cluster's nodes and the placements known to be bound."""
        cache = cls()
        for node in nodes:
            cache.upsert_node(node)
        for allocation in bound:
            cache.assume(allocation)
            cache.confirm_bound(allocation.pod)
        return cache

    # -- reads ---------------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        return self._generation

    def snapshot(self) -> Snapshot:
        """The current state, frozen; the same object until the cache changes."""
        previous = self._snapshot
        if previous is not None and previous.generation == self._generation:
            return previous
        snapshot = Snapshot.of_cache(
            MappingProxyType(dict(self._nodes)), self._generation, self._changes, self._gangs
        )
        snapshot._totals.append(self._totals.totals())
        if previous is not None and not self._reordered:
            snapshot._positions.extend(previous._positions)  # the same nodes in the same order
        self._snapshot, self._reordered = snapshot, False
        return snapshot

    def node(self, name: str) -> NodeInfo:
        return self._nodes[name]

    def allocation(self, pod: str) -> Allocation | None:
        return self._allocations.get(pod)

    def pod_state(self, pod: str) -> PodState | None:
        return self._states.get(pod)

    def allocations(self, state: PodState | None = None) -> tuple[Allocation, ...]:
        return tuple(a for pod, a in self._allocations.items() if state is None or self._states[pod] is state)

    # -- cluster events ------------------------------------------------------------------------

    def upsert_node(self, node: NodeInfo) -> tuple[Allocation, ...]:
        """A node added or changed (capacity, labels, GPU inventory). Its allocations carry over,
        except those on GPUs the node no longer has: they are dropped and returned."""
        if node.pods or node.gang_members or node.cpu_used or node.memory_used or node.mig_used:
            raise CacheConflict(f"node {node.name}: upsert takes capacity only, not allocations")
        if node.gpu_milli_used:
            raise CacheConflict(f"node {node.name}.gpus: upsert takes capacity only, not GPU usage")
        on_node = self._on_node.setdefault(node.name, set())
        lost = tuple(
            self._allocations[pod]
            for pod in sorted(on_node)
            if any(index >= node.gpu_count for index in self._allocations[pod].gpu_indices)
        )
        for allocation in lost:
            del self._allocations[allocation.pod], self._states[allocation.pod]
            on_node.discard(allocation.pod)
        self._base[node.name] = node
        self._rederive(node.name)
        return lost

    def remove_node(self, name: str) -> tuple[Allocation, ...]:
        """A node gone; returns the allocations lost with it (their gangs must be requeued)."""
        if name not in self._base:
            return ()
        lost = tuple(self._allocations[pod] for pod in sorted(self._on_node.get(name, ())))
        for allocation in lost:
            del self._allocations[allocation.pod]
            del self._states[allocation.pod]
        del self._base[name], self._on_node[name]
        self._marked_unhealthy.pop(name, None)
        self._set_node(name, None)
        return lost

    def set_gpu_health(self, node: str, index: int, healthy: bool) -> None:
        """``gpu_unhealthy`` (or its recovery): the GPU keeps its pods, but takes no new ones. The mark
        lies over whatever the node's records say until it is lifted here (or the node goes): a
        node update reporting the GPU healthy does not lift it."""
        base = self._require_node(node)
        if not 0 <= index < base.gpu_count:
            raise CacheConflict(f"node {node}: no GPU index {index}")
        marked = self._marked_unhealthy.setdefault(node, set())
        if healthy:
            marked.discard(index)
            if not base.gpus[index].healthy:  # recovered: the record's own fault goes too
                gpus = list(base.gpus)
                gpus[index] = replace(gpus[index], healthy=True)
                self._base[node] = replace(base, gpus=tuple(gpus))
        else:
            marked.add(index)
        self._rederive(node)

    def health_marks(self, node: str) -> frozenset[int]:
        """The node's GPUs marked unhealthy through :meth:`set_gpu_health`."""
        return frozenset(self._marked_unhealthy.get(node, ()))

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        """Cordon or uncordon; NotReady counts as unschedulable."""
        self._base[node] = replace(self._require_node(node), schedulable=schedulable)
        self._rederive(node)

    def set_mig_capacity(self, node: str, capacity: Mapping[str, int]) -> None:
        """Slice inventory: the MIG devices a node advertises, by profile (``nvidia.com/mig-<profile>``)."""
        for profile, count in capacity.items():
            if count < 0:
                raise CacheConflict(f"mig_capacity[{profile!r}]: must be >= 0, got {count}")
        clean = {profile: count for profile, count in capacity.items() if count}
        self._base[node] = replace(self._require_node(node), mig_capacity=MappingProxyType(clean))
        self._rederive(node)

    # -- the scheduler's own decisions -----------------------------------------------------------

    def assume(self, allocation: Allocation) -> None:
        """Record a placement at once, before its bind; raises :class:`CacheConflict` if it cannot hold."""
        if allocation.pod in self._allocations:
            raise CacheConflict(
                f"pod {allocation.pod}: already placed on {self._allocations[allocation.pod].node}"
            )
        self._require_node(allocation.node)
        node = self._nodes[allocation.node]
        for index, milli in allocation.gpu_milli:
            if not 0 <= index < node.gpu_count:
                raise CacheConflict(f"pod {allocation.pod}: node {node.name} has no GPU index {index}")
            gpu = node.gpus[index]
            if not gpu.fits(milli):
                limit = f"its {gpu.replicas} replicas" if gpu.time_sliced else f"{MILLI_PER_GPU} milli"
                raise CacheConflict(f"pod {allocation.pod}: GPU {node.name}/{index} would pass {limit}")
        for profile, count in allocation.mig:
            if node.mig_free(profile) < count:
                raise CacheConflict(
                    f"pod {allocation.pod}: node {node.name} lacks {count} free MIG {profile}"
                )
        self._allocations[allocation.pod] = allocation
        self._states[allocation.pod] = PodState.ASSUMED
        self._on_node[allocation.node].add(allocation.pod)
        self._set_node(node.name, node.with_allocation(allocation))

    def confirm_bound(self, pod: str) -> None:
        if pod not in self._states:
            raise CacheConflict(f"pod {pod}: not assumed, cannot be confirmed bound")
        self._states[pod] = PodState.BOUND

    def forget(self, pod: str) -> Allocation | None:
        """Roll back an assumed placement. Idempotent; a bound pod is left alone (use :meth:`remove_pod`)."""
        if self._states.get(pod) is not PodState.ASSUMED:
            return None
        return self.remove_pod(pod)

    def remove_pod(self, pod: str) -> Allocation | None:
        """A pod finished, was evicted or deleted. Idempotent."""
        allocation = self._allocations.pop(pod, None)
        if allocation is None:
            return None
        del self._states[pod]
        self._on_node[allocation.node].discard(pod)
        self._set_node(allocation.node, self._nodes[allocation.node].without_allocation(allocation))
        return allocation

    # -- internals -----------------------------------------------------------------------------

    def _require_node(self, name: str) -> NodeInfo:
        try:
            return self._base[name]
        except KeyError:
            raise CacheConflict(f"node {name!r}: unknown to the cache") from None

    def _rederive(self, name: str) -> None:
        node = self._base[name]
        marked = self._marked_unhealthy.get(name)
        if marked and any(i < node.gpu_count and node.gpus[i].healthy for i in marked):
            gpus = tuple(replace(gpu, healthy=False) if gpu.index in marked else gpu for gpu in node.gpus)
            node = replace(node, gpus=gpus)
        for pod in sorted(self._on_node[name]):
            node = node.with_allocation(self._allocations[pod])
        self._set_node(name, node)

    def _set_node(self, name: str, node: NodeInfo | None) -> None:
        """Node ``name`` is replaced, added or removed (None): a new generation, the change logged
        and counted in the totals."""
        old = self._nodes.pop(name, None) if node is None else self._nodes.get(name)
        if node is not None:
            self._nodes[name] = node
        if old is None or node is None:
            self._reordered = True
        self._totals.replace(old, node)
        self._gangs.replace(name, old, node)
        self._generation += 1
        self._changes.record(self._generation, name)
