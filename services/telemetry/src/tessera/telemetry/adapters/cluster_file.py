"""A cluster file: YAML listing nodes and their GPUs, for the embedded stack and demos.

nodes:
  - name: gpu-node-0        # or `name_prefix` with `count` for a group of identical nodes
    cpu: "96"
    memory: 1Ti
    labels: {topology.kubernetes.io/zone: rack-a}
    gpus: {count: 8, model: A100-80GB, memory_mib: 81920}
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.contracts.quantities import parse_cpu_milli, parse_memory_mib
from tessera.contracts.validation import field_errors
from tessera.telemetry.domain.model import Reading

DEFAULT_GPU_MEMORY_MIB = {
    "A100-80GB": 81920,
    "A100-40GB": 40960,
    "H100-80GB": 81920,
    "H200": 143360,
    "T4": 15360,
    "A10": 23028,
    "L4": 23034,
    "V100-16GB": 16384,
    "V100-32GB": 32768,
    "A30": 24576,
}


class ClusterFileError(ValueError):
    pass


class GpuGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: Annotated[int, Field(ge=0, le=16)]
    model: str
    memory_mib: Annotated[int | None, Field(ge=1)] = None


class NodeEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    name_prefix: str | None = None
    count: Annotated[int, Field(ge=1, le=10000)] = 1
    cpu: str | int = "64"
    memory: str | int = "512Gi"
    labels: dict[str, str] = {}
    gpus: GpuGroup | None = None

    @model_validator(mode="after")
    def _named(self) -> NodeEntry:
        if (self.name is None) == (self.name_prefix is None):
            raise ValueError("give exactly one of name or name_prefix")
        if self.name is not None and self.count != 1:
            raise ValueError("count needs name_prefix, not name")
        return self


class ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: Annotated[list[NodeEntry], Field(min_length=1)]


def _gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}.tessera')}"


def load_cluster_file(path: Path) -> list[NodeInventory]:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterFileError(f"{path}: cannot read: {exc}") from exc
    try:
        spec = ClusterFile.model_validate(raw)
    except ValidationError as exc:
        reasons = "; ".join(f"{e.field}: {e.reason}" for e in field_errors(exc))
        raise ClusterFileError(f"{path}: {reasons}") from exc
    nodes: list[NodeInventory] = []
    for entry in spec.nodes:
        names = [entry.name] if entry.name else [f"{entry.name_prefix}{i}" for i in range(entry.count)]
        for name in names:
            assert name is not None
            gpus = []
            if entry.gpus:
                memory = entry.gpus.memory_mib or DEFAULT_GPU_MEMORY_MIB.get(entry.gpus.model, 16384)
                gpus = [
                    GpuInventory(index=i, uuid=_gpu_uuid(name, i), model=entry.gpus.model, memory_mib=memory)
                    for i in range(entry.gpus.count)
                ]
            nodes.append(
                NodeInventory(
                    name=name,
                    cpu_milli=parse_cpu_milli(entry.cpu),
                    memory_mib=parse_memory_mib(entry.memory),
                    labels=entry.labels,
                    gpus=gpus,
                )
            )
    duplicates = sorted({n.name for n in nodes if sum(m.name == n.name for m in nodes) > 1})
    if duplicates:
        raise ClusterFileError(f"{path}: node names repeat: {', '.join(duplicates)}")
    return nodes


class ClusterFileSource:
    """Idle readings for every GPU of a cluster file: the inventory is real, the load is nil."""

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
