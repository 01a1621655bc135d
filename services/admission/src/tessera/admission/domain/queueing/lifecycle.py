"""The job lifecycle: submitted -> queued -> admitted -> placed -> running -> succeeded | failed |
preempted | cancelled, with every transition checked and recorded (when, from, to, why)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tessera.admission.domain.queueing.errors import InvalidTransition


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


_S = JobState
ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _S.SUBMITTED: frozenset({_S.QUEUED, _S.FAILED, _S.CANCELLED}),
    # queued -> queued is not a transition; a wait reason changing is not a state change.
    _S.QUEUED: frozenset({_S.ADMITTED, _S.FAILED, _S.CANCELLED}),
    # admitted -> queued: the admission was rolled back, or the gang could not be placed.
    _S.ADMITTED: frozenset({_S.PLACED, _S.QUEUED, _S.PREEMPTED, _S.FAILED, _S.CANCELLED}),
    _S.PLACED: frozenset({_S.RUNNING, _S.PREEMPTED, _S.FAILED, _S.CANCELLED}),
    _S.RUNNING: frozenset({_S.SUCCEEDED, _S.FAILED, _S.PREEMPTED, _S.CANCELLED}),
    # A preempted job may be requeued (and resumes from its checkpoint when it has one).
    _S.PREEMPTED: frozenset({_S.QUEUED, _S.CANCELLED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}

TERMINAL_STATES = frozenset(s for s, nxt in ALLOWED_TRANSITIONS.items() if not nxt)


@dataclass(frozen=True, slots=True)
class Transition:
    at: float
    source: JobState
    target: JobState
    reason: str


@dataclass(slots=True)
class JobLifecycle:
    job: str
    state: JobState = JobState.SUBMITTED
    history: list[Transition] = field(default_factory=list)

    def can_move_to(self, target: JobState) -> bool:
        return target in ALLOWED_TRANSITIONS[self.state]

    def move_to(self, target: JobState, at: float, reason: str) -> Transition:
        """Move to `target`, or raise `InvalidTransition` naming the allowed next states."""
        if not self.can_move_to(target):
            allowed = sorted(s.value for s in ALLOWED_TRANSITIONS[self.state])
            raise InvalidTransition(self.job, self.state.value, target.value, allowed)
        if not reason:
            raise ValueError("reason: every transition needs a reason")
        transition = Transition(at, self.state, target, reason)
        self.history.append(transition)
        self.state = target
        return transition

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES
