"""Quota arithmetic over the cohort tree, kept incrementally.

Each node (a queue or a cohort) keeps, per (flavor, resource):
- `subtree_quota`: its own nominal quota plus what its children lend it;
- `usage`: for a queue, what its admitted workloads use; for a cohort, what its children use
  beyond the part of their quota they keep to themselves.

A child keeps `guaranteed = subtree_quota - lending_limit` for itself (0 without a lending limit)
and lends the rest to its parent. Adding or removing a workload walks up the tree once
(O(depth)), so an admission costs the same whatever the number of queued or admitted jobs.
The formulas follow Kueue's hierarchical cohorts (resource_node.go).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tessera.admission.domain.queueing.config import QueueingConfig
from tessera.admission.domain.queueing.model import ResourceQuota
from tessera.admission.domain.queueing.resources import FlavorResource

_NO_QUOTA = ResourceQuota(nominal=0)


class _Node:
    __slots__ = ("children", "guaranteed", "name", "parent", "quotas", "subtree_quota", "usage")

    def __init__(self, name: str, quotas: Mapping[FlavorResource, ResourceQuota]) -> None:
        self.name = name
        self.parent: _Node | None = None
        self.children: list[_Node] = []
        self.quotas = dict(quotas)
        self.subtree_quota: dict[FlavorResource, int] = {}
        self.guaranteed: dict[FlavorResource, int] = {}
        self.usage: dict[FlavorResource, int] = {}


class QuotaTree:
    """Usage and availability of every queue, with cohort borrowing and lending limits."""

    def __init__(self, config: QueueingConfig) -> None:
        self._queues: dict[str, _Node] = {n: _Node(n, q.quotas) for n, q in config.queues.items()}
        self._cohorts: dict[str, _Node] = {n: _Node(n, c.quotas) for n, c in config.cohorts.items()}
        for name, spec in config.queues.items():
            if spec.cohort is not None:
                self._link(self._queues[name], self._cohorts[spec.cohort])
        for name, cspec in config.cohorts.items():
            if cspec.parent is not None:
                self._link(self._cohorts[name], self._cohorts[cspec.parent])
        self._roots: dict[str, str] = {}
        for root in (c for c in self._cohorts.values() if c.parent is None):
            self._compute_quota(root)
        for q in self._queues.values():
            if q.parent is None:
                self._compute_quota(q)
            top = q
            while top.parent is not None:
                top = top.parent
            self._roots[q.name] = top.name

    @staticmethod
    def _link(child: _Node, parent: _Node) -> None:
        child.parent = parent
        parent.children.append(child)

    def _compute_quota(self, node: _Node) -> None:
        subtree = {fr: q.nominal for fr, q in node.quotas.items()}
        for child in node.children:
            self._compute_quota(child)
            for fr, value in child.subtree_quota.items():
                subtree[fr] = subtree.get(fr, 0) + value - child.guaranteed.get(fr, 0)
        node.subtree_quota = subtree
        node.guaranteed = {}
        for fr, value in subtree.items():
            lending = node.quotas.get(fr, _NO_QUOTA).lending_limit
            if lending is not None:
                node.guaranteed[fr] = max(0, value - lending)

    # ---- reading -------------------------------------------------------------------------------

    def root_of(self, queue: str) -> str:
        """The top of the queue's cohort tree (the queue itself when it has no cohort)."""
        return self._roots[queue]

    def usage(self, queue: str, fr: FlavorResource) -> int:
        return self._queues[queue].usage.get(fr, 0)

    def queue_usage(self, queue: str) -> Mapping[FlavorResource, int]:
        return self._queues[queue].usage

    def nominal(self, queue: str, fr: FlavorResource) -> int:
        return self._queues[queue].subtree_quota.get(fr, 0)

    def covers(self, queue: str, fr: FlavorResource) -> bool:
        return fr in self._queues[queue].quotas

    def capacity_of_root(self, queue: str) -> dict[FlavorResource, int]:
        node = self._queues[queue]
        while node.parent is not None:
            node = node.parent
        return node.subtree_quota

    def is_borrowing(self, queue: str, fr: FlavorResource) -> bool:
        node = self._queues[queue]
        return node.usage.get(fr, 0) > node.subtree_quota.get(fr, 0)

    def available(self, queue: str, fr: FlavorResource) -> int:
        """What the queue could take now in `fr`: its own unused guarantee plus what the
        cohort tree can still lend it, capped by borrowing limits on the way up."""
        return max(0, _available(self._queues[queue], fr))

    def potential_available(self, queue: str, fr: FlavorResource) -> int:
        """What the queue could take if nothing else in its cohort tree used anything."""
        return _potential(self._queues[queue], fr)

    # ---- changing ------------------------------------------------------------------------------

    def add_usage(self, queue: str, usage: Mapping[FlavorResource, int]) -> None:
        node = self._queues[queue]
        for fr, delta in usage.items():
            _propagate(node, fr, delta)

    def remove_usage(self, queue: str, usage: Mapping[FlavorResource, int]) -> None:
        node = self._queues[queue]
        for fr, delta in usage.items():
            _propagate(node, fr, -delta)

    def queues(self) -> Iterable[str]:
        return self._queues.keys()


def _propagate(node: _Node | None, fr: FlavorResource, delta: int) -> None:
    while node is not None and delta:
        old = node.usage.get(fr, 0)
        new = old + delta
        node.usage[fr] = new
        guaranteed = node.guaranteed.get(fr, 0)
        # The parent only sees what the child uses beyond what it keeps for itself.
        delta = max(0, new - guaranteed) - max(0, old - guaranteed)
        node = node.parent


def _available(node: _Node, fr: FlavorResource) -> int:
    usage = node.usage.get(fr, 0)
    if node.parent is None:
        return node.subtree_quota.get(fr, 0) - usage
    guaranteed = node.guaranteed.get(fr, 0)
    parent_available = _available(node.parent, fr)
    quota = node.quotas.get(fr)
    if quota is not None and quota.borrowing_limit is not None:
        stored_in_parent = node.subtree_quota.get(fr, 0) - guaranteed
        used_in_parent = max(0, usage - guaranteed)
        parent_available = min(parent_available, stored_in_parent - used_in_parent + quota.borrowing_limit)
    return max(0, guaranteed - usage) + parent_available


def _potential(node: _Node, fr: FlavorResource) -> int:
    if node.parent is None:
        return node.subtree_quota.get(fr, 0)
    guaranteed = node.guaranteed.get(fr, 0)
    parent_potential = _potential(node.parent, fr)
    quota = node.quotas.get(fr)
    if quota is not None and quota.borrowing_limit is not None:
        stored_in_parent = node.subtree_quota.get(fr, 0) - guaranteed
        parent_potential = min(parent_potential, stored_in_parent + quota.borrowing_limit)
    return guaranteed + parent_potential
