"""The gang scheduler's inputs about its members' pods changing under it: members never placed
whose pods were deleted, reservations whose pods went while their gang waited for quorum, and
members found bound where the scheduler's own bind put them though it had let them go.

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
from tessera.scheduler.domain.gang.outcome import GangOutcome, OutcomeKind, PodDecision
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
    _adopted: dict[str, dict[str, Allocation]]  # gang -> members adopted bound, not yet placed

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
            self._adopted.pop(gang, None)
            self.registry.remove(gang)
            self.queue.remove(gang)
            return True
        self.registry.upsert(replace(spec, members=keep))
        if not self.registry.pending(gang) and gang not in self._waiting:
            self.queue.remove(gang)  # a gang waiting for its quorum stays queued until it times out
        return False

    def adopt(self, allocation: Allocation, now: float) -> GangOutcome | None:
        """A member of a live gang found bound where the scheduler's own bind put it, though the
        scheduler let it go (a bind that timed out but landed, a rollback whose eviction did not take,
        a bind of an earlier leader landing late): it holds ``allocation`` in the cache, bound, and
        counts as placed in its gang, as a rebuild adopts it. When that meets the gang's quorum with
        no member reserved and waiting for its bind, the gang is placed at once with the members
        adopted so far; else they join its next placement, or are evicted with it if it is broken.
        Raises :class:`~tessera.scheduler.domain.cache.CacheConflict` (nothing changed) when the
        cache cannot hold it, KeyError when its gang is not registered."""
        gang, pod = allocation.gang, allocation.pod
        self.registry.spec(gang)  # a live gang, or KeyError before anything changes
        self.cache.assume(allocation)
        self.cache.confirm_bound(pod)
        self.registry.mark_reserved(gang, pod)
        self.registry.mark_bound(gang, pod)
        self._adopted.setdefault(gang, {})[pod] = allocation
        if not self.registry.quorum_met(gang):
            return None
        waiting = self._waiting.get(gang)
        if waiting is not None and waiting.members:
            self.queue.add(self.registry.spec(gang))  # quorum met: bind the waiting members next
            return None
        self._waiting.pop(gang, None)
        if not self.registry.pending(gang):
            self.queue.remove(gang)
        bound = tuple(self._adopted.pop(gang).values())
        return GangOutcome(gang, OutcomeKind.PLACED, bound=bound)

    def not_placed(self, pod: str) -> bool:
        """Whether ``pod`` is held for its gang but not placed: reserved while the gang waits for
        quorum, or adopted bound (:meth:`adopt`) before the gang is placed."""
        if self.cache.pod_state(pod) is PodState.ASSUMED:
            return True
        allocation = self.cache.allocation(pod)
        return allocation is not None and pod in self._adopted.get(allocation.gang, {})

    def reservation_gone(self, pod: str, now: float) -> Allocation | None:
        """A member reserved while its gang waits for quorum, not bound, whose pod went (deleted, being
        deleted, or ended): its gang forgets the reservation everywhere (the waiting member and what
        it reserved, the registry's mark, the cache's assumption) and keeps waiting for quorum with
        the rest; parked gangs hear that capacity was freed. Binding the member at quorum would bind
        a pod that is gone with GPUs another gang may have taken since. The member stays in the
        gang's spec: :meth:`members_gone` drops it, now that it holds nothing, unless a pod of the
        same name came back (that one is placed afresh). Returns the freed allocation, or None when
        ``pod`` held no reservation. A member adopted bound and not yet placed is forgotten the same
        way (:meth:`not_placed`)."""
        if not self.not_placed(pod):
            return None
        allocation = self.cache.allocation(pod)
        assert allocation is not None
        self._adopted.get(allocation.gang, {}).pop(pod, None)
        waiting = self._waiting.get(allocation.gang)
        member = waiting.members.pop(pod, None) if waiting is not None else None
        if member is not None:
            self.framework.run_unreserve(member.state, member.pod, member.node)
        self.cache.remove_pod(pod)
        self.registry.unmark(allocation.gang, pod)
        self.queue.on_event(ClusterEvent.CAPACITY_FREED, now)
        return allocation
