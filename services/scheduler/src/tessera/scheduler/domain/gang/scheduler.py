"""The gang scheduling loop: every member reserved before any is bound, and nothing held by a partial gang.

One attempt takes the gang's unplaced members hardest first. Each runs a framework cycle on a fresh
snapshot (which already holds the members reserved before it), then Reserve and Permit. A member
that fits nowhere rejects the gang: every reservation is released at once and the gang is parked
with requeue hints. When Permit reports the quorum met, every waiting member is bound; if a bind
fails halfway, the members already bound are evicted, every reservation is released and the gang
goes to backoff. Members that wait past the gang's timeout are rejected together the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from tessera.scheduler.domain.cache import SchedulerCache
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.runtime import Framework, ScheduleResult
from tessera.scheduler.domain.framework.status import Code, Diagnosis, Reason, Status
from tessera.scheduler.domain.gang.queue import ALL_EVENTS, ClusterEvent, GangQueue, RequeueReason, hints_for
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo


class EvictionPort(Protocol):
    def evict(self, allocation: Allocation) -> None: ...


# Runs one attempt (the callable) at a gang and returns its outcome.
AttemptWrapper = Callable[[str, Callable[[], "GangOutcome"]], "GangOutcome"]


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


@dataclass
class _Member:
    pod: PodSpec
    state: CycleState
    node: str
    decision: PodDecision


@dataclass
class _Waiting:
    deadline: float = float("inf")
    members: dict[str, _Member] = field(default_factory=dict)


class GangScheduler:
    def __init__(
        self,
        framework: Framework,
        cache: SchedulerCache,
        registry: GangRegistry,
        queue: GangQueue,
        evictor: EvictionPort,
    ) -> None:
        self.framework = framework
        self.cache = cache
        self.registry = registry
        self.queue = queue
        self.evictor = evictor
        self._waiting: dict[str, _Waiting] = {}

    # -- inputs --------------------------------------------------------------------------------

    def submit(self, spec: GangSpec) -> None:
        """A new gang, or more members of a known one (a waiting gang is tried again at once)."""
        self.registry.upsert(spec)
        if self.registry.pending(spec.name):
            self.queue.add(spec)

    def notify(self, event: ClusterEvent, now: float) -> int:
        """A cluster change: wake the parked gangs it may help."""
        return self.queue.on_event(event, now)

    def gang_finished(self, gang: str, now: float) -> tuple[Allocation, ...]:
        """The gang's job ended: its pods leave the cache and parked gangs hear that capacity was freed."""
        released = tuple(
            allocation
            for pod in self._members(gang)
            if (allocation := self.cache.remove_pod(pod)) is not None
        )
        self._waiting.pop(gang, None)
        self.registry.remove(gang)
        self.queue.remove(gang)
        if released:
            self.queue.on_event(ClusterEvent.CAPACITY_FREED, now)
        return released

    def node_lost(self, node: str, now: float) -> list[GangOutcome]:
        """A node is gone: every gang with a member there is broken, evicted whole and requeued."""
        return self._broken_by(self.cache.remove_node(node), f"node {node} lost", now)

    def node_changed(self, node: NodeInfo, now: float) -> list[GangOutcome]:
        """A node added or updated by a watch or ``inventory_changed``: gangs on vanished GPUs are
        broken; parked gangs that a new or changed node may help are woken."""
        known = node.name in self.cache.snapshot().nodes
        outcomes = self._broken_by(self.cache.upsert_node(node), f"GPUs of {node.name} vanished", now)
        self.queue.on_event(ClusterEvent.NODE_CHANGED if known else ClusterEvent.NODE_ADDED, now)
        return outcomes

    def gpu_health_changed(self, node: str, index: int, healthy: bool, now: float) -> None:
        """``gpu_unhealthy`` or a recovery. Pods already on the GPU stay (telemetry and operators
        decide about them); new pods avoid it, and a recovery wakes the gangs it may help."""
        self.cache.set_gpu_health(node, index, healthy)
        if healthy:
            self.queue.on_event(ClusterEvent.NODE_CHANGED, now)

    def schedulable_changed(self, node: str, schedulable: bool, now: float) -> None:
        """Cordon or uncordon, Ready or NotReady."""
        self.cache.set_schedulable(node, schedulable)
        if schedulable:
            self.queue.on_event(ClusterEvent.NODE_CHANGED, now)

    def slices_changed(self, node: str, capacity: Mapping[str, int], now: float) -> None:
        """Slice inventory from the slicing service: the MIG devices a node now advertises."""
        self.cache.set_mig_capacity(node, capacity)
        self.queue.on_event(ClusterEvent.LAYOUT_CHANGED, now)

    def recover(self, now: float) -> list[GangOutcome]:
        """After state was rebuilt: evict gangs bound below quorum, and queue gangs with members left."""
        outcomes = []
        for spec in self.registry.gangs():
            bound = self.registry.bound(spec.name)
            if bound and len(bound) < spec.min_available:
                message = f"{len(bound)} of {spec.min_available} members bound when state was rebuilt"
                outcomes.append(self._break(spec.name, RequeueReason.PARTIAL_AFTER_RESTART, message, now, ()))
            elif self.registry.pending(spec.name):
                self.queue.add(spec)
        return outcomes

    # -- the loop ------------------------------------------------------------------------------

    def run(
        self, now: float, max_attempts: int | None = None, around: AttemptWrapper | None = None
    ) -> list[GangOutcome]:
        """Expire timed-out waits, then try active gangs in queue order until none is left.

        ``around``, when given, runs each attempt: it is called with the gang and the attempt to
        make, and returns its outcome (the service opens the decision's span there)."""
        outcomes = self.expire(now)
        attempts = 0
        while max_attempts is None or attempts < max_attempts:
            entry = self.queue.pop(now)
            if entry is None:
                break
            attempt = functools.partial(self.attempt, entry.name, now)
            outcomes.append(attempt() if around is None else around(entry.name, attempt))
            attempts += 1
        return outcomes

    def expire(self, now: float) -> list[GangOutcome]:
        due = sorted(gang for gang, waiting in self._waiting.items() if waiting.deadline <= now)
        return [
            self._reject(gang, RequeueReason.PERMIT_TIMEOUT, Diagnosis.whole_pod(_TIMEOUT, 0), now)
            for gang in due
        ]

    def next_wakeup(self) -> float | None:
        """The next time something is due: a backoff ending, a parked flush, a Permit timeout."""
        times = [waiting.deadline for waiting in self._waiting.values() if waiting.deadline != float("inf")]
        queued = self.queue.next_wakeup()
        if queued is not None:
            times.append(queued)
        return min(times, default=None)

    def waiting(self) -> dict[str, float]:
        """Gangs with members reserved and waiting for quorum, with their deadlines."""
        return {gang: waiting.deadline for gang, waiting in self._waiting.items() if waiting.members}

    def attempt(self, gang: str, now: float) -> GangOutcome:
        waiting = self._waiting.setdefault(gang, _Waiting())
        failure: tuple[RequeueReason, Diagnosis] | None = None
        failed_pod: str | None = None
        for pod in self.registry.pending(gang):
            failed_pod = pod.name
            state = CycleState()
            snapshot = self.cache.snapshot()
            result = self.framework.schedule_pod(state, pod, snapshot)
            if result.node is None:
                assert result.diagnosis is not None
                failure = (RequeueReason.UNSCHEDULABLE, result.diagnosis)
                break
            status = self.framework.run_reserve(state, pod, result.node)
            if not status.ok:
                failure = (RequeueReason.RESERVE_FAILED, Diagnosis.whole_pod(status, len(snapshot)))
                break
            waiting.members[pod.name] = _Member(pod, state, result.node, _decision(pod.name, result))
            self.registry.mark_reserved(gang, pod.name)
            status, timeout = self.framework.run_permit(state, pod, result.node)
            if status.rejected:
                failure = (RequeueReason.UNSCHEDULABLE, Diagnosis.whole_pod(status, len(snapshot)))
                break
            if status.code is Code.WAIT:
                waiting.deadline = min(waiting.deadline, now + timeout)
            failed_pod = None
        if not self.registry.quorum_met(gang):
            if failure is not None:
                return replace(self._reject(gang, failure[0], failure[1], now), pod=failed_pod)
            return GangOutcome(
                gang, OutcomeKind.WAITING, deadline=waiting.deadline, message=_waiting_message(self, gang)
            )
        outcome = self._bind_waiting(gang, now)
        if outcome.kind is OutcomeKind.PLACED:
            if failure is None:
                self.queue.remove(gang)
            else:
                # Quorum holds; the members beyond it that do not fit yet stay queued on their own hints.
                self.queue.requeue(gang, failure[0], now, hints=hints_for(failure[1].reasons))
        return outcome

    # -- internals -----------------------------------------------------------------------------

    def _broken_by(self, lost: tuple[Allocation, ...], message: str, now: float) -> list[GangOutcome]:
        outcomes = []
        for gang in sorted({allocation.gang for allocation in lost if allocation.gang in self.registry}):
            bound = self.registry.bound(gang)
            gone_bound = tuple(a for a in lost if a.gang == gang and a.pod in bound)
            for allocation in lost:
                if allocation.gang == gang:
                    self.registry.unmark(gang, allocation.pod)
                    waiting = self._waiting.get(gang)
                    if waiting is not None:
                        waiting.members.pop(allocation.pod, None)
            outcomes.append(self._break(gang, RequeueReason.NODE_LOST, message, now, gone_bound))
        return outcomes

    def _bind_waiting(self, gang: str, now: float) -> GangOutcome:
        waiting = self._waiting.pop(gang, _Waiting())
        bound: list[Allocation] = []
        for member in waiting.members.values():
            allocation = self.cache.allocation(member.pod.name)
            status = self.framework.run_bind(member.state, member.pod, member.node)
            if not status.ok or allocation is None:
                self._waiting[gang] = waiting
                return self._break(gang, RequeueReason.BIND_FAILED, status.message(), now, tuple(bound))
            self.registry.mark_bound(gang, member.pod.name)
            bound.append(allocation)
        decisions = tuple(member.decision for member in waiting.members.values())
        return GangOutcome(gang, OutcomeKind.PLACED, bound=tuple(bound), decisions=decisions)

    def _break(
        self, gang: str, reason: RequeueReason, message: str, now: float, already_gone: Iterable[Allocation]
    ) -> GangOutcome:
        """Evict every bound member, release every reservation, send the gang to backoff."""
        evicted = [allocation for allocation in already_gone if allocation.gang == gang]
        gone = {allocation.pod for allocation in evicted}
        for pod in sorted(self.registry.bound(gang)):
            allocation = self.cache.remove_pod(pod)
            self.registry.unmark(gang, pod)
            if allocation is not None and pod not in gone:
                evicted.append(allocation)
        for allocation in evicted:
            self.evictor.evict(allocation)
        self._release_waiting(gang)
        kind = OutcomeKind.BIND_FAILED if reason is RequeueReason.BIND_FAILED else OutcomeKind.BROKEN
        if gang in self.registry:
            if gang not in self.queue:
                self.queue.add(self.registry.spec(gang))
            self.queue.requeue(gang, reason, now, hints=ALL_EVENTS, message=message)
        return GangOutcome(gang, kind, evicted=tuple(evicted), reason=reason, message=message)

    def _reject(self, gang: str, reason: RequeueReason, diagnosis: Diagnosis, now: float) -> GangOutcome:
        """Release every reservation at once and requeue: parked on hints, or to backoff."""
        self._release_waiting(gang)
        hints = hints_for(diagnosis.reasons) if reason is RequeueReason.UNSCHEDULABLE else ALL_EVENTS
        message = diagnosis.message()
        self.queue.requeue(gang, reason, now, hints=hints, message=message)
        kind = OutcomeKind.TIMED_OUT if reason is RequeueReason.PERMIT_TIMEOUT else OutcomeKind.UNSCHEDULABLE
        return GangOutcome(gang, kind, reason=reason, message=message, diagnosis=diagnosis)

    def _release_waiting(self, gang: str) -> None:
        waiting = self._waiting.pop(gang, None)
        if waiting is None:
            return
        for member in reversed(list(waiting.members.values())):
            self.framework.run_unreserve(member.state, member.pod, member.node)
            self.registry.unmark(gang, member.pod.name)

    def _members(self, gang: str) -> tuple[str, ...]:
        if gang not in self.registry:
            return ()
        return tuple(pod.name for pod in self.registry.spec(gang).members)


_TIMEOUT = Status.unschedulable(Reason.PERMIT_TIMEOUT)
_NO_REJECTIONS: Mapping[str, int] = {}


def _decision(pod: str, result: ScheduleResult) -> PodDecision:
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


def _waiting_message(scheduler: GangScheduler, gang: str) -> str:
    spec = scheduler.registry.spec(gang)
    return f"{scheduler.registry.placed(gang)} of {spec.min_available} members reserved, waiting for quorum"
