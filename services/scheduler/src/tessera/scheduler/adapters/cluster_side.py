"""The cluster as the scheduler watches and changes it: a cache and the port it binds through.

The watching is libs/cluster's :class:`ClusterCache` (reflectors over the `Cluster` port). The
scheduler asks it for every pod, not only those waiting for it: pods of other schedulers hold
capacity, and a placed pod's final phase says whether its gang succeeded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tessera.cluster.cache import ClusterCache
from tessera.cluster.port import Cluster, PodSelector, WatchEvent

# Called with the kind of object that changed ("node", "pod" or "podgroup") and the event.
WatchHandler = Callable[[str, WatchEvent[Any]], None]


def watch_everything(cluster: Cluster) -> ClusterCache:
    """A cache of every node, pod (any scheduler, any phase) and PodGroup of the cluster."""
    return ClusterCache(cluster, pod_selector=PodSelector(), track_bound=False)


class ClusterSide:
    """What the scheduler holds of a cluster: ``cache`` (watched) and ``cluster`` (the port it binds
    and evicts through). The pods of admitted jobs come from their workloads' controllers.

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
        if on_event is not None:
            self.subscribe(on_event)

    def subscribe(self, on_event: WatchHandler) -> None:
        """Call ``on_event`` for every change the cache takes, in order, with its kind."""
        self.cache.nodes.subscribe(lambda event: on_event("node", event))
        self.cache.pods.subscribe(lambda event: on_event("pod", event))
        self.cache.pod_groups.subscribe(lambda event: on_event("podgroup", event))

    async def start(self, timeout: float = 30.0) -> None:
        """Start the watches and wait until each has listed; TimeoutError leaves them trying."""
        await self.cache.start(timeout)

    async def stop(self) -> None:
        await self.cache.stop()
