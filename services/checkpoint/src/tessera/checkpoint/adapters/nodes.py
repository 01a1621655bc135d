"""The cluster's nodes through the official `kubernetes` client: the cluster library's list-and-watch
(`Reflector` over `KubernetesCluster`), which resumes from the last version and relists on expiry.

Level-triggered, as Kubernetes controllers are: a change only marks its node; the service reads the
node as it is when it gets to it, and a node whose handling failed is simply marked again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path

from tessera.checkpoint.domain.signals import NodeState
from tessera.cluster.domain.node import Node
from tessera.cluster.kube import KubernetesCluster, api_client
from tessera.cluster.port import WatchEvent
from tessera.cluster.reflector import Reflector


def node_state(node: Node) -> NodeState:
    return NodeState(
        name=node.name,
        labels=dict(node.labels),
        annotations=dict(node.annotations),
        taints={taint.key: taint.value for taint in node.taints},
    )


class KubeNodeWatch:
    def __init__(self, kubeconfig: Path, *, sync_timeout_s: float = 30.0) -> None:
        self.kubeconfig = kubeconfig
        self.sync_timeout_s = sync_timeout_s
        self.changed = asyncio.Event()
        self._dirty: set[str] = set()
        self._cluster: KubernetesCluster | None = None
        self._nodes: Reflector[Node] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._nodes is None:
            self._cluster = cluster = KubernetesCluster(api_client(kubeconfig=str(self.kubeconfig)))
            self._nodes = Reflector("nodes", cluster.list_nodes, cluster.watch_nodes, key=lambda n: n.name)
            self._nodes.subscribe(self._on_event)
            self._task = asyncio.create_task(self._nodes.run(), name="checkpoint-node-reflector")
        async with asyncio.timeout(self.sync_timeout_s):
            await self._nodes.synced.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._cluster is not None:
            await self._cluster.close()
            self._cluster = None
        self._nodes = None

    def take(self) -> Mapping[str, NodeState | None]:
        names, self._dirty = self._dirty, set()
        self.changed.clear()
        store = self._nodes.store if self._nodes is not None else {}
        return {name: node_state(store[name]) if name in store else None for name in names}

    def retry(self, names: set[str]) -> None:
        if names:
            self._dirty |= names
            self.changed.set()

    def _on_event(self, event: WatchEvent[Node]) -> None:
        self._dirty.add(event.object.name)
        self.changed.set()
