"""Commands and events, version 1. Add fields only; a breaking change is a new type version."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from tessera.contracts import subjects
from tessera.contracts.base import FieldError, Message
from tessera.contracts.jobs import JobSpec
from tessera.contracts.slicing import LayoutPlanned, ReconfigFailed, Reconfigured


class SubmitJob(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.submit_job.v1"
    SUBJECT: ClassVar[str] = subjects.SUBMIT_JOB
    SUMMARY: ClassVar[str] = "Submit a job; answered by job_accepted or job_rejected."

    job_id: Annotated[
        str | None, Field(description="optional client-chosen id; makes resubmission idempotent")
    ] = None
    spec: dict[str, object] = Field(description="a JobSpec; validated by admission, not by the transport")

    def key(self) -> str:
        return self.job_id or ""


class JobAccepted(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.job_accepted.v1"
    SUBJECT: ClassVar[str] = subjects.JOB_ACCEPTED
    SUMMARY: ClassVar[str] = "A valid job was stored and queued."

    job_id: str
    name: str
    tenant: str
    queue: str

    def key(self) -> str:
        return self.job_id


class JobRejected(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.job_rejected.v1"
    SUBJECT: ClassVar[str] = subjects.JOB_REJECTED
    SUMMARY: ClassVar[str] = "A submission was refused; each error names the field and the reason."

    job_id: str
    name: str | None = None
    errors: list[FieldError]

    def key(self) -> str:
        return self.job_id


class JobAdmitted(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.job_admitted.v1"
    SUBJECT: ClassVar[str] = subjects.JOB_ADMITTED
    SUMMARY: ClassVar[str] = "Quota allows the job; the scheduler may place it."

    job_id: str
    spec: JobSpec
    submitted_at: datetime
    resume_from: str | None = Field(
        None,
        description=(
            "the checkpoint the job resumes from: the newest one saved before it was preempted, for "
            "TESSERA_CHECKPOINT_URI in its pods; none when it has none"
        ),
    )

    def key(self) -> str:
        return self.job_id


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


class PreemptionRequested(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.preemption_requested.v1"
    SUBJECT: ClassVar[str] = subjects.PREEMPTION_REQUESTED
    SUMMARY: ClassVar[str] = (
        "Admission needs an admitted job's quota back: evict it (after a checkpoint when it can take one)."
    )

    victim_job_id: str
    preemptor_job_id: str
    reason: str = Field(description="InQueuePriority, InCohortReclamation or InCohortReclaimWhileBorrowing")
    deadline: datetime = Field(description="the preemptor is admitted at the latest by then")
    grace_period_s: float = Field(ge=0, description="time the victim gets to save state before eviction")
    checkpointable: bool = False
    forced: bool = Field(False, description="the deadline passed: the victim's quota is already handed on")

    def key(self) -> str:
        return self.victim_job_id


class JobStateChanged(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.job_state_changed.v1"
    SUBJECT: ClassVar[str] = subjects.JOB_STATE_CHANGED
    SUMMARY: ClassVar[str] = "A job moved along its lifecycle, or the reason it waits changed."

    job_id: str
    tenant: str
    queue: str
    previous_state: str | None = None
    state: str
    reason: str
    at: datetime

    def key(self) -> str:
        return self.job_id


class JobFinished(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.job_finished.v1"
    SUBJECT: ClassVar[str] = subjects.JOB_FINISHED
    SUMMARY: ClassVar[str] = "A job left the cluster for good or was preempted: its quota is free again."

    job_id: str
    state: str = Field(description="succeeded, failed, preempted or cancelled")
    reason: str
    at: datetime

    def key(self) -> str:
        return self.job_id


class ReportJobOutcome(Message):
    TYPE: ClassVar[str] = "io.tessera.admission.report_job_outcome.v1"
    SUBJECT: ClassVar[str] = subjects.REPORT_JOB_OUTCOME
    SUMMARY: ClassVar[str] = (
        "Whoever runs a job reports it running, succeeded, failed or released after a preemption."
    )

    job_id: str
    state: str = Field(description="running, succeeded, failed or preempted (released)")
    reason: str = ""

    def key(self) -> str:
        return self.job_id


class SaveCheckpoint(Message):
    TYPE: ClassVar[str] = "io.tessera.checkpoint.save_checkpoint.v1"
    SUBJECT: ClassVar[str] = subjects.ALL_SAVE_CHECKPOINT
    SUMMARY: ClassVar[str] = (
        "The checkpoint service asks one job's training process to checkpoint at its next safe point; "
        "answered by report_checkpoint with the same request_id."
    )

    job_id: str
    request_id: str = Field(description="echoed in the report; a repeated request_id is one request")
    reason: str = Field(description="why: preemption, spot_interruption, node_termination, manual, ...")
    deadline: datetime = Field(description="the job is evicted at the latest by then, saved or not")

    def subject(self) -> str:
        return subjects.save_checkpoint(self.job_id)

    def key(self) -> str:
        return self.job_id


class ReportCheckpoint(Message):
    TYPE: ClassVar[str] = "io.tessera.checkpoint.report_checkpoint.v1"
    SUBJECT: ClassVar[str] = subjects.REPORT_CHECKPOINT
    SUMMARY: ClassVar[str] = (
        "A training process reports a checkpoint it saved (durable, manifest published) or failed to save, "
        "requested or periodic."
    )

    job_id: str
    request_id: str | None = Field(None, description="the save_checkpoint it answers; none when periodic")
    outcome: Literal["saved", "failed"]
    step: int = Field(ge=0, description="the training step the state was taken at")
    size_bytes: int = Field(0, ge=0, description="bytes of state written")
    uri: str = Field("", description="the checkpoint directory, for TESSERA_CHECKPOINT_URI on restart")
    stall_s: float = Field(0.0, ge=0, description="how long the training loop was blocked by the snapshot")
    flush_s: float = Field(0.0, ge=0, description="the background write to durable storage")
    reason: str = Field("", description="why it failed, or what triggered it when saved")
    at: datetime

    def key(self) -> str:
        return self.job_id


class CheckpointSaved(Message):
    TYPE: ClassVar[str] = "io.tessera.checkpoint.checkpoint_saved.v1"
    SUBJECT: ClassVar[str] = subjects.CHECKPOINT_SAVED
    SUMMARY: ClassVar[str] = "A job's checkpoint is durable; a restarted job resumes from it."

    job_id: str
    request_id: str | None = None
    step: int = Field(ge=0)
    uri: str
    size_bytes: int = Field(0, ge=0)
    at: datetime

    def key(self) -> str:
        return self.job_id


_CHECKPOINT_IDS = uuid.UUID("0b0e7c55-2f4e-4a8e-9a43-52c3d1f0c2a7")


def checkpoint_id(job_id: str, uri: str) -> str:
    """The id of a job's checkpoint, the same in every service that lists it: derived from the job and
    the checkpoint's uri (`checkpoint_saved` names both), so a repeated report is one checkpoint."""
    return str(uuid.uuid5(_CHECKPOINT_IDS, f"{job_id}\n{uri}"))


class CheckpointFailed(Message):
    TYPE: ClassVar[str] = "io.tessera.checkpoint.checkpoint_failed.v1"
    SUBJECT: ClassVar[str] = subjects.CHECKPOINT_FAILED
    SUMMARY: ClassVar[str] = "A requested checkpoint failed or missed its deadline."

    job_id: str
    request_id: str | None = None
    reason: str
    at: datetime

    def key(self) -> str:
        return self.job_id


class ReadyForEviction(Message):
    TYPE: ClassVar[str] = "io.tessera.checkpoint.ready_for_eviction.v1"
    SUBJECT: ClassVar[str] = subjects.READY_FOR_EVICTION
    SUMMARY: ClassVar[str] = (
        "The job may be evicted now: its checkpoint is saved, or it cannot take one, or the deadline passed."
    )

    job_id: str
    request_id: str | None = None
    reason: str = Field(
        description=(
            "checkpoint_saved, checkpoint_failed, checkpoint_timeout, deadline_passed or not_checkpointable"
        )
    )
    checkpoint_uri: str | None = Field(None, description="what the restarted job resumes from")
    preemptor_job_id: str | None = Field(
        None, description="the preemption this answers (its preemptor); none for a node's termination"
    )
    step: int | None = Field(
        None, ge=0, description="the training step of the checkpoint, when one was saved"
    )
    cause: str | None = Field(
        None, description="what asked for the checkpoint: preemption, spot_interruption or node_termination"
    )
    at: datetime

    def key(self) -> str:
        return self.job_id


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


class RecordMetric(Message):
    TYPE: ClassVar[str] = "io.tessera.forecaster.record_metric.v1"
    SUBJECT: ClassVar[str] = subjects.RECORD_METRIC
    SUMMARY: ClassVar[str] = (
        "One observation of an application metric (request rate, queue length) for the forecaster to "
        "forecast; a PredictiveAutoscaler's `events` metric names it."
    )

    metric: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z_:][A-Za-z0-9_:.-]*$",
        description="the metric's name, as a PredictiveAutoscaler's metric.events.name names it",
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="what tells this series apart from others of the same metric"
    )
    value: float = Field(description="the reading; a count of events when aggregation is `sum`")
    at: datetime = Field(description="when it was observed")
    aggregation: Literal["mean", "sum"] = Field(
        "mean",
        description="how readings in one step combine: `mean` for gauges (a rate), `sum` for counts of events",
    )
    gpu_shape: str | None = Field(
        None, description="the GPU shape (model or MIG profile) one unit of this metric keeps busy, if any"
    )

    def key(self) -> str:
        return self.metric


class ShapeDemand(BaseModel):
    """Expected demand for one GPU shape over the next window."""

    model_config = ConfigDict(frozen=True)

    shape: str = Field(description="GPU model or MIG profile; `unknown` when telemetry has not named it")
    expected: float = Field(ge=0, description="the largest forecast over the window, GPU-equivalents busy")
    served: float = Field(
        ge=0, description="what the forecaster serves to autoscalers: expected plus the learned margin"
    )
    source: Literal["forecast", "reactive"] = Field(
        description="`reactive` when a series fell back to its last reading (see reason)"
    )
    reason: str | None = None


class ForecastUpdated(Message):
    TYPE: ClassVar[str] = "io.tessera.forecaster.forecast_updated.v1"
    SUBJECT: ClassVar[str] = subjects.FORECAST_UPDATED
    SUMMARY: ClassVar[str] = "New forecasts: expected GPU demand by shape over the next window (for slicing)."

    at: datetime = Field(description="the forecast's origin: the newest observation it saw")
    window_s: float = Field(gt=0, description="how far ahead the expected demand reaches")
    demand: list[ShapeDemand] = []

    def key(self) -> str:
        return "cluster"


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
