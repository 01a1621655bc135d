"""A cluster file as a GPU source, for the embedded stack and demos: the inventory is the file's
(parsed by `tessera.cluster.cluster_file`, the same reader the devcluster uses, so both agree on
nodes and GPU UUIDs); the load is nil."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tessera.cluster.cluster_file import ClusterFileError, NodeSpec, load_cluster
from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.telemetry.domain.model import Reading

__all__ = ["ClusterFileError", "ClusterFileSource", "load_cluster_file"]


def _inventory(node: NodeSpec) -> NodeInventory:
    gpus = [
        GpuInventory(
            index=i, uuid=node.gpu_uuid(i), model=node.gpu_model or "", memory_mib=node.gpu_memory_mib
        )
        for i in range(node.gpu_count)
    ]
    return NodeInventory(
        name=node.name,
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        labels=dict(node.labels),
        gpus=gpus,
    )


def load_cluster_file(path: Path) -> list[NodeInventory]:
    return [_inventory(node) for node in load_cluster(path)]


class ClusterFileSource:
    """Idle readings for every GPU of a cluster file."""

    def __init__(self, path: Path) -> None:
        self.name = f"cluster-file:{path.name}"
        self._nodes = load_cluster_file(path)

    async def inventory(self) -> list[NodeInventory]:
        return list(self._nodes)

    async def read(self, now: datetime) -> list[Reading]:
        return [
            Reading(n.name, g.index, g.uuid, now, 0.0, 0, 60.0, 32.0, g.model, g.memory_mib)
            for n in self._nodes
            for g in n.gpus
        ]

    async def close(self) -> None:
        return None
