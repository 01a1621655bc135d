"""Each GPU's current layout, read from the nodes the devcluster's GPU Operator publishes: the GPUs
annotation (MIG instances), the device plugin's replicas and sharing strategy, and the MIG manager's
config and state labels. `tessera devcluster layout` prints it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.cluster.conventions import (
    DEVICE_PLUGIN_CONFIG_LABEL,
    GPU_REPLICAS_LABEL,
    GPU_SHARING_STRATEGY_LABEL,
    MIG_CONFIG_LABEL,
    MIG_CONFIG_STATE_LABEL,
    NODE_GPUS_ANNOTATION,
    decode_gpus,
)
from tessera.cluster.domain.gpu import GpuHealth
from tessera.devcluster.sim.gpu_operator import OPERAND_LABELS, PAUSED_FOR_MIG_CHANGE

COLUMNS = ("NODE", "GPU", "MODEL", "LAYOUT", "HEALTH", "MIG.CONFIG", "STATE", "DEVICE-PLUGIN.CONFIG")


@dataclass(frozen=True)
class GpuRow:
    node: str
    index: int
    model: str
    layout: str
    health: str
    mig_config: str
    mig_state: str
    device_plugin_config: str

    def cells(self) -> tuple[str, ...]:
        return (
            self.node,
            str(self.index),
            self.model,
            self.layout,
            self.health,
            self.mig_config,
            self.mig_state,
            self.device_plugin_config,
        )


def gpu_rows(nodes: Iterable[Mapping[str, Any]]) -> list[GpuRow]:
    """One row per GPU of every node that has GPUs, in node and index order."""
    rows = []
    for node in nodes:
        metadata = node.get("metadata") or {}
        labels: Mapping[str, str] = metadata.get("labels") or {}
        text = (metadata.get("annotations") or {}).get(NODE_GPUS_ANNOTATION)
        if not text:
            continue
        paused = labels.get(OPERAND_LABELS[0]) == PAUSED_FOR_MIG_CHANGE
        replicas = int(labels.get(GPU_REPLICAS_LABEL, "1") or 1)
        strategy = labels.get(GPU_SHARING_STRATEGY_LABEL, "none")
        for gpu in decode_gpus(text):
            if paused:
                layout = "reconfiguring"
            elif gpu.mig_enabled:
                layout = "mig: " + (
                    ", ".join(f"{i.profile}@{i.start}" for i in gpu.mig_instances) or "no instances"
                )
            elif replicas > 1:
                layout = f"{strategy} x{replicas}"
            else:
                layout = "exclusive"
            rows.append(
                GpuRow(
                    node=metadata.get("name", ""),
                    index=gpu.index,
                    model=gpu.model,
                    layout=layout,
                    health="healthy" if gpu.health is GpuHealth.HEALTHY else gpu.health.value,
                    mig_config=labels.get(MIG_CONFIG_LABEL, "-"),
                    mig_state=labels.get(MIG_CONFIG_STATE_LABEL, "-"),
                    device_plugin_config=labels.get(DEVICE_PLUGIN_CONFIG_LABEL, "-"),
                )
            )
    return sorted(rows, key=lambda r: (r.node, r.index))


def render(rows: Iterable[GpuRow]) -> str:
    """A plain table, columns padded as kubectl pads them."""
    table = [COLUMNS, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    return "\n".join(
        "   ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table
    )
