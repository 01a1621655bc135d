"""What an admission cycle decides. The cycle does no I/O: the service persists these and
publishes `job_admitted`, `preemption_requested` and the job's wait reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tessera.admission.domain.queueing.resources import FlavorResource


class WaitReason(StrEnum):
    QUOTA_EXHAUSTED = "QuotaExhausted"
    """Not enough unused quota, and no preemption could make room."""
    NO_MATCHING_FLAVOR = "NoMatchingFlavor"
    """No allowed flavor of the queue covers the request, however empty the cohort."""
    NO_FEASIBLE_PLACEMENT = "NoFeasiblePlacement"
    """Quota allows it but the cluster's free shape cannot place the gang; no quota is held."""
    WAITING_FOR_VICTIMS = "WaitingForVictims"
    """Preemption was requested; admitted once the victims report released or time runs out."""
    BLOCKED_BY_HEAD = "BlockedByHead"
    """Strict FIFO: a job ahead in the same queue cannot be admitted yet."""


class PreemptionReason(StrEnum):
    WITHIN_QUEUE_PRIORITY = "InQueuePriority"
    """A higher-priority job in the same queue needs the room."""
    RECLAIM_WITHIN_COHORT = "InCohortReclamation"
    """The victim's queue borrows quota another queue of the cohort now reclaims (nominal)."""
    BORROW_WITHIN_COHORT = "InCohortReclaimWhileBorrowing"
    """A higher-priority job borrowing from the cohort evicts a lower-priority borrower."""


@dataclass(frozen=True, slots=True)
class Admit:
    job: str
    queue: str
    flavors: tuple[str, ...]
    """Chosen flavor per pod group, in the workload's pod-group order."""
    usage: dict[FlavorResource, int]
    borrows: bool


@dataclass(frozen=True, slots=True)
class Preempt:
    victim: str
    victim_queue: str
    preemptor: str
    reason: PreemptionReason
    grace_period_s: float
    """Checkpointable victims get time to save state before eviction."""
    deadline: float
    """When the preemptor is admitted whether or not the victim has reported released."""
    forced: bool = False
    """The deadline passed without a release: evict now; its quota is already handed on."""


@dataclass(frozen=True, slots=True)
class Wait:
    job: str
    queue: str
    reason: WaitReason
    message: str


Decision = Admit | Preempt | Wait


@dataclass(frozen=True, slots=True)
class CycleResult:
    decisions: list[Decision]
    """Admissions, preemptions, and waits whose reason changed since the last cycle."""
    admitted: int
    examined: int
    """Jobs the cycle looked at (each at most once)."""
    waits: dict[str, WaitReason] = field(default_factory=dict)
    """Every job examined and left waiting, with its reason."""
