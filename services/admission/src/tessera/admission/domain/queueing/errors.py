"""Errors raised by the queueing domain. Each names the field at fault and why."""

from __future__ import annotations


class QueueingValidationError(ValueError):
    """Bad configuration or a bad workload; `field` is a dotted path to the culprit."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidTransition(ValueError):
    """A job was asked to move to a lifecycle state its current state does not lead to."""

    def __init__(self, job: str, current: str, requested: str, allowed: list[str]) -> None:
        allowed_text = ", ".join(allowed) if allowed else "none (terminal state)"
        super().__init__(
            f"job {job!r} cannot move from {current} to {requested}; allowed next states: {allowed_text}"
        )
        self.job = job
        self.current = current
        self.requested = requested


class UnknownWorkload(KeyError):
    """The engine was told about a workload it does not hold."""
