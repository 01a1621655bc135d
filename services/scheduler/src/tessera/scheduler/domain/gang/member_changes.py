"""The gang scheduler's inputs about its members' pods changing under it: members never placed
whose pods were deleted, and reservations whose pods went while their gang waited for quorum.

:class:`MemberChanges` is mixed into :class:`~tessera.scheduler.domain.gang.scheduler.GangScheduler`,
which holds the state these inputs change; the members a gang has reserved while it waits for its
quorum (:class:`Waiting`) are kept here so that both sides share them."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace

from tessera.scheduler.domain.cache import PodState, SchedulerCache
from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.runtime import Framework
from tessera.scheduler.domain.gang.outcome import PodDecision
from tessera.scheduler.domain.gang.queue import ClusterEvent, GangQueue
from tessera.scheduler.domain.gang.registry import GangRegistry
from tessera.scheduler.domain.snapshot import Allocation


@dataclass
class Member:
    """A member reserved on ``node`` by the cycle whose ``state`` it keeps, not bound yet."""

    pod: PodSpec
    state: CycleState
    node: str
    decision: PodDecision


@dataclass
class Waiting:
    """A gang's reserved members while it waits for quorum, and when the wait times out."""

    deadline: float = float("inf")
    members: dict[str, Member] = field(default_factory=dict)


class MemberChanges:
    """Member pods deleted or gone under the gang scheduler (mixed into it)."""

    framework: Framework
    cache: SchedulerCache
    registry: GangRegistry
    queue: GangQueue
    _waiting: dict[str, Waiting]

    def members_gone(self, gang: str, present: Collection[str]) -> bool:
        """Members never placed whose pods are not ``present`` any more (a user deleted a pod that
        waited for a node) leave the gang, so no later attempt binds a pod that no longer exists: that
        bind would fail and break the gang, evicting its running members. True when no member is
        left and the gang is forgotten (the caller drops what it keeps of it)."""
        if gang not in self.registry:
            return False
        spec, held = self.registry.spec(gang), self.registry.held(gang)
        keep = tuple(m for m in spec.members if m.name in present or m.name in held)
        if len(keep) == len(spec.members):
            return False
        if not keep:
            self._waiting.pop(gang, None)
            self.registry.remove(gang)
            self.queue.remove(gang)
            return True
        self.registry.upsert(replace(spec, members=keep))
        if not self.registry.pending(gang) and gang not in self._waiting:
            self.queue.remove(gang)  # a gang waiting for its quorum stays queued until it times out
        return False

    def reservation_gone(self, pod: str, now: float) -> Allocation | None:
        """A member reserved while its gang waits for quorum, not bound, whose pod went (deleted, being
        deleted, or ended): its gang forgets the reservation everywhere (the waiting member and what
        it reserved, the registry's mark, the cache's assumption) and keeps waiting for quorum with
        the rest; parked gangs hear that capacity was freed. Binding the member at quorum would bind
        a pod that is gone with GPUs another gang may have taken since. The member stays in the
        gang's spec: :meth:`members_gone` drops it, now that it holds nothing, unless a pod of the
        same name came back (that one is placed afresh). Returns the freed allocation, or None when
        ``pod`` held no reservation."""
        if self.cache.pod_state(pod) is not PodState.ASSUMED:
            return None
        allocation = self.cache.allocation(pod)
        assert allocation is not None
        waiting = self._waiting.get(allocation.gang)
        member = waiting.members.pop(pod, None) if waiting is not None else None
        if member is not None:
            self.framework.run_unreserve(member.state, member.pod, member.node)
        self.cache.forget(pod)
        self.registry.unmark(allocation.gang, pod)
        self.queue.on_event(ClusterEvent.CAPACITY_FREED, now)
        return allocation
