"""What the scheduler knows of each live gang: its spec, and which members are reserved or bound.

The registry is plain data rebuilt from the gang specs and the cache's allocations after a
restart (see :meth:`GangRegistry.rebuild`); nothing in it lives only in memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import Allocation


@dataclass
class _GangState:
    spec: GangSpec
    reserved: set[str] = field(default_factory=set)
    bound: set[str] = field(default_factory=set)


class GangRegistry:
    def __init__(self) -> None:
        self._gangs: dict[str, _GangState] = {}

    @classmethod
    def rebuild(cls, specs: Iterable[GangSpec], bound: Iterable[Allocation]) -> GangRegistry:
        registry = cls()
        for spec in specs:
            registry.upsert(spec)
        for allocation in bound:
            if allocation.gang in registry:
                registry.mark_reserved(allocation.gang, allocation.pod)
                registry.mark_bound(allocation.gang, allocation.pod)
        return registry

    def __contains__(self, gang: str) -> bool:
        return gang in self._gangs

    def upsert(self, spec: GangSpec) -> None:
        """A new gang, or more members of a known one; what is reserved or bound carries over."""
        state = self._gangs.get(spec.name)
        if state is None:
            self._gangs[spec.name] = _GangState(spec)
        else:
            state.spec = spec

    def remove(self, gang: str) -> None:
        self._gangs.pop(gang, None)

    def spec(self, gang: str) -> GangSpec:
        try:
            return self._gangs[gang].spec
        except KeyError:
            raise KeyError(f"gang {gang!r} is not registered") from None

    def gangs(self) -> tuple[GangSpec, ...]:
        return tuple(state.spec for state in self._gangs.values())

    def mark_reserved(self, gang: str, pod: str) -> None:
        self._gangs[gang].reserved.add(pod)

    def mark_bound(self, gang: str, pod: str) -> None:
        self._gangs[gang].bound.add(pod)

    def unmark(self, gang: str, pod: str) -> None:
        """Forget a member's reservation and binding. Idempotent, and a no-op for an unknown gang."""
        state = self._gangs.get(gang)
        if state is not None:
            state.reserved.discard(pod)
            state.bound.discard(pod)

    def placed(self, gang: str) -> int:
        """Members reserved or bound (a bound member stays reserved)."""
        state = self._gangs.get(gang)
        return len(state.reserved) if state else 0

    def held(self, gang: str) -> frozenset[str]:
        """Members reserved or bound."""
        state = self._gangs.get(gang)
        return frozenset(state.reserved) if state else frozenset()

    def bound(self, gang: str) -> frozenset[str]:
        state = self._gangs.get(gang)
        return frozenset(state.bound) if state else frozenset()

    def pending(self, gang: str) -> tuple[PodSpec, ...]:
        """Members neither reserved nor bound, the hardest (most GPUs) first so a hopeless gang fails fast."""
        state = self._gangs[gang]
        waiting = [pod for pod in state.spec.members if pod.name not in state.reserved]
        return tuple(sorted(waiting, key=lambda pod: (-pod.gpu_milli_total, -len(pod.mig), pod.name)))

    def quorum_met(self, gang: str) -> bool:
        state = self._gangs.get(gang)
        return state is not None and len(state.reserved) >= state.spec.min_available
