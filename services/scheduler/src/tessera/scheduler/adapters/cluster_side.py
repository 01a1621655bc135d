"""The cluster as the scheduler watches and changes it: a cache and the port it binds through.

The watching is libs/cluster's :class:`ClusterCache` (reflectors over the `Cluster` port). The
scheduler asks it for every pod, not only those waiting for it: pods of other schedulers hold
capacity, and a placed pod's final phase says whether its gang succeeded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessera.cluster.cache import ClusterCache
from tessera.cluster.port import Cluster, EventType, PodSelector, WatchEvent
from tessera.scheduler.adapters.kube import Evictions

# Called with the kind of object that changed ("node", "pod" or "podgroup") and the event.
WatchHandler = Callable[[str, WatchEvent[Any]], None]


def watch_everything(cluster: Cluster) -> ClusterCache:
    """A cache of every node, pod (any scheduler, any phase) and PodGroup of the cluster."""
    return ClusterCache(cluster, pod_selector=PodSelector(), track_bound=False)


class ClusterSide:
    """What the scheduler holds of a cluster: ``cache`` (watched) and ``cluster`` (the port it binds
    and evicts through). The pods of admitted jobs come from their workloads' controllers.
    ``evictions`` are the pods the scheduler asked to evict that the watches do not show going yet,
    kept across rebuilds (an eviction started before one may land after it).

    ``on_event``, when given, is subscribed at once; otherwise :meth:`subscribe` does it (the
    scheduling engine subscribes itself when it is handed a cluster side).
    """

    def __init__(
        self,
        cluster: Cluster,
        on_event: WatchHandler | None = None,
        *,
        cache: ClusterCache | None = None,
    ) -> None:
        self.cluster = cluster
        self.cache = cache if cache is not None else watch_everything(cluster)
        self._handlers: list[WatchHandler] = []
        self.evictions = Evictions(self._uid_of, self._refused)
        if on_event is not None:
            self.subscribe(on_event)

    def _uid_of(self, key: str) -> str | None:
        pod = self.cache.pods.store.get(key)
        return pod.uid if pod is not None else None

    def _refused(self, key: str) -> None:
        """A pod whose eviction was refused stays: the handlers see it again, as it is now."""
        pod = self.cache.pods.store.get(key)
        if pod is not None:
            for handler in self._handlers:
                handler("pod", WatchEvent(EventType.MODIFIED, pod, pod.resource_version or ""))

    def subscribe(self, on_event: WatchHandler) -> None:
        """Call ``on_event`` for every change the cache takes, in order, with its kind (and for a
        pod whose eviction was refused: :class:`~tessera.scheduler.adapters.kube.Evictions`)."""
        self._handlers.append(on_event)
        self.cache.nodes.subscribe(lambda event: on_event("node", event))
        self.cache.pods.subscribe(lambda event: on_event("pod", event))
        self.cache.pod_groups.subscribe(lambda event: on_event("podgroup", event))

    async def start(self, timeout: float = 30.0) -> None:
        """Start the watches and wait until each has listed; TimeoutError leaves them trying."""
        await self.cache.start(timeout)

    async def stop(self) -> None:
        await self.cache.stop()
