"""Errors raised by the queueing domain. Each names the field at fault and why."""

from __future__ import annotations


class QueueingValidationError(ValueError):
    """Bad configuration or a bad workload; `field` is a dotted path to the culprit."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class UnknownWorkload(KeyError):
    """The engine was told about a workload it does not hold."""
