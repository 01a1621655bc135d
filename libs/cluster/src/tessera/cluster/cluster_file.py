"""Cluster files: the nodes of a development cluster, as YAML or the openb node CSV.

The YAML form is the one the telemetry service reads for the embedded stack, so both agree on the
inventory (and on GPU UUIDs)::

    nodes:
      - name: gpu-node-0        # or `name_prefix` with `count` for a group of identical nodes
        cpu: "96"
        memory: 1Ti
        labels: {nvidia.com/mig.config: all-disabled}
        gpus: {count: 8, model: A100-80GB, memory_mib: 81920}

The openb CSV (`sn,cpu_milli,memory_mib,gpu,model`) is the Alibaba 2023 GPU cluster trace's node list.
"""

from __future__ import annotations

import csv
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tessera.cluster.catalogue import model as catalogue_model
from tessera.cluster.conventions import quantity

_NODE_KEYS = {"name", "name_prefix", "count", "cpu", "memory", "labels", "gpus"}
_GPU_KEYS = {"count", "model", "memory_mib"}


class ClusterFileError(ValueError):
    """A cluster file that cannot be used; the message names the file, the field and the reason."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_model: str | None = None
    gpu_count: int = 0
    gpu_memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)

    def gpu_uuid(self, index: int) -> str:
        return gpu_uuid(self.name, index)


def gpu_uuid(node: str, index: int) -> str:
    """Stable GPU UUIDs, the same the telemetry service derives from a cluster file."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{index}.tessera')}"


def default_cluster() -> list[NodeSpec]:
    """Four nodes of eight A100-80GB GPUs, as examples/clusters/dev-4x8.yaml describes them."""
    labels = {"topology.kubernetes.io/zone": "rack-a"}
    return [NodeSpec(f"gpu-node-{i}", 96_000, 1_048_576, "A100-80GB", 8, 81920, labels) for i in range(4)]


def load_cluster(path: str | Path, *, limit: int | None = None) -> list[NodeSpec]:
    """Nodes from a YAML cluster file or an openb node CSV (by extension); `limit` keeps the first N."""
    source = Path(path)
    if not source.exists():
        raise ClusterFileError(f"{source}: no such cluster file")
    nodes = _load_csv(source) if source.suffix.lower() == ".csv" else _load_yaml(source)
    if limit is not None:
        if limit < 1:
            raise ClusterFileError(f"{source}: limit must be at least 1, got {limit}")
        nodes = nodes[:limit]
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise ClusterFileError(f"{source}: node name {node.name!r} repeats")
        seen.add(node.name)
    return nodes


def _cpu_milli(value: Any, where: str) -> int:
    try:
        return quantity.cpu_milli(value, where)
    except ValueError:
        raise ClusterFileError(f"{where}: {value!r} is not a CPU quantity such as 96 or 500m") from None


def _memory_mib(value: Any, where: str) -> int:
    try:
        return quantity.memory_mib(value, where)
    except ValueError:
        raise ClusterFileError(f"{where}: {value!r} is not a memory quantity such as 512Gi") from None


def _load_yaml(source: Path) -> list[NodeSpec]:
    try:
        raw = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterFileError(f"{source}: cannot read: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list) or not raw["nodes"]:
        raise ClusterFileError(f"{source}: nodes: expected a non-empty list of nodes")
    extra = set(raw) - {"nodes"}
    if extra:
        raise ClusterFileError(f"{source}: unknown top-level keys {sorted(extra)}")
    nodes: list[NodeSpec] = []
    for i, entry in enumerate(raw["nodes"]):
        nodes.extend(_entry(entry, f"{source}: nodes[{i}]"))
    return nodes


def _entry(entry: Any, where: str) -> list[NodeSpec]:
    if not isinstance(entry, dict):
        raise ClusterFileError(f"{where}: expected a mapping")
    extra = set(entry) - _NODE_KEYS
    if extra:
        raise ClusterFileError(f"{where}: unknown keys {sorted(extra)}")
    name, prefix = entry.get("name"), entry.get("name_prefix")
    if (name is None) == (prefix is None):
        raise ClusterFileError(f"{where}: give exactly one of name or name_prefix")
    count = entry.get("count", 1)
    if not isinstance(count, int) or count < 1:
        raise ClusterFileError(f"{where}.count: expected an integer >= 1, got {count!r}")
    if name is not None and count != 1:
        raise ClusterFileError(f"{where}.count: count needs name_prefix, not name")
    labels = entry.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ClusterFileError(f"{where}.labels: expected a mapping of strings")
    cpu = _cpu_milli(entry.get("cpu", "64"), f"{where}.cpu")
    memory = _memory_mib(entry.get("memory", "512Gi"), f"{where}.memory")
    model_name, gpu_count, gpu_memory = _gpus(entry.get("gpus"), f"{where}.gpus")
    names = [str(name)] if name is not None else [f"{prefix}{i}" for i in range(count)]
    return [NodeSpec(n, cpu, memory, model_name, gpu_count, gpu_memory, dict(labels)) for n in names]


def _gpus(gpus: Any, where: str) -> tuple[str | None, int, int]:
    if gpus is None:
        return None, 0, 0
    if not isinstance(gpus, dict):
        raise ClusterFileError(f"{where}: expected a mapping with count and model")
    extra = set(gpus) - _GPU_KEYS
    if extra:
        raise ClusterFileError(f"{where}: unknown keys {sorted(extra)}")
    count, model_name = gpus.get("count"), gpus.get("model")
    if not isinstance(count, int) or not 0 <= count <= 16:
        raise ClusterFileError(f"{where}.count: expected an integer in 0..16, got {count!r}")
    if not isinstance(model_name, str) or not model_name:
        raise ClusterFileError(f"{where}.model: expected a GPU model name such as A100-80GB")
    memory = gpus.get("memory_mib")
    if memory is None:
        memory = catalogue_model(model_name).memory_mib or 16384
    if not isinstance(memory, int) or memory < 1:
        raise ClusterFileError(f"{where}.memory_mib: expected a positive integer, got {memory!r}")
    entry = catalogue_model(model_name)
    return (entry.name if entry.known else model_name), count, memory


def _load_csv(source: Path) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    with source.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"sn", "cpu_milli", "memory_mib", "gpu", "model"} - set(reader.fieldnames or [])
        if missing:
            raise ClusterFileError(f"{source}: missing columns {sorted(missing)} (an openb node list?)")
        for row_number, row in enumerate(reader, start=2):
            where = f"{source}: line {row_number}"
            try:
                cpu, memory, count = int(row["cpu_milli"]), int(row["memory_mib"]), int(row["gpu"])
            except ValueError:
                raise ClusterFileError(f"{where}: cpu_milli, memory_mib and gpu must be integers") from None
            entry = catalogue_model(row["model"])
            name = entry.name if entry.known else row["model"]
            gpu_memory = entry.memory_mib or 16384
            nodes.append(
                NodeSpec(row["sn"], cpu, memory, name if count else None, count, gpu_memory if count else 0)
            )
    if not nodes:
        raise ClusterFileError(f"{source}: no nodes")
    return nodes
