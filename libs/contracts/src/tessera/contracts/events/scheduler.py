"""The scheduler's events, version 1: gangs placed, unschedulable, finished or evicted, and the demand that waits."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from tessera.contracts import subjects
from tessera.contracts.base import Message


class GpuAssignment(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str
    milli: Annotated[int, Field(ge=1, le=1000)]


class PodPlacement(BaseModel):
    model_config = ConfigDict(frozen=True)

    pod: str
    group: str
    node: str
    gpus: list[GpuAssignment] = []
    namespace: str = Field(
        "",
        description=(
            "the pod's namespace; pods are told apart by namespace and name. Empty in events from "
            "before it was sent: consumers then match the pod by its name alone"
        ),
    )


class GangPlaced(Message):
    TYPE: ClassVar[str] = "io.tessera.scheduler.gang_placed.v1"
    SUBJECT: ClassVar[str] = subjects.GANG_PLACED
    SUMMARY: ClassVar[str] = "Every pod of the job's gang is placed and bound."

    job_id: str
    placements: list[PodPlacement]

    def key(self) -> str:
        return self.job_id


class GangUnschedulable(Message):
    TYPE: ClassVar[str] = "io.tessera.scheduler.gang_unschedulable.v1"
    SUBJECT: ClassVar[str] = subjects.GANG_UNSCHEDULABLE
    SUMMARY: ClassVar[str] = "The gang cannot be placed now; nothing is held for it."

    job_id: str
    message: str
    rejected_nodes: Annotated[
        dict[str, int], Field(description="reason -> number of nodes rejected for it")
    ] = {}

    def key(self) -> str:
        return self.job_id


class GangFinished(Message):
    TYPE: ClassVar[str] = "io.tessera.scheduler.gang_finished.v1"
    SUBJECT: ClassVar[str] = subjects.GANG_FINISHED
    SUMMARY: ClassVar[str] = "Every placed pod of the gang ended; its GPUs are free again."

    job_id: str
    succeeded: bool = Field(description="every pod ended Succeeded")
    pods: Annotated[dict[str, str], Field(description="pod -> its last phase")] = {}

    def key(self) -> str:
        return self.job_id


class PodsEvicted(Message):
    TYPE: ClassVar[str] = "io.tessera.scheduler.pods_evicted.v1"
    SUBJECT: ClassVar[str] = subjects.PODS_EVICTED
    SUMMARY: ClassVar[str] = (
        "The scheduler evicted pods of a gang it could not keep whole; nothing stays held."
    )

    job_id: str
    pods: list[str]
    reason: str = Field(description="why: bind_failed, node_lost, partial_after_restart, ...")
    message: str = ""

    def key(self) -> str:
        return self.job_id


class GpuDemand(BaseModel):
    """Pods of one shape that wait for GPUs."""

    model_config = ConfigDict(frozen=True)

    gpus: int = Field(ge=0, description="whole GPUs per pod (1 for a share of one GPU)")
    milli: int = Field(ge=1, le=1000, description="thousandths of each GPU per pod")
    mig_profile: str | None = None
    models: list[str] = []
    pods: int = Field(ge=1)


class DemandChanged(Message):
    TYPE: ClassVar[str] = "io.tessera.scheduler.demand_changed.v1"
    SUBJECT: ClassVar[str] = subjects.DEMAND_CHANGED
    SUMMARY: ClassVar[str] = "The GPU demand of the gangs that wait, by pod shape, changed (for slicing)."

    pending_gangs: int = Field(ge=0)
    demand: list[GpuDemand] = []

    def key(self) -> str:
        return "cluster"
