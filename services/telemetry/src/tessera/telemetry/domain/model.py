"""What telemetry knows of a GPU, and the readings it takes. Pure."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from tessera.contracts.events import NodeInventory


@dataclass(frozen=True)
class Reading:
    node: str
    gpu_index: int
    gpu_uuid: str
    at: datetime
    utilization_pct: float
    memory_used_mib: int
    power_w: float
    temperature_c: float


class GpuSource(Protocol):
    """Where readings come from: a cluster file, NVML on this node, or a dcgm-exporter endpoint."""

    name: str

    def inventory(self) -> list[NodeInventory]: ...

    def read(self, now: datetime) -> list[Reading]: ...


def inventory_digest(nodes: list[NodeInventory]) -> str:
    canonical = json.dumps(
        [n.model_dump(mode="json") for n in sorted(nodes, key=lambda n: n.name)], sort_keys=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
