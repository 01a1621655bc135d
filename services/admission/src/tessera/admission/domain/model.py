"""The job aggregate and its lifecycle. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from tessera.contracts.base import FieldError, Message
from tessera.contracts.events import JobAccepted, JobAdmitted, JobRejected
from tessera.contracts.jobs import JobSpec


class JobState(StrEnum):
    SUBMITTED = "submitted"
    QUEUED = "queued"
    ADMITTED = "admitted"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


FINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED})
ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.SUBMITTED: frozenset({JobState.QUEUED, JobState.REJECTED, JobState.CANCELLED}),
    JobState.QUEUED: frozenset({JobState.ADMITTED, JobState.CANCELLED, JobState.REJECTED}),
    JobState.ADMITTED: frozenset(
        {
            JobState.ADMITTED,
            JobState.PLACED,
            JobState.QUEUED,
            JobState.PREEMPTED,
            JobState.CANCELLED,
            JobState.FAILED,
        }
    ),
    JobState.PLACED: frozenset(
        {JobState.RUNNING, JobState.PREEMPTED, JobState.CANCELLED, JobState.FAILED, JobState.SUCCEEDED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.PREEMPTED, JobState.CANCELLED}
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.CANCELLED}),
}


class InvalidTransition(ValueError):
    def __init__(self, job_id: str, current: JobState, target: JobState) -> None:
        allowed = ", ".join(sorted(ALLOWED.get(current, frozenset()))) or "none (final state)"
        super().__init__(f"job {job_id}: cannot move from {current} to {target}; allowed: {allowed}")
        self.current = current
        self.target = target


@dataclass(frozen=True)
class Transition:
    state: JobState
    reason: str
    at: datetime


@dataclass
class Job:
    id: str
    name: str
    tenant: str
    queue: str
    priority: int
    spec: JobSpec | None
    submitted_at: datetime
    state: JobState = JobState.SUBMITTED
    history: list[Transition] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    events: list[Message] = field(default_factory=list)

    @classmethod
    def submit(cls, job_id: str, spec: JobSpec, now: datetime) -> Job:
        job = cls(job_id, spec.name, spec.tenant, spec.queue, spec.priority, spec, now)
        job.history.append(Transition(JobState.SUBMITTED, "submitted", now))
        job.move(JobState.QUEUED, f"accepted into queue {spec.queue}", now)
        job.events.append(JobAccepted(job_id=job_id, name=spec.name, tenant=spec.tenant, queue=spec.queue))
        return job

    @classmethod
    def reject(cls, job_id: str, raw: object, errors: list[FieldError], now: datetime) -> Job:
        fields = raw if isinstance(raw, dict) else {}
        name = str(fields.get("name", "")) or None
        job = cls(
            job_id,
            name or "",
            str(fields.get("tenant", "")),
            str(fields.get("queue", "")),
            0,
            None,
            now,
            errors=list(errors),
        )
        job.history.append(Transition(JobState.SUBMITTED, "submitted", now))
        reason = "; ".join(f"{e.field}: {e.reason}" for e in errors)
        job.move(JobState.REJECTED, f"invalid: {reason}", now)
        job.events.append(JobRejected(job_id=job_id, name=name, errors=list(errors)))
        return job

    def move(self, target: JobState, reason: str, now: datetime) -> None:
        if target not in ALLOWED.get(self.state, frozenset()):
            raise InvalidTransition(self.id, self.state, target)
        self.state = target
        self.history.append(Transition(target, reason, now))

    def admit(self, now: datetime, reason: str = "admitted in FIFO order") -> None:
        self.move(JobState.ADMITTED, reason, now)
        assert self.spec is not None
        self.events.append(JobAdmitted(job_id=self.id, spec=self.spec, submitted_at=self.submitted_at))
