"""The simulated hardware: GPUs with their MIG layout and injected faults, grouped by node."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum

from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.domain.gpu import MigInstance


class FaultKind(StrEnum):
    XID = "xid"
    OVERHEATING = "overheating"
    LOST = "lost"
    SPOT_INTERRUPTION = "spot-interruption"  # the whole node: a notice, then the node's deletion


# XIDs the NVIDIA device plugin does not treat as making a GPU unhealthy (its default skip list).
BENIGN_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass
class SimGpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_instances: tuple[MigInstance, ...] = ()
    mig_enabled: bool = False
    xids: list[int] = field(default_factory=list)
    overheating: bool = False
    lost: bool = False

    @property
    def healthy(self) -> bool:
        return not self.lost and all(code in BENIGN_XIDS for code in self.xids)

    def clear_faults(self) -> None:
        self.xids.clear()
        self.overheating = False
        self.lost = False


@dataclass
class SimNode:
    spec: NodeSpec
    gpus: list[SimGpu]
    address: str
    applied_mig_config: str | None = None  # the layout the GPUs are in
    attempted_mig_config: str | None = None  # the last label value the MIG manager acted on
    mig_reconfiguring: bool = False
    lost: bool = False
    replicas: int = 1  # time-slicing replicas of the device plugin's current config

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def from_spec(cls, spec: NodeSpec, ordinal: int) -> SimNode:
        gpus = [
            SimGpu(i, spec.gpu_uuid(i), spec.gpu_model or "unknown", spec.gpu_memory_mib)
            for i in range(spec.gpu_count)
        ]
        return cls(spec, gpus, f"10.0.{ordinal // 250}.{ordinal % 250 + 1}")


class SimClock:
    """Simulated time: `speed` simulated seconds pass per wall-clock second."""

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self.speed = speed
        self._started = time.monotonic()

    def now(self) -> float:
        """Simulated seconds since the clock started."""
        return (time.monotonic() - self._started) * self.speed

    async def sleep(self, simulated_seconds: float) -> None:
        await asyncio.sleep(max(0.0, simulated_seconds) / self.speed)
