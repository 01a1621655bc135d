"""Events of the slicing service, version 1: a layout planned for a node, applied, or not applied.

Every event names the operation it belongs to (one per node change, see the slicing ADR 0022) and
says why, so an operator can follow a node's reconfiguration from plan to outcome."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tessera.contracts import subjects
from tessera.contracts.base import Message

SharingKind = Literal["exclusive", "mig", "time_slicing", "mps"]


class GpuLayoutSpec(BaseModel):
    """How one GPU of a node is shared."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(ge=0, description="the GPU's index on its node")
    kind: SharingKind
    mig_profiles: list[str] = Field(
        default_factory=list, description="the MIG instances' profiles (kind `mig`), e.g. 3g.40gb"
    )
    replicas: int = Field(1, ge=1, description="time-slicing or MPS replicas (1 otherwise)")


class LayoutPlanned(Message):
    TYPE: ClassVar[str] = "io.tessera.slicing.layout_planned.v1"
    SUBJECT: ClassVar[str] = subjects.LAYOUT_PLANNED
    SUMMARY: ClassVar[str] = "Slicing decided to change how a node's GPUs are shared; the change starts now."

    operation_id: str
    node: str
    kind: SharingKind = Field(description="what the change configures: mig, or time_slicing / mps")
    config: str = Field(description="the mig-parted or device-plugin config name the node will carry")
    gpus: list[GpuLayoutSpec] = Field(description="the GPUs the change touches, as they will be")
    drain: bool = Field(description="the node is cordoned and its affected GPUs drained first")
    reason: str = Field(description="why: the demand the change serves")

    def key(self) -> str:
        return self.node


class Reconfigured(Message):
    TYPE: ClassVar[str] = "io.tessera.slicing.reconfigured.v1"
    SUBJECT: ClassVar[str] = subjects.RECONFIGURED
    SUMMARY: ClassVar[str] = "A node's GPUs now have the planned layout, and the node advertises it."

    operation_id: str
    node: str
    kind: SharingKind
    config: str
    gpus: list[GpuLayoutSpec]
    attempts: int = Field(ge=1, description="applies it took")
    duration_s: float = Field(ge=0, description="from planned to verified")
    resources: dict[str, int] = Field(
        default_factory=dict, description="the GPU resources the node advertises now"
    )
    reason: str

    def key(self) -> str:
        return self.node


class ReconfigFailed(Message):
    TYPE: ClassVar[str] = "io.tessera.slicing.reconfig_failed.v1"
    SUBJECT: ClassVar[str] = subjects.RECONFIG_FAILED
    SUMMARY: ClassVar[str] = (
        "A node's planned layout was not applied: rolled back before anything changed, "
        "left cordoned after its retries, or ended because the node is gone."
    )

    operation_id: str
    node: str
    kind: SharingKind
    config: str
    outcome: Literal["rolled_back", "left_cordoned", "node_gone"] = Field(
        description=(
            "rolled_back: the node is as it was and schedulable; left_cordoned: it needs a person; "
            "node_gone: the node was deleted after a config was written (nothing is left cordoned)"
        )
    )
    attempts: int = Field(ge=0, description="applies tried")
    reason: str = Field(description="why, in words that name the GPU, config or pods at fault")

    def key(self) -> str:
        return self.node
