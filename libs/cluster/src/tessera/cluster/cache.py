"""A cache of nodes, pods and PodGroups fed by reflectors, and the immutable snapshot decisions read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Self

from tessera.cluster.domain.allocation import Allocation
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import Pod, PodGroup
from tessera.cluster.port import Cluster, PodSelector
from tessera.cluster.reflector import Reflector


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """What the cache held at one instant; safe to read while the cache moves on."""

    nodes: Mapping[str, Node]
    pods: Mapping[str, Pod]
    pod_groups: Mapping[str, PodGroup]
    bound_pods: Mapping[str, Pod] = field(default_factory=dict)

    def pods_in_group(self, namespace: str, group: str) -> tuple[Pod, ...]:
        """Pending members of a gang."""
        return tuple(p for p in self.pods.values() if p.namespace == namespace and p.pod_group == group)

    def pods_on(self, node: str) -> tuple[Pod, ...]:
        """Pods that hold resources on a node."""
        return tuple(p for p in self.bound_pods.values() if p.node_name == node)

    def allocations_on(self, node: str) -> tuple[Allocation, ...]:
        """The device assignments Tessera wrote for the pods on a node."""
        return tuple(
            Allocation(p.namespace, p.name, p.assignment)
            for p in self.pods_on(node)
            if p.assignment is not None and p.assignment.node == node
        )


def pod_key(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}"


class ClusterCache:
    """Watches the cluster: all nodes, the pods of ``pod_selector`` (default: pending for Tessera),
    the pods holding resources on nodes (``bound_pods``, off with ``track_bound=False``) and the
    PodGroups of a namespace.

    Use as an async context manager (``async with ClusterCache(cluster) as cache``), which returns
    once every reflector has listed.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        pod_selector: PodSelector | None = None,
        namespace: str | None = None,
        track_bound: bool = True,
    ) -> None:
        selector = pod_selector if pod_selector is not None else PodSelector.pending_for(namespace=namespace)
        self.nodes: Reflector[Node] = Reflector(
            "nodes", cluster.list_nodes, cluster.watch_nodes, key=lambda node: node.name
        )
        self.pods: Reflector[Pod] = Reflector(
            "pods",
            lambda: cluster.list_pods(selector),
            lambda rv: cluster.watch_pods(rv, selector),
            key=pod_key,
        )
        self.pod_groups: Reflector[PodGroup] = Reflector(
            "podgroups",
            lambda: cluster.list_pod_groups(namespace),
            lambda rv: cluster.watch_pod_groups(rv, namespace),
            key=lambda group: group.key,
        )
        bound = PodSelector.holding_resources(namespace)
        self.bound_pods: Reflector[Pod] | None = (
            Reflector(
                "bound-pods",
                lambda: cluster.list_pods(bound),
                lambda rv: cluster.watch_pods(rv, bound),
                key=pod_key,
            )
            if track_bound
            else None
        )
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def reflectors(self) -> tuple[Reflector[Any], ...]:
        extra = (self.bound_pods,) if self.bound_pods is not None else ()
        return (self.nodes, self.pods, self.pod_groups, *extra)

    async def start(self, timeout: float = 30.0) -> None:
        """Start the watches and wait until each has listed. On TimeoutError they go on trying, and
        calling ``start`` again waits for the same watches rather than starting a second set."""
        if not self._tasks:
            self._tasks = [asyncio.create_task(r.run(), name=f"reflector-{r.name}") for r in self.reflectors]
        else:  # a reflector's run() never returns; one that did anyway is started again
            for index, (reflector, task) in enumerate(zip(self.reflectors, self._tasks, strict=True)):
                if task.done():
                    self._tasks[index] = asyncio.create_task(
                        reflector.run(), name=f"reflector-{reflector.name}"
                    )
        async with asyncio.timeout(timeout):
            await asyncio.gather(*(r.synced.wait() for r in self.reflectors))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            nodes=MappingProxyType(dict(self.nodes.store)),
            pods=MappingProxyType(dict(self.pods.store)),
            pod_groups=MappingProxyType(dict(self.pod_groups.store)),
            bound_pods=MappingProxyType(dict(self.bound_pods.store) if self.bound_pods is not None else {}),
        )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
