"""What the simulated kubelet, GPU Operator and NVML share: nodes, device holdings, settings, the clock."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from tessera.cluster.conventions import SIM_DURATION_ANNOTATION
from tessera.devcluster.apiserver.store import ObjectStore
from tessera.devcluster.sim.devices import Holding
from tessera.devcluster.sim.state import SimClock, SimNode
from tessera.devcluster.sim.trainer import TrainerSettings

SIM_EXIT_CODE_ANNOTATION = "tessera.io/sim-exit-code"

__all__ = ["SIM_DURATION_ANNOTATION", "SIM_EXIT_CODE_ANNOTATION", "PodDevices", "SimContext", "SimSettings"]


@dataclass(frozen=True)
class SimSettings:
    """Simulated delays, in simulated seconds (divided by `speed` to get wall-clock seconds)."""

    speed: float = 1.0
    pod_start_seconds: float = 1.0
    mig_reconfigure_seconds: float = 5.0
    #: how long a pod without `tessera.io/sim-duration` runs; None: until it is deleted
    default_pod_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.speed <= 0:
            raise ValueError(f"speed: must be positive, got {self.speed}")
        for name in ("pod_start_seconds", "mig_reconfigure_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must not be negative, got {getattr(self, name)}")
        if self.default_pod_seconds is not None and self.default_pod_seconds < 0:
            raise ValueError(f"default_pod_seconds: must not be negative, got {self.default_pod_seconds}")


@dataclass
class PodDevices:
    """The devices a pod on a node holds, from admission until it ends."""

    node: str
    uid: str
    holdings: list[Holding]
    profile: str
    running: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass
class SimContext:
    store: ObjectStore
    settings: SimSettings
    nodes: dict[str, SimNode]
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    clock: SimClock = field(init=False)
    devices: dict[str, PodDevices] = field(default_factory=dict)  # by namespace/name
    lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        self.clock = SimClock(self.settings.speed)

    def holdings_on(self, node: str) -> list[Holding]:
        with self.lock:
            return [h for d in self.devices.values() if d.node == node for h in d.holdings]
