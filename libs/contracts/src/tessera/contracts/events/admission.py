"""Admission's commands and events, version 1: submitting a job, its admission, preemption and lifecycle."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar

from pydantic import Field

from tessera.contracts import subjects
from tessera.contracts.base import FieldError, Message
from tessera.contracts.jobs import JobSpec


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
