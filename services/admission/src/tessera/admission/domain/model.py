"""The job aggregate and its lifecycle. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from tessera.contracts.base import FieldError, Message
from tessera.contracts.events import JobAccepted, JobAdmitted, JobFinished, JobRejected, JobStateChanged
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
HOLDS_QUOTA = frozenset({JobState.ADMITTED, JobState.PLACED, JobState.RUNNING})
"""States in which a job holds quota; leaving them releases it (job_finished is announced)."""
ACTIVE = frozenset({JobState.QUEUED, *HOLDS_QUOTA})
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
    def submit(
        cls, job_id: str, spec: JobSpec, now: datetime, queue: str | None = None, priority: int | None = None
    ) -> Job:
        """Accept a valid job into `queue` (its tenant's queue) at `priority` (its class's value)."""
        queue = queue or spec.queue
        job = cls(
            job_id, spec.name, spec.tenant, queue, spec.priority if priority is None else priority, spec, now
        )
        job.history.append(Transition(JobState.SUBMITTED, "submitted", now))
        job.events.append(JobAccepted(job_id=job_id, name=spec.name, tenant=spec.tenant, queue=queue))
        job.move(JobState.QUEUED, f"accepted into queue {queue}", now)
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
        job.events.append(JobRejected(job_id=job_id, name=name, errors=list(errors)))
        job.move(JobState.REJECTED, f"rejected: {reason}", now)
        return job

    def move(self, target: JobState, reason: str, now: datetime) -> None:
        """Change state, record why, and announce it (job_finished too when quota is released)."""
        if target not in ALLOWED.get(self.state, frozenset()):
            raise InvalidTransition(self.id, self.state, target)
        previous, self.state = self.state, target
        self.history.append(Transition(target, reason, now))
        self.events.append(
            JobStateChanged(
                job_id=self.id,
                tenant=self.tenant,
                queue=self.queue,
                previous_state=previous.value,
                state=target.value,
                reason=reason,
                at=now,
            )
        )
        if target in FINAL - {JobState.REJECTED} or target is JobState.PREEMPTED:
            self.events.append(JobFinished(job_id=self.id, state=target.value, reason=reason, at=now))

    def note(self, reason: str, now: datetime) -> None:
        """Record something that happened to the job without a change of state (a wait reason,
        a preemption request), so its history says why."""
        self.history.append(Transition(self.state, reason, now))
        self.events.append(
            JobStateChanged(
                job_id=self.id,
                tenant=self.tenant,
                queue=self.queue,
                previous_state=self.state.value,
                state=self.state.value,
                reason=reason,
                at=now,
            )
        )

    def admit(self, now: datetime, reason: str = "admitted in FIFO order") -> None:
        self.move(JobState.ADMITTED, reason, now)
        assert self.spec is not None
        self.events.append(JobAdmitted(job_id=self.id, spec=self.spec, submitted_at=self.submitted_at))
