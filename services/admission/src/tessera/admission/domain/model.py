"""The job aggregate and its lifecycle. Pure: no I/O.

Every change of a job goes through a method here, checked against `ALLOWED`, and records the
events it causes in `events`; the unit of work publishes them when it commits. The admission
cycle decides (`domain/queueing`), then applies each decision through these methods."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from tessera.contracts.base import FieldError, Message
from tessera.contracts.events import (
    JobAccepted,
    JobAdmitted,
    JobFinished,
    JobRejected,
    JobStateChanged,
    PreemptionRequested,
)
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
ENDED = frozenset({JobState.SUCCEEDED, JobState.FAILED})
"""How a placed gang ends; the first word on it stands."""
PAST_PLACED = frozenset({JobState.PLACED, JobState.RUNNING, *ENDED})
"""A job in these was placed already: a `gang_placed` that comes now is late or repeated."""
IMPLY_PLACED = frozenset({JobState.RUNNING, JobState.SUCCEEDED})
"""Outcomes only a placed gang can have: reported of an admitted job, they imply its placement."""
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
    def __init__(self, job_id: str, current: JobState, target: JobState, why: str | None = None) -> None:
        allowed = ", ".join(sorted(ALLOWED.get(current, frozenset()))) or "none (final state)"
        super().__init__(
            f"job {job_id}: {why}"
            if why
            else f"job {job_id}: cannot move from {current} to {target}; allowed: {allowed}"
        )
        self.current = current
        self.target = target


@dataclass(frozen=True)
class Transition:
    state: JobState
    reason: str
    at: datetime


@dataclass(frozen=True)
class JobCheckpoint:
    """A checkpoint the job saved, as the checkpoint service announced it: durable, so the job resumes
    from its newest one when it is admitted again."""

    id: str
    step: int
    size_bytes: int
    uri: str
    at: datetime

    @property
    def order(self) -> tuple[datetime, int]:
        """Newer checkpoints sort after older ones (by time saved, then step)."""
        return (self.at, self.step)


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
    flavors: tuple[str, ...] = ()
    """The flavor each pod group was admitted in, in pod-group order."""
    admitted_at: datetime | None = None
    waiting: tuple[str, str] | None = None
    """Why a queued job is not admitted yet: (reason, message), as the cycle last said."""
    preempted_by: str | None = None
    preemption_deadline: datetime | None = None
    latest_checkpoint: JobCheckpoint | None = None
    """The newest checkpoint the job saved: what it resumes from when admitted again."""
    trace_headers: dict[str, str] | None = None
    """The trace the job belongs to; its events are published in it."""
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

    @property
    def holds_quota(self) -> bool:
        return self.state in HOLDS_QUOTA

    def admit(
        self, now: datetime, reason: str = "admitted in FIFO order", flavors: Sequence[str] = ()
    ) -> None:
        """Quota is granted in `flavors` (one per pod group): the scheduler may place the job now. A job
        that saved a checkpoint (before it was preempted) resumes from its newest one."""
        resume = self.latest_checkpoint
        if resume is not None:
            reason += f"; resumes from the checkpoint at step {resume.step} ({resume.uri})"
        self.move(JobState.ADMITTED, reason, now)
        assert self.spec is not None
        self.flavors = tuple(flavors)
        self.admitted_at = now
        self.waiting = None
        self.events.append(
            JobAdmitted(
                job_id=self.id,
                spec=self.spec,
                submitted_at=self.submitted_at,
                resume_from=resume.uri if resume is not None else None,
            )
        )

    def wait(self, reason: str, message: str, now: datetime) -> None:
        """A queued job is not admitted this time, and why. Only a new reason is news: the same
        one again records nothing, and a job that is no longer queued does not wait."""
        if self.state is not JobState.QUEUED or self.waiting == (reason, message):
            return
        self.waiting = (reason, message)
        self.note(f"waiting: {reason}: {message}", now)

    def request_preemption(
        self,
        preemptor: str,
        reason: str,
        grace_period_s: float,
        deadline: datetime,
        checkpointable: bool,
        now: datetime,
    ) -> None:
        """Ask the job to give its quota back to `preemptor` by `deadline` (after saving a
        checkpoint when it can); it keeps running until it reports released."""
        self._must_hold_quota("only a job that holds quota can be asked to give it back")
        self.preempted_by = preemptor
        self.preemption_deadline = deadline
        self.events.append(
            PreemptionRequested(
                victim_job_id=self.id,
                preemptor_job_id=preemptor,
                reason=reason,
                deadline=deadline,
                grace_period_s=grace_period_s,
                checkpointable=checkpointable,
            )
        )
        self.note(
            f"preemption requested by {preemptor} ({reason}); grace {grace_period_s:g}s, "
            f"deadline {deadline.isoformat()}",
            now,
        )

    def preempt(
        self,
        preemptor: str,
        reason: str,
        grace_period_s: float,
        deadline: datetime,
        checkpointable: bool,
        now: datetime,
    ) -> None:
        """The release deadline passed: the job is evicted now, its quota already handed on."""
        self._must_hold_quota("only a job that holds quota can be preempted")
        self.preempted_by = preemptor
        self.preemption_deadline = deadline
        self.events.append(
            PreemptionRequested(
                victim_job_id=self.id,
                preemptor_job_id=preemptor,
                reason=reason,
                deadline=deadline,
                grace_period_s=grace_period_s,
                checkpointable=checkpointable,
                forced=True,
            )
        )
        self.move(JobState.PREEMPTED, f"preempted by {preemptor} ({reason}): release deadline passed", now)
        self._requeue(now)

    def place(self, pods: int, nodes: Sequence[str], now: datetime) -> bool:
        """The scheduler placed and bound the whole gang. News that comes late (the job already runs
        or ended, because its later outcome came first on another stream) or twice changes nothing
        and returns False; news of an earlier admission (the job queues again) is refused."""
        if self.state in PAST_PLACED:
            return False
        self.move(JobState.PLACED, f"placed {pods} pods on {', '.join(sorted(set(nodes)))}", now)
        return True

    def unschedulable(self, message: str, now: datetime) -> None:
        """The scheduler cannot place the gang now; the job keeps its quota and waits for room."""
        if self.state is not JobState.ADMITTED:
            raise InvalidTransition(
                self.id, self.state, JobState.ADMITTED, f"is {self.state}: it no longer waits for a placement"
            )
        self.note(f"unschedulable: {message}", now)

    def report(self, outcome: JobState, reason: str, now: datetime) -> bool:
        """Whoever runs the job says it runs, ended, or released its resources after a preemption
        request (the reason then names the preemptor; the job then queues again). A release nobody
        asked for (a late report about an earlier admission of the job) is refused.

        Outcomes come on other streams than the placement, so they tolerate reordering: a job reported
        running or succeeded while still admitted was placed (both are recorded, the placement marked
        implied, and the late `gang_placed` is then a no-op); a job that already ended, or already runs
        when told it runs, stays as it is and False is returned."""
        if outcome is JobState.PREEMPTED:
            if not self.preempted_by:
                raise InvalidTransition(
                    self.id, self.state, outcome, f"is {self.state}: no preemption was requested of it"
                )
            reason = f"released after preemption by {self.preempted_by}" + (f": {reason}" if reason else "")
        elif self.state in ENDED or (self.state is outcome is JobState.RUNNING):
            return False
        elif self.state is JobState.ADMITTED and outcome in IMPLY_PLACED:
            self.move(JobState.PLACED, f"placed: implied by the {outcome} report that came first", now)
        self.move(outcome, reason or outcome.value, now)
        if outcome is JobState.PREEMPTED:
            self._requeue(now)
        return True

    def checkpoint_saved(self, checkpoint: JobCheckpoint, now: datetime) -> None:
        """A checkpoint of the job is durable (periodic, or asked for before a preemption or a node's
        loss): its history says so, and the job resumes from the newest one it saved."""
        if self.latest_checkpoint is None or checkpoint.order > self.latest_checkpoint.order:
            self.latest_checkpoint = checkpoint
        self.note(f"checkpoint saved at step {checkpoint.step} ({checkpoint.uri})", now)

    def cancel(self, reason: str, now: datetime) -> None:
        self.move(JobState.CANCELLED, reason, now)

    def _requeue(self, now: datetime) -> None:
        """A preempted job goes back to its queue at once, keeping its place (its submission time), as
        Kueue requeues an evicted workload: it is admitted again when quota allows, and resumes from
        its newest checkpoint."""
        self.preempted_by = None
        self.preemption_deadline = None
        self.flavors = ()
        self.admitted_at = None
        self.move(JobState.QUEUED, "requeued after preemption", now)

    def _must_hold_quota(self, why: str) -> None:
        if not self.holds_quota:
            raise InvalidTransition(self.id, self.state, JobState.PREEMPTED, f"is {self.state}: {why}")
