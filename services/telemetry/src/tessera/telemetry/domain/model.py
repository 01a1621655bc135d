"""What telemetry knows of a GPU, the readings it takes, and what it found and announced. Pure."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

from tessera.contracts.events import NodeInventory
from tessera.telemetry.domain.attribution import GpuProcess, MigInstance


@dataclass(frozen=True)
class Reading:
    """One reading of one GPU, whatever the source (NVML, dcgm-exporter, the devcluster)."""

    node: str
    gpu_index: int
    gpu_uuid: str
    at: datetime
    utilization_pct: float
    memory_used_mib: int
    power_w: float
    temperature_c: float
    model: str = ""
    memory_total_mib: int = 0
    #: the enforced board power limit; None when the source does not say
    power_limit_w: float | None = None
    #: XID errors this reading reports (NVML events since the last read, dcgm's last XID, ...)
    xid_errors: tuple[int, ...] = ()
    #: uncorrectable ECC errors (volatile) or failed row remappings: the memory cannot be trusted
    ecc_uncorrected: int = 0
    #: the GPU no longer answers (fell off the bus)
    lost: bool = False
    #: who holds the GPU (namespace/name of pods, or pid/N for bare processes); None: cannot tell
    pods: tuple[str, ...] | None = None
    #: compute processes on the GPU with their memory (and pod, when the source can tell); None: unknown
    processes: tuple[GpuProcess, ...] | None = None
    #: the UUIDs of the GPU's MIG devices, so PodResources' MIG device ids find their GPU
    mig_devices: tuple[str, ...] = ()
    #: the GPU's MIG instances with their own activity, when its utilisation was read per instance
    #: (dcgm-exporter): attribution credits each holder its own instance's use
    mig_instances: tuple[MigInstance, ...] = ()
    #: False when the source had no utilisation for this reading (dcgm-exporter's NaN, or neither its
    #: utilisation nor its engine activity exported): `utilization_pct` is then 0.0 and means nothing;
    #: usage counts the reading's allocation and cost but no use or idle time, idle detection, the
    #: rollups' utilisation and the samples leave it out
    utilization_known: bool = True

    @property
    def allocated(self) -> bool:
        return bool(self.pods)


class GpuSource(Protocol):
    """Where readings come from: a cluster file, NVML on this node, dcgm-exporter or the devcluster."""

    name: str

    async def inventory(self) -> list[NodeInventory]: ...

    async def read(self, now: datetime) -> list[Reading]: ...

    async def close(self) -> None: ...


class SourceUnavailable(RuntimeError):
    """The source cannot be read at all (no NVML library, exporter down); the message says why."""


def inventory_digest(nodes: list[NodeInventory]) -> str:
    canonical = json.dumps(
        [n.model_dump(mode="json") for n in sorted(nodes, key=lambda n: n.name)], sort_keys=True
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Announcement:
    """The inventory a source last announced: its digest, and when."""

    digest: str
    at: datetime


def announcement_due(
    last: Announcement | None, digest: str, now: datetime, republish_after: timedelta
) -> bool:
    """Announce an inventory that changed, or the same one again once `republish_after` has passed
    (samples streams keep a short max-age, so a late subscriber would otherwise never see one)."""
    return last is None or last.digest != digest or now - last.at >= republish_after


class FindingKind(StrEnum):
    UNHEALTHY = "unhealthy"
    IDLE = "idle"


@dataclass(frozen=True)
class GpuFinding:
    """A GPU found unhealthy or idle since `since`; `detail` is the event that announced it. A GPU has
    at most one open finding of each kind."""

    kind: FindingKind
    gpu_uuid: str
    node: str
    gpu_index: int
    since: datetime
    detail: dict[str, Any]

    @property
    def pods(self) -> tuple[str, ...]:
        """Who held an idle GPU when it was found idle."""
        return tuple(str(pod) for pod in self.detail.get("pods", ()))


def with_health(nodes: list[NodeInventory], unhealthy: set[str]) -> list[NodeInventory]:
    """The inventory with the GPUs telemetry found unhealthy marked so."""
    if not unhealthy:
        return nodes
    return [
        n.model_copy(
            update={
                "gpus": [
                    g.model_copy(update={"healthy": g.healthy and g.uuid not in unhealthy}) for g in n.gpus
                ]
            }
        )
        for n in nodes
    ]
