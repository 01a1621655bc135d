"""What a job's Kubernetes objects should be in each of its states. Pure.

Queued (or preempted, on its way back to the queue) the objects exist and are suspended; admitted,
placed or running they run; cancelled or rejected they are deleted. A job that ended (succeeded or
failed) keeps its objects as they are, so `kubectl logs` and `kubectl describe` still answer.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from tessera.admission.domain.model import HOLDS_QUOTA, JobState
from tessera.contracts.jobs import JobSpec

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes object name (RFC 1123 subdomain), of at most 253 characters."""
EVENT_NAME_BASE = 200
"""The most of the object's name an Event's name begins with: with `.` and 16 hex digits, 217."""
_NOT_LABEL = re.compile(r"[^a-z0-9]+")


def event_base(obj: str) -> str:
    """The start of the name of an Event on ``obj``: its name, cut to `EVENT_NAME_BASE` without a
    `-` or `.` left at the end (a subdomain ends alphanumeric). A name that is not a subdomain (none
    the cluster holds) gives its letters and digits joined by `-`."""
    cut = obj[:EVENT_NAME_BASE].rstrip("-.")
    if DNS_SUBDOMAIN.fullmatch(cut):
        return cut
    return _NOT_LABEL.sub("-", obj.lower())[:EVENT_NAME_BASE].strip("-") or "event"


class Applied(StrEnum):
    """What admission made sure of on the cluster for a job."""

    SUSPENDED = "suspended"
    RUNNING = "running"
    DELETED = "deleted"
    UNRUNNABLE = "unrunnable"
    """The job has no pod template (accepted before admission ran workloads on a cluster)."""


class Owner(StrEnum):
    """Who made a job's objects."""

    TESSERA = "tessera"
    """Admission, from a job submitted by REST, the CLI or the NATS command."""
    USER = "user"
    """A user, with `kubectl apply` of a labelled workload."""


def desired(state: JobState, owner: Owner = Owner.TESSERA) -> Applied | None:
    """The objects' state a job in ``state`` wants; None: leave them as they are. A user's workload
    that is rejected or cancelled stays suspended, for its owner to see why and delete."""
    if state in (JobState.QUEUED, JobState.PREEMPTED):
        return Applied.SUSPENDED
    if state in HOLDS_QUOTA:
        return Applied.RUNNING
    if state in (JobState.CANCELLED, JobState.REJECTED):
        return Applied.DELETED if owner is Owner.TESSERA else Applied.SUSPENDED
    return None


@dataclass(frozen=True)
class WorkloadDue:
    """A job whose objects are not yet what its state wants."""

    job_id: str
    state: JobState
    spec: JobSpec | None
    namespace: str | None
    """Where its objects are (None: not made yet)."""
    objects: tuple[tuple[str, str], ...]
    """(kind, name) of each object made."""
    applied: Applied | None
    want: Applied
    owner: Owner = Owner.TESSERA
    flavors: tuple[str, ...] = ()
    """The flavor admitted per pod group (the job's Jobs are its pod groups, in order)."""
    recorded_at: datetime | None = None
    """When `applied` was recorded (None: nothing recorded yet)."""

    def event_name(self, obj: str, reason: str) -> str:
        """The name of the Event that tells of this change on ``obj``: the same in every round until
        the change is recorded, so a round cut short after the cluster changed (or after the Event
        was told) tells of it once, in a later round; another for the next change of the job."""
        since = self.recorded_at.isoformat() if self.recorded_at is not None else "-"
        key = f"{self.job_id}\n{obj}\n{reason}\n{self.applied}\n{self.want}\n{since}"
        return f"{event_base(obj)}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
