"""Checkpoint requests, the checkpoints jobs report, and the jobs this service knows of. Pure.

A request is a small state machine with a deadline:

    requested -> saving -> saved | failed | timed_out        (and cancelled, when the job ends first)

It is sent to the trainer as soon as it is made (`SaveCheckpoint`, so it starts in `saving`), and ends
exactly once with `ReadyForEviction`: the job may be evicted now. Reports that arrive after the end
(a redelivery, a late flush) change nothing: a late checkpoint is still recorded, since it is durable
and the restarted job should resume from it, but the eviction is never announced twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from tessera.contracts.base import Message
from tessera.contracts.events import (
    CheckpointFailed,
    CheckpointSaved,
    ReadyForEviction,
    ReportCheckpoint,
    SaveCheckpoint,
)

# Why a checkpoint is asked for (`SaveCheckpoint.reason`, `ReadyForEviction.cause`).
PREEMPTION = "preemption"
SPOT_INTERRUPTION = "spot_interruption"
NODE_TERMINATION = "node_termination"

# Why the job may be evicted now (`ReadyForEviction.reason`).
CHECKPOINT_SAVED = "checkpoint_saved"
CHECKPOINT_FAILED = "checkpoint_failed"
CHECKPOINT_TIMEOUT = "checkpoint_timeout"
DEADLINE_PASSED = "deadline_passed"
NOT_CHECKPOINTABLE = "not_checkpointable"

_CHECKPOINT_IDS = uuid.UUID("0b0e7c55-2f4e-4a8e-9a43-52c3d1f0c2a7")


class RequestState(StrEnum):
    REQUESTED = "requested"
    SAVING = "saving"
    SAVED = "saved"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


OPEN_STATES = frozenset({RequestState.REQUESTED, RequestState.SAVING})

TRANSITIONS: Mapping[RequestState, frozenset[RequestState]] = {
    RequestState.REQUESTED: frozenset({RequestState.SAVING, RequestState.TIMED_OUT, RequestState.CANCELLED}),
    RequestState.SAVING: frozenset(
        {RequestState.SAVED, RequestState.FAILED, RequestState.TIMED_OUT, RequestState.CANCELLED}
    ),
}


class InvalidTransition(Exception):
    def __init__(self, request_id: str, state: RequestState, to: RequestState, why: str = "") -> None:
        super().__init__(
            f"checkpoint request {request_id} cannot go from {state} to {to}{why and ': ' + why}"
        )
        self.state = state
        self.to = to


class Answer(StrEnum):
    """What a report did to its request."""

    ANSWERED = "answered"  # it ended the request
    DUPLICATE = "duplicate"  # the request was already saved
    LATE = "late"  # the request had already failed, timed out or been cancelled


def checkpoint_id(job_id: str, uri: str) -> str:
    """One id per saved checkpoint, however many reports name it (one flush may answer two requests)."""
    return str(uuid.uuid5(_CHECKPOINT_IDS, f"{job_id}\n{uri}"))


@dataclass
class Checkpoint:
    """A checkpoint a training process saved to durable storage; announced once, when first recorded."""

    id: str
    job_id: str
    step: int
    uri: str
    size_bytes: int
    saved_at: datetime
    request_id: str | None = None
    events: list[Message] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def reported(cls, report: ReportCheckpoint) -> Checkpoint:
        if report.outcome != "saved" or not report.uri:
            raise ValueError(f"a {report.outcome} report without a uri names no checkpoint")
        checkpoint = cls(
            id=checkpoint_id(report.job_id, report.uri),
            job_id=report.job_id,
            step=report.step,
            uri=report.uri,
            size_bytes=report.size_bytes,
            saved_at=report.at,
            request_id=report.request_id,
        )
        checkpoint.events.append(
            CheckpointSaved(
                job_id=report.job_id,
                request_id=report.request_id,
                step=report.step,
                uri=report.uri,
                size_bytes=report.size_bytes,
                at=report.at,
            )
        )
        return checkpoint


@dataclass
class CheckpointRequest:
    """One job asked to checkpoint before `deadline`, for `reason` (preemption, spot_interruption, ...)."""

    request_id: str
    job_id: str
    reason: str
    deadline: datetime
    created_at: datetime
    state: RequestState = RequestState.REQUESTED
    updated_at: datetime | None = None
    outcome: str | None = None  # how it ended: checkpoint_saved, the failure, checkpoint_timeout, ...
    checkpoint_id: str | None = None
    checkpoint_uri: str | None = None
    preemptor_job_id: str | None = None  # the preemption it answers, if any: the scheduler matches on it
    trace_headers: Mapping[str, str] | None = None
    events: list[Message] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def ask(
        cls,
        request_id: str,
        job_id: str,
        reason: str,
        deadline: datetime,
        now: datetime,
        *,
        preemptor_job_id: str | None = None,
        trace_headers: Mapping[str, str] | None = None,
    ) -> CheckpointRequest:
        """A new request, sent to the job's trainer at once: it is `saving` from the start."""
        if deadline <= now:
            raise ValueError(f"deadline {deadline.isoformat()} is not after {now.isoformat()}")
        request = cls(
            request_id,
            job_id,
            reason,
            deadline,
            now,
            updated_at=now,
            preemptor_job_id=preemptor_job_id,
            trace_headers=trace_headers,
        )
        request._move(RequestState.SAVING, now)
        request.events.append(
            SaveCheckpoint(job_id=job_id, request_id=request_id, reason=reason, deadline=deadline)
        )
        return request

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    def also_for(self, deadline: datetime, now: datetime, *, preemptor_job_id: str | None = None) -> bool:
        """Another reason to evict the job came while this request is open: it answers that one too,
        ending by the earlier deadline, and names the preemption when it had none (a node's signal came
        first). The first preemption it answers stays its own, as the scheduler keeps the first one.
        True when it changed."""
        if not self.is_open:
            return False
        changed = False
        if deadline < self.deadline:
            self.deadline, changed = deadline, True
        if preemptor_job_id is not None and self.preemptor_job_id is None:
            self.preemptor_job_id, changed = preemptor_job_id, True
        if changed:
            self.updated_at = now
        return changed

    def answer(
        self,
        report: ReportCheckpoint,
        checkpoint: Checkpoint | None,
        latest: Checkpoint | None,
        now: datetime,
    ) -> Answer:
        """Take a report of this request: it ends the request while it is open, and only then."""
        if report.request_id != self.request_id or report.job_id != self.job_id:
            raise ValueError(f"report for {report.job_id}/{report.request_id} is not for {self.request_id}")
        if self.state is RequestState.SAVED:
            return Answer.DUPLICATE
        if not self.is_open:
            return Answer.LATE
        if checkpoint is not None:
            self.saved(checkpoint, now)
        else:
            self.failed(report.reason or "failed without a reason", latest, now)
        return Answer.ANSWERED

    def saved(self, checkpoint: Checkpoint, now: datetime) -> None:
        self._move(RequestState.SAVED, now)
        self.outcome = CHECKPOINT_SAVED
        self.checkpoint_id, self.checkpoint_uri = checkpoint.id, checkpoint.uri
        self._ready_for_eviction(CHECKPOINT_SAVED, checkpoint, now)

    def failed(self, why: str, latest: Checkpoint | None, now: datetime) -> None:
        """The trainer could not save; the job goes with the checkpoint it saved before, if any."""
        self._end_unsaved(RequestState.FAILED, why, CHECKPOINT_FAILED, latest, now)

    def time_out(self, latest: Checkpoint | None, now: datetime) -> None:
        if now < self.deadline:
            raise InvalidTransition(
                self.request_id, self.state, RequestState.TIMED_OUT, f"its deadline {self.deadline} is ahead"
            )
        self._end_unsaved(RequestState.TIMED_OUT, CHECKPOINT_TIMEOUT, CHECKPOINT_TIMEOUT, latest, now)

    def overtaken(self, latest: Checkpoint | None, now: datetime) -> None:
        """The eviction deadline passed elsewhere (a forced preemption): stop waiting for the trainer."""
        self._end_unsaved(RequestState.TIMED_OUT, DEADLINE_PASSED, DEADLINE_PASSED, latest, now)

    def cancel(self, why: str, now: datetime) -> None:
        """The job ended first: nobody is left to evict, so nothing is announced."""
        self._move(RequestState.CANCELLED, now)
        self.outcome = why

    def _end_unsaved(
        self, state: RequestState, why: str, eviction_reason: str, latest: Checkpoint | None, now: datetime
    ) -> None:
        self._move(state, now)
        self.outcome = why
        if latest is not None:
            self.checkpoint_id, self.checkpoint_uri = latest.id, latest.uri
        self.events.append(
            CheckpointFailed(job_id=self.job_id, request_id=self.request_id, reason=why, at=now)
        )
        self._ready_for_eviction(eviction_reason, latest, now)

    def _ready_for_eviction(self, reason: str, checkpoint: Checkpoint | None, now: datetime) -> None:
        self.events.append(
            ready_for_eviction(
                self.job_id, reason, checkpoint, now, self.reason, self.preemptor_job_id, self.request_id
            )
        )

    def _move(self, to: RequestState, now: datetime) -> None:
        if to not in TRANSITIONS.get(self.state, frozenset()):
            raise InvalidTransition(self.request_id, self.state, to)
        self.state = to
        self.updated_at = now


@dataclass
class Job:
    """A job as this service needs it: can it checkpoint, where do its pods run, has it ended.

    Events of admission and of the scheduler arrive on separate consumers, so each change carries the
    time it happened and an older one never undoes a newer one (a placement that arrives after the
    job finished is ignored; so is an admission older than the job's end or its latest admission, and
    an end older than its latest admission)."""

    job_id: str
    checkpointable: bool | None = None  # None: not told yet
    pods: dict[str, str] = field(default_factory=dict)  # pod -> node
    admitted_at: datetime | None = None
    placed_at: datetime | None = None
    finished_at: datetime | None = None
    events: list[Message] = field(default_factory=list, repr=False, compare=False)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(self.pods.values())

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def admitted(self, checkpointable: bool, at: datetime) -> None:
        if self.ended_before(at) or (self.admitted_at is not None and at < self.admitted_at):
            # an old admission, delivered after the end of that run or after a later admission: it
            # says nothing of the run now (it only fills in what was never told)
            if self.checkpointable is None:
                self.checkpointable = checkpointable
            return
        self.checkpointable = checkpointable
        self.admitted_at = at
        self.finished_at = None

    def told_checkpointable(self, checkpointable: bool) -> None:
        self.checkpointable = checkpointable

    def ended_before(self, at: datetime) -> bool:
        """News from `at` is about a run that has ended since (delivered late, on another consumer)."""
        return self.finished_at is not None and at < self.finished_at

    def placed(self, pods: Mapping[str, str], at: datetime) -> bool:
        """The gang is bound: its pods replace the ones known. False when the news is stale."""
        if self.ended_before(at) or (self.placed_at is not None and at < self.placed_at):
            return False
        self.pods = dict(pods)
        self.placed_at = at
        return True

    def gang_ended(self, at: datetime) -> None:
        if self.placed_at is None or at >= self.placed_at:
            self.pods = {}

    def finish(self, at: datetime) -> bool:
        """The job left at `at`. False (nothing changed) when that is older than the job's latest
        admission: the end of an earlier run, delivered late, which must not end the run now."""
        if self.admitted_at is not None and at < self.admitted_at:
            return False
        self.pods = {}
        self.finished_at = max(at, self.finished_at) if self.finished_at else at
        return True

    def release_now(
        self,
        reason: str,
        latest: Checkpoint | None,
        now: datetime,
        *,
        cause: str,
        preemptor_job_id: str | None = None,
    ) -> None:
        """No checkpoint to wait for (the job cannot take one, or the time is up): evict it now."""
        self.events.append(ready_for_eviction(self.job_id, reason, latest, now, cause, preemptor_job_id))


def ready_for_eviction(
    job_id: str,
    reason: str,
    checkpoint: Checkpoint | None,
    now: datetime,
    cause: str,
    preemptor_job_id: str | None,
    request_id: str | None = None,
) -> ReadyForEviction:
    """The job may go now; the restarted job resumes from `checkpoint` when there is one."""
    return ReadyForEviction(
        job_id=job_id,
        request_id=request_id,
        reason=reason,
        checkpoint_uri=checkpoint.uri if checkpoint is not None else None,
        step=checkpoint.step if checkpoint is not None else None,
        preemptor_job_id=preemptor_job_id,
        cause=cause,
        at=now,
    )
