"""The checkpoint protocol's commands and events, version 1, and the id every service gives a checkpoint."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from tessera.contracts import subjects
from tessera.contracts.base import Message


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
