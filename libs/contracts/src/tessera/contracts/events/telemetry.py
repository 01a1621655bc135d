"""Telemetry's events, version 1: GPU inventory, samples, per-pod usage, faults, idleness and rightsizing."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tessera.contracts import subjects
from tessera.contracts.base import Message


class GpuInventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True


class NodeInventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str] = {}
    gpus: list[GpuInventory] = []


class InventoryChanged(Message):
    TYPE: ClassVar[str] = "io.tessera.telemetry.inventory_changed.v1"
    SUBJECT: ClassVar[str] = subjects.INVENTORY_CHANGED
    SUMMARY: ClassVar[str] = "The full GPU inventory of the nodes this telemetry instance watches."

    source: str = Field(description="the telemetry instance or cluster file reporting")
    nodes: list[NodeInventory]


class GpuSample(Message):
    TYPE: ClassVar[str] = "io.tessera.telemetry.gpu_sample.v1"
    SUBJECT: ClassVar[str] = subjects.ALL_GPU_SAMPLES
    SUMMARY: ClassVar[str] = "One reading of one GPU."

    node: str
    gpu_index: int
    gpu_uuid: str
    at: datetime
    utilization_pct: Annotated[float, Field(ge=0, le=100)]
    memory_used_mib: Annotated[int, Field(ge=0)]
    power_w: Annotated[float, Field(ge=0)]
    temperature_c: float

    def subject(self) -> str:
        return subjects.gpu_samples(self.node)

    def key(self) -> str:
        return self.gpu_uuid


class PodGpuShare(BaseModel):
    """One pod's part of one GPU over the batch's interval, as telemetry attributed it."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    pod: str
    gpu_uuid: str
    gpu_index: int = Field(ge=0)
    utilization_pct: Annotated[
        float,
        Field(ge=0, le=100, description="the GPU's utilisation attributed to the pod (percent of a GPU)"),
    ]
    allocated_milli: Annotated[int, Field(ge=0, le=1000, description="thousandths of the GPU the pod holds")]
    split: Literal["sm", "memory", "requested"] = Field(
        description="how a shared GPU's reading was split: by the pods' processes' SM utilisation, by "
        "their process memory, or by requested share"
    )
    container: str | None = Field(
        None,
        description="the pod's container that held the GPU, when one container did and telemetry "
        "knows which; absent when several did or it cannot tell",
    )


class PodGpuUsage(Message):
    TYPE: ClassVar[str] = "io.tessera.telemetry.pod_gpu_usage.v1"
    SUBJECT: ClassVar[str] = subjects.ALL_POD_GPU_USAGE
    SUMMARY: ClassVar[str] = (
        "Each pod's measured use of the GPUs of one node over one sampling round (one batch per node "
        "per round): what slicing packs time-sliced GPUs by."
    )

    node: str
    at: datetime
    interval_s: float = Field(gt=0, description="the sampling interval the reading stands for")
    pods: list[PodGpuShare] = []

    def subject(self) -> str:
        return subjects.pod_gpu_usage(self.node)

    def key(self) -> str:
        return self.node


class GpuUnhealthy(Message):
    TYPE: ClassVar[str] = "io.tessera.telemetry.gpu_unhealthy.v1"
    SUBJECT: ClassVar[str] = subjects.GPU_UNHEALTHY
    SUMMARY: ClassVar[str] = (
        "A GPU is unfit for work (XID error, ECC errors, heat, power or lost); "
        "reported once per episode, and its recovery shows in the next inventory_changed."
    )

    node: str
    gpu_index: int
    gpu_uuid: str
    faults: list[str] = Field(description="what is wrong: xid, ecc, temperature, power or lost")
    reasons: list[str] = Field(description="the readings behind each fault, for people")
    at: datetime
    xid: int | None = Field(None, description="the last non-benign XID error, when one is the cause")

    def key(self) -> str:
        return self.gpu_uuid


class GpuIdle(Message):
    TYPE: ClassVar[str] = "io.tessera.telemetry.gpu_idle.v1"
    SUBJECT: ClassVar[str] = subjects.GPU_IDLE
    SUMMARY: ClassVar[str] = "A GPU held by pods has done next to no work for a while: reclaim or share it."

    node: str
    gpu_index: int
    gpu_uuid: str
    pods: list[str] = Field(description="namespace/name of the pods holding the GPU")
    idle_since: datetime
    at: datetime
    mean_utilization_pct: Annotated[float, Field(ge=0, le=100)]
    memory_used_mib: Annotated[int, Field(ge=0)]

    def key(self) -> str:
        return self.gpu_uuid


class RightsizingRecommended(Message):
    TYPE: ClassVar[str] = "io.tessera.telemetry.rightsizing_recommended.v1"
    SUBJECT: ClassVar[str] = subjects.RIGHTSIZING_RECOMMENDED
    SUMMARY: ClassVar[str] = (
        "A pod holds more GPU than it uses: its measured p95 fits a smaller share (milli-GPU or MIG "
        "profile), or it held a whole GPU at under 10% for hours; once per container, GPU and kind."
    )

    kind: Literal["fits_smaller_share", "whole_gpu_underused"]
    namespace: str
    pod: str
    container: str = ""
    job_id: str = Field(description="the job the pod belongs to; 'unknown' when no placement names it")
    tenant: str
    queue: str
    node: str
    gpu_uuid: str
    gpu_model: str
    window_start: datetime
    window_end: datetime
    samples: int = Field(ge=0, description="readings behind the percentiles")
    allocated_milli: Annotated[int, Field(ge=0, le=1000, description="the share of the GPU it holds")]
    p95_utilization_pct: Annotated[float, Field(ge=0, le=100, description="in percent of a whole GPU")]
    p95_memory_mib: Annotated[int, Field(ge=0)]
    recommended_milli: Annotated[
        int, Field(ge=1, le=1000, description="a share that fits p95 use and memory with headroom")
    ]
    recommended_mig_profile: str | None = Field(
        None, description="the smallest MIG profile that fits, on a MIG-capable model"
    )
    saving_gpu_hours_per_day: float = Field(ge=0, description="(allocated - recommended) x 24 hours")

    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"
