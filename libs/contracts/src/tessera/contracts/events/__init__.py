"""Commands and events, version 1. Add fields only; a breaking change is a new type version.

Each service's messages live in a module of this package (admission, scheduler, telemetry,
checkpoint, forecaster; slicing's in :mod:`tessera.contracts.slicing`); they are all importable
from here, and :data:`ALL` and :data:`BY_TYPE` list every one of them."""

from __future__ import annotations

from tessera.contracts import subjects
from tessera.contracts.base import FieldError, Message
from tessera.contracts.events.admission import (
    JobAccepted,
    JobAdmitted,
    JobFinished,
    JobRejected,
    JobStateChanged,
    PreemptionRequested,
    ReportJobOutcome,
    SubmitJob,
)
from tessera.contracts.events.checkpoint import (
    _CHECKPOINT_IDS,
    CheckpointFailed,
    CheckpointSaved,
    ReadyForEviction,
    ReportCheckpoint,
    SaveCheckpoint,
    checkpoint_id,
)
from tessera.contracts.events.forecaster import ForecastUpdated, RecordMetric, ShapeDemand
from tessera.contracts.events.scheduler import (
    DemandChanged,
    GangFinished,
    GangPlaced,
    GangUnschedulable,
    GpuAssignment,
    GpuDemand,
    PodPlacement,
    PodsEvicted,
)
from tessera.contracts.events.telemetry import (
    GpuIdle,
    GpuInventory,
    GpuSample,
    GpuUnhealthy,
    InventoryChanged,
    NodeInventory,
    PodGpuShare,
    PodGpuUsage,
    RightsizingRecommended,
)
from tessera.contracts.jobs import JobSpec
from tessera.contracts.slicing import LayoutPlanned, ReconfigFailed, Reconfigured

__all__ = [
    "ALL",
    "BY_TYPE",
    "_CHECKPOINT_IDS",
    "CheckpointFailed",
    "CheckpointSaved",
    "DemandChanged",
    "FieldError",
    "ForecastUpdated",
    "GangFinished",
    "GangPlaced",
    "GangUnschedulable",
    "GpuAssignment",
    "GpuDemand",
    "GpuIdle",
    "GpuInventory",
    "GpuSample",
    "GpuUnhealthy",
    "InventoryChanged",
    "JobAccepted",
    "JobAdmitted",
    "JobFinished",
    "JobRejected",
    "JobSpec",
    "JobStateChanged",
    "LayoutPlanned",
    "Message",
    "NodeInventory",
    "PodGpuShare",
    "PodGpuUsage",
    "PodPlacement",
    "PodsEvicted",
    "PreemptionRequested",
    "ReadyForEviction",
    "ReconfigFailed",
    "Reconfigured",
    "RecordMetric",
    "ReportCheckpoint",
    "ReportJobOutcome",
    "RightsizingRecommended",
    "SaveCheckpoint",
    "ShapeDemand",
    "SubmitJob",
    "checkpoint_id",
    "subjects",
]

ALL: tuple[type[Message], ...] = (
    RightsizingRecommended,
    SubmitJob,
    JobAccepted,
    JobRejected,
    JobAdmitted,
    GangPlaced,
    GangUnschedulable,
    InventoryChanged,
    GpuSample,
    PodGpuUsage,
    PreemptionRequested,
    JobStateChanged,
    JobFinished,
    ReportJobOutcome,
    GpuUnhealthy,
    GpuIdle,
    GangFinished,
    PodsEvicted,
    DemandChanged,
    SaveCheckpoint,
    ReportCheckpoint,
    CheckpointSaved,
    CheckpointFailed,
    ReadyForEviction,
    RecordMetric,
    ForecastUpdated,
    LayoutPlanned,
    Reconfigured,
    ReconfigFailed,
)
BY_TYPE: dict[str, type[Message]] = {m.TYPE: m for m in ALL}
