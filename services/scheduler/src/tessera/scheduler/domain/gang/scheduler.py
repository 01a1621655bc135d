"""The gang scheduling loop: every member reserved before any is bound, and nothing held by a partial gang.

One attempt takes the gang's unplaced members hardest first. Each runs a framework cycle on a fresh
snapshot (which already holds the members reserved before it), then Reserve and Permit. A member
that fits nowhere rejects the gang: every reservation is released at once and the gang is parked
with requeue hints. When Permit reports the quorum met, every waiting member is bound; if a bind
fails halfway, the members already bound are evicted, every reservation is released and the gang
goes to backoff. Members that wait past the gang's timeout are rejected together the same way.

Binding waits on the API, deciding does not: as kube-scheduler binds in goroutines of their own,
the gangs that reach quorum are decided one after another (each sees the reservations of those
before it) and their binds go out while the next gangs are decided. Through a port that starts a
call and returns at once (:class:`PipelinedRunner`), a gang's binds start as soon as it is decided
and it is finished (placed, or rolled back) on the deciding thread once they are done, up to
``bind_batch`` gangs in flight; through one that only runs calls together (:class:`ParallelRunner`),
up to ``bind_batch`` decided gangs are bound together and waited for. Each gang's members still
bind in order and stop at the first failure, and its outcome takes its place in the order the
gangs were tried.
"""

from __future__ import annotations

import concurrent.futures
import functools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar, runtime_checkable

from tessera.scheduler.domain.cache import PodState, SchedulerCache
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.framework.status import Code, Diagnosis, Reason, Status
from tessera.scheduler.domain.gang.member_changes import Member, MemberChanges, Waiting
from tessera.scheduler.domain.gang.outcome import GangOutcome as GangOutcome  # re-exported, with:
from tessera.scheduler.domain.gang.outcome import OutcomeKind as OutcomeKind
from tessera.scheduler.domain.gang.outcome import PodDecision as PodDecision
from tessera.scheduler.domain.gang.outcome import decision_of
from tessera.scheduler.domain.gang.queue import ALL_EVENTS, ClusterEvent, GangQueue, RequeueReason, hints_for
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import Allocation, NodeInfo

T = TypeVar("T")


class EvictionPort(Protocol):
    def evict(self, allocation: Allocation) -> None: ...


@runtime_checkable
class ParallelRunner(Protocol):
    """A binding port that can have many gangs' binds in flight: it runs the calls, any number at
    once, and returns their results in order."""

    def run_all(self, calls: Sequence[Callable[[], T]]) -> list[T]: ...


@runtime_checkable
class PipelinedRunner(Protocol):
    """A binding port that starts a call on a thread of its own and returns at once, so that the
    gang scheduler decides the next gangs while the binds it started are in flight."""

    def start(self, call: Callable[[], T]) -> Future[T]: ...


class AttemptWrapper(Protocol):
    """Runs one step of an attempt at a gang (deciding it, binding it, finishing it) and returns
    what the step returns; the service opens the decision's span there. It may be called from
    the runner's threads for the binding step."""

    def __call__(self, gang: str, step: Callable[[], T]) -> T: ...


DEFAULT_BIND_BATCH = 64
"""Gangs in flight at once: decided and binding, not yet finished."""


@dataclass
class _Ready:
    """A gang that reached quorum and waits for its binds: its reserved members, and the failure of
    the members beyond quorum that did not fit (they stay queued)."""

    gang: str
    waiting: Waiting
    failure: tuple[RequeueReason, Diagnosis] | None
    bound: list[Allocation] = field(default_factory=list)
    bind_failure: Status | None = None


class GangScheduler(MemberChanges):
    def __init__(
        self,
        framework: Framework,
        cache: SchedulerCache,
        registry: GangRegistry,
        queue: GangQueue,
        evictor: EvictionPort,
        bind_batch: int = DEFAULT_BIND_BATCH,
        pipeline: bool = True,
    ) -> None:
        if bind_batch < 1:
            raise ValueError(f"bind_batch: must be >= 1, got {bind_batch}")
        self.framework = framework
        self.cache = cache
        self.registry = registry
        self.queue = queue
        self.evictor = evictor
        self.bind_batch = bind_batch
        self._runner: ParallelRunner | None = evictor if isinstance(evictor, ParallelRunner) else None
        self._pipeline: PipelinedRunner | None = (
            evictor if pipeline and isinstance(evictor, PipelinedRunner) else None
        )
        self._waiting: dict[str, Waiting] = {}
        self._adopted: dict[str, dict[str, Allocation]] = {}

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
        self._adopted.pop(gang, None)
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
        """Expire timed-out waits, then try active gangs in queue order until none is left; every
        bind started is finished before it returns.

        ``around``, when given, runs each step of an attempt: it is called with the gang and the
        step to take, and returns the step's result (the service opens the decision's span there)."""
        step: AttemptWrapper = around if around is not None else _run_step
        if self._pipeline is not None:
            return self._run_pipelined(self._pipeline, now, max_attempts, step)
        outcomes: list[GangOutcome | None] = list(self.expire(now))
        ready: list[tuple[int, _Ready]] = []
        attempts = 0
        while max_attempts is None or attempts < max_attempts:
            entry = self.queue.pop(now)
            if entry is None:
                break
            decided = step(entry.name, functools.partial(self._decide, entry.name, now))
            if isinstance(decided, _Ready):
                ready.append((len(outcomes), decided))
                outcomes.append(None)
                if len(ready) >= self.bind_batch:
                    self._bind(ready, outcomes, now, step)
                    ready = []
            else:
                outcomes.append(decided)
            attempts += 1
        self._bind(ready, outcomes, now, step)
        return [outcome for outcome in outcomes if outcome is not None]

    def _run_pipelined(
        self, runner: PipelinedRunner, now: float, max_attempts: int | None, step: AttemptWrapper
    ) -> list[GangOutcome]:
        """:meth:`run` with each gang's binds started as soon as it is decided; a gang is finished
        here, on the deciding thread, once its binds are done (the oldest first), so that a bind
        failing part-way is rolled back exactly as when binding waited."""
        outcomes: list[GangOutcome | None] = list(self.expire(now))
        in_flight: deque[tuple[int, _Ready, Future[None]]] = deque()

        def finish_oldest() -> None:
            slot, ready, future = in_flight.popleft()
            future.result()  # the bind step's own exception, if it raised one (a BindError does not)
            outcomes[slot] = step(ready.gang, functools.partial(self._finish, ready, now))

        attempts = 0
        try:
            while max_attempts is None or attempts < max_attempts:
                while in_flight and in_flight[0][2].done():
                    finish_oldest()
                entry = self.queue.pop(now)
                if entry is None:
                    break
                decided = step(entry.name, functools.partial(self._decide, entry.name, now))
                if isinstance(decided, _Ready):
                    if len(in_flight) >= self.bind_batch:
                        finish_oldest()
                    bind = functools.partial(
                        step, decided.gang, functools.partial(self._bind_members, decided)
                    )
                    in_flight.append((len(outcomes), decided, runner.start(bind)))
                    outcomes.append(None)
                else:
                    outcomes.append(decided)
                attempts += 1
            while in_flight:
                finish_oldest()
        except BaseException:
            concurrent.futures.wait([future for _, _, future in in_flight])  # none is left running
            raise
        return [outcome for outcome in outcomes if outcome is not None]

    def attempt(self, gang: str, now: float) -> GangOutcome:
        """One attempt at ``gang``, bound at once if it reaches quorum."""
        decided = self._decide(gang, now)
        if not isinstance(decided, _Ready):
            return decided
        self._bind_members(decided)
        return self._finish(decided, now)

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

    def _decide(self, gang: str, now: float) -> GangOutcome | _Ready:
        """Reserve and permit the gang's pending members; a gang at quorum is ready to bind."""
        waiting = self._waiting.setdefault(gang, Waiting())
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
            waiting.members[pod.name] = Member(pod, state, result.node, decision_of(pod.name, result))
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
        return _Ready(gang, self._waiting.pop(gang, Waiting()), failure)

    def _bind(
        self,
        ready: list[tuple[int, _Ready]],
        outcomes: list[GangOutcome | None],
        now: float,
        step: AttemptWrapper,
    ) -> None:
        """Bind the ready gangs (each in its own step, all at once if the port can), then finish
        each in its own step, its outcome in its place."""
        calls = [functools.partial(step, r.gang, functools.partial(self._bind_members, r)) for _, r in ready]
        if self._runner is not None and len(calls) > 1:
            self._runner.run_all(calls)
        else:
            for call in calls:
                call()
        for slot, gang in ready:
            outcomes[slot] = step(gang.gang, functools.partial(self._finish, gang, now))

    def _bind_members(self, ready: _Ready) -> None:
        """Bind the members in order, stopping at the first failure."""
        for member in ready.waiting.members.values():
            allocation = self.cache.allocation(member.pod.name)
            if allocation is None or self.cache.pod_state(member.pod.name) is not PodState.ASSUMED:
                # never bind what the cache no longer holds for it: its GPUs may be another's now
                ready.bind_failure = Status.error(f"reservation of {member.pod.name} lost")
                return
            status = self.framework.run_bind(member.state, member.pod, member.node)
            if not status.ok:
                ready.bind_failure = status
                return
            ready.bound.append(allocation)

    def _finish(self, ready: _Ready, now: float) -> GangOutcome:
        """Placed, or (a bind failed) broken: what was bound is evicted, every reservation released."""
        gang, waiting = ready.gang, ready.waiting
        for allocation in ready.bound:
            self.registry.mark_bound(gang, allocation.pod)
        if ready.bind_failure is not None:
            self._waiting[gang] = waiting
            return self._break(
                gang, RequeueReason.BIND_FAILED, ready.bind_failure.message(), now, tuple(ready.bound)
            )
        decisions = tuple(member.decision for member in waiting.members.values())
        bound = (*ready.bound, *self._adopted.pop(gang, {}).values())  # and those found bound before
        outcome = GangOutcome(gang, OutcomeKind.PLACED, bound=bound, decisions=decisions)
        if ready.failure is None:
            self.queue.remove(gang)
        else:
            # Quorum holds; the members beyond it that do not fit yet stay queued on their own hints.
            self.queue.requeue(gang, ready.failure[0], now, hints=hints_for(ready.failure[1].reasons))
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
        self._adopted.pop(gang, None)
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


def _run_step(gang: str, step: Callable[[], T]) -> T:
    return step()


def _waiting_message(scheduler: GangScheduler, gang: str) -> str:
    spec = scheduler.registry.spec(gang)
    return f"{scheduler.registry.placed(gang)} of {spec.min_available} members reserved, waiting for quorum"
