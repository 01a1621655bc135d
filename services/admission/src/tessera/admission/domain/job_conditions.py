"""What admission says on a job's batch/v1 Jobs, JobSets and gated Pods, where `kubectl describe`
shows it. Pure.

Four condition types, as Kueue's Workload has them: `QuotaReserved` (quota is held for the job, or
why not, with the numbers), `Admitted` (its pods may run), `Preempted` (it was asked to leave, and by
whom) and `Inadmissible` (it can never be admitted as it is: an unknown queue, a queue its namespace
may not use, a request no flavor covers, a pod no node's shape could hold). Each change is also an
Event on the workload. Admission owns only these types in its `status.conditions`; the controller's
own (a Job's `Suspended`, `Complete`, `Failed`; a JobSet's `Suspended`, `Completed`, `Failed`) are
left as they are. A JobSet's conditions are `metav1.Condition`s, which have no `lastProbeTime` and
whose reason is CamelCase (`condition_reason`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tessera.admission.domain.model import HOLDS_QUOTA, JobState
from tessera.admission.domain.queueing import WaitReason
from tessera.contracts.base import FieldError

QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
PREEMPTED = "Preempted"
INADMISSIBLE = "Inadmissible"
OURS = (QUOTA_RESERVED, ADMITTED, PREEMPTED, INADMISSIBLE)

QUEUE_NOT_FOUND = "QueueNotFound"
"""The reason of a job whose queue the configuration does not know."""
NO_MATCHING_FLAVOR = WaitReason.NO_MATCHING_FLAVOR.value
NO_FEASIBLE_PLACEMENT = WaitReason.NO_FEASIBLE_PLACEMENT.value
NO_SHAPE = "no node shape holds"
"""How the shape check begins the message of a pod no node could ever hold (`GpuShapeOracle`)."""


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class JobStatusView:
    """What the conditions are made from: the job as admission stores it."""

    state: JobState
    queue: str
    waiting: tuple[str, str] | None = None
    errors: Sequence[FieldError] = ()
    flavors: Sequence[str] = ()
    preempted_by: str | None = None


@dataclass(frozen=True)
class ConditionsDue:
    """A job whose conditions changed since admission last wrote them onto its Jobs."""

    job_id: str
    namespace: str
    jobs: tuple[str, ...]
    """Its batch/v1 Jobs' names."""
    view: JobStatusView
    updated_at: datetime
    """The job's last change: what is recorded as reported once written."""
    pods: tuple[str, ...] = ()
    """Its gated Pods' names (a user's Pod is a job of its own)."""
    jobsets: tuple[str, ...] = ()
    """Its JobSet's name (a user's JobSet is one job)."""


def conditions_for(job: JobStatusView) -> tuple[Condition, ...]:
    """The job's conditions; empty for a job that ended or was cancelled (its last ones stay)."""
    queue = f"queue {job.queue}"
    if job.state is JobState.REJECTED:
        reason, message = _inadmissible(job)
        return (
            Condition(QUOTA_RESERVED, False, reason, message),
            Condition(ADMITTED, False, reason, message),
            Condition(INADMISSIBLE, True, reason, message),
        )
    if job.state in HOLDS_QUOTA:
        where = ", ".join(dict.fromkeys(job.flavors)) or "its flavors"
        reserved = f"{queue}: quota reserved in flavor {where}"
        return (
            Condition(QUOTA_RESERVED, True, QUOTA_RESERVED, reserved),
            Condition(ADMITTED, True, ADMITTED, f"{queue}: admitted; its pods may run"),
            Condition(PREEMPTED, False, ADMITTED, "not preempted"),
            Condition(INADMISSIBLE, False, ADMITTED, "admitted"),
        )
    if job.state is JobState.PREEMPTED:
        by = f" by job {job.preempted_by}" if job.preempted_by else ""
        message = f"{queue}: preempted{by}; suspended until it is admitted again"
        return (
            Condition(QUOTA_RESERVED, False, PREEMPTED, message),
            Condition(ADMITTED, False, PREEMPTED, message),
            Condition(PREEMPTED, True, PREEMPTED, message),
        )
    if job.state is JobState.QUEUED:
        reason, message = job.waiting or ("Pending", "waiting for the next admission cycle")
        text = message if message.startswith("queue ") else f"{queue}: {message}"
        never = _never(reason, message)
        return (
            Condition(QUOTA_RESERVED, False, reason, text),
            Condition(ADMITTED, False, reason, text),
            Condition(
                INADMISSIBLE, never, reason, text if never else "may be admitted when quota and nodes allow"
            ),
        )
    return ()


def _never(reason: str, message: str) -> bool:
    """A queued job nothing but a change of configuration or cluster can admit: no flavor of its
    queue covers what it asks, or no node's shape could ever hold one of its pods."""
    return reason == NO_MATCHING_FLAVOR or (reason == NO_FEASIBLE_PLACEMENT and message.startswith(NO_SHAPE))


def _inadmissible(job: JobStatusView) -> tuple[str, str]:
    if not job.errors:
        return INADMISSIBLE, f"queue {job.queue}: rejected"
    first = job.errors[0]
    text = "; ".join(f"{e.field}: {e.reason}" for e in job.errors)
    if first.field == "queue" and first.reason.startswith("unknown queue"):
        return QUEUE_NOT_FOUND, text
    return INADMISSIBLE, text


def condition_reason(reason: str) -> str:
    """``reason`` as a `metav1.Condition` takes it (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`):
    other characters dropped, words joined CamelCase; `Unknown` when nothing is left."""
    words = re.split(r"[^A-Za-z0-9_,:]+", reason)
    joined = "".join(w[:1].upper() + w[1:] for w in words if w)
    joined = re.sub(r"^[^A-Za-z]+", "", joined).rstrip(",:")
    return joined or "Unknown"


def merged(
    current: Sequence[Mapping[str, Any]], ours: Sequence[Condition], now: str, *, probe: bool = True
) -> tuple[list[dict[str, Any]], list[Condition]] | None:
    """The workload's `status.conditions` with ours written in (others kept, in place), and those of
    ours that changed; None when nothing changed. A condition's `lastTransitionTime` moves only when
    its status does, as Kubernetes' conventions ask. ``probe``: write `lastProbeTime` (a Job's and a
    Pod's conditions have it; a JobSet's `metav1.Condition`s do not, and take CamelCase reasons)."""
    out = [dict(c) for c in current]
    index = {c.get("type"): i for i, c in enumerate(out)}
    changed: list[Condition] = []
    for cond in ours:
        status = "True" if cond.status else "False"
        reason = cond.reason if probe else condition_reason(cond.reason)
        old = out[index[cond.type]] if cond.type in index else None
        if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
            status,
            reason,
            cond.message,
        ):
            continue
        new = {
            "type": cond.type,
            "status": status,
            "reason": reason,
            "message": cond.message,
            **({"lastProbeTime": now} if probe else {}),
            "lastTransitionTime": old.get("lastTransitionTime", now)
            if old is not None and old.get("status") == status
            else now,
        }
        if old is None:
            index[cond.type] = len(out)
            out.append(new)
        else:
            out[index[cond.type]] = new
        changed.append(cond)
    return (out, changed) if changed else None
