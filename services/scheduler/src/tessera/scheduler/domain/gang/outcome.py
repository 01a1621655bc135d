"""What an attempt at a gang comes to: the outcome the service layer reports, and the decision
behind each member placed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tessera.scheduler.domain.framework.runtime import ScheduleResult
from tessera.scheduler.domain.framework.status import Diagnosis
from tessera.scheduler.domain.gang.queue import RequeueReason
from tessera.scheduler.domain.snapshot import Allocation


class OutcomeKind(StrEnum):
    PLACED = "placed"
    WAITING = "waiting"
    UNSCHEDULABLE = "unschedulable"
    TIMED_OUT = "timed_out"
    BIND_FAILED = "bind_failed"
    BROKEN = "broken"


@dataclass(frozen=True)
class PodDecision:
    """Why a member went where it went: the node, its score, and the nodes the filters turned away."""

    pod: str
    node: str
    score: int
    """The chosen node's weighted score; 0 when it was the only feasible node (nothing to compare)."""
    feasible_nodes: int
    nodes_considered: int
    rejected: Mapping[str, int] = field(default_factory=dict)
    """Nodes the filters rejected, counted by reason."""


@dataclass(frozen=True)
class GangOutcome:
    """What happened to a gang; the service layer turns it into ``gang_placed``/``gang_unschedulable``."""

    gang: str
    kind: OutcomeKind
    bound: tuple[Allocation, ...] = ()
    evicted: tuple[Allocation, ...] = ()
    reason: RequeueReason | None = None
    message: str = ""
    diagnosis: Diagnosis | None = None
    deadline: float | None = None
    # The member that fit nowhere, for an unschedulable gang.
    pod: str | None = None
    # For a placed gang: the decision behind each member bound in this attempt.
    decisions: tuple[PodDecision, ...] = ()

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(allocation.node for allocation in self.bound)


_NO_REJECTIONS: Mapping[str, int] = {}


def decision_of(pod: str, result: ScheduleResult) -> PodDecision:
    """The decision behind placing ``pod`` where the framework's ``result`` put it."""
    assert result.node is not None
    filtered = result.filtered
    return PodDecision(
        pod,
        result.node,
        result.score,
        result.feasible_nodes,
        filtered.nodes_considered if filtered is not None else result.feasible_nodes,
        filtered.rejected if filtered is not None else _NO_REJECTIONS,
    )
