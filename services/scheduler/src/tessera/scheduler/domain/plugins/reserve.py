"""Reserve and Bind: assume the placement in the cache at once, then make it real through a port."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from tessera.scheduler.domain.cache import CacheConflict, SchedulerCache
from tessera.scheduler.domain.framework.cycle_state import CycleState, StateKey
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.status import Reason, Status
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.snapshot import Allocation

ALLOCATION: StateKey[Allocation] = StateKey("CacheReserve/allocation")


class BindError(Exception):
    """The cluster refused or lost a bind (API error, node gone, conflict)."""


class BindingPort(Protocol):
    """How the domain binds and evicts; the Kubernetes adapter uses the Binding and Eviction APIs."""

    def bind(self, allocation: Allocation) -> None: ...

    def evict(self, allocation: Allocation) -> None: ...


@dataclass(frozen=True)
class CacheReserve:
    """Assume the chosen GPUs, CPU, memory and MIG devices in the cache; Unreserve forgets them."""

    cache: SchedulerCache
    name: str = "CacheReserve"

    def reserve(self, state: CycleState, pod: PodSpec, node: str) -> Status:
        choice = state.read(GPU_CHOICE).get(node, ())
        if pod.gpu_count and not choice:
            return Status.error(f"no GPU choice recorded for {pod.name} on {node}")
        allocation = Allocation(
            pod=pod.name,
            gang=pod.gang,
            node=node,
            gpu_milli=choice,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            mig=tuple(sorted(MappingProxyType(pod.mig).items())),
        )
        try:
            self.cache.assume(allocation)
        except CacheConflict as conflict:
            return Status.error(str(conflict))
        state.write(ALLOCATION, allocation)
        return Status.success()

    def unreserve(self, state: CycleState, pod: PodSpec, node: str) -> None:
        self.cache.forget(pod.name)


@dataclass(frozen=True)
class DefaultBinder:
    """Bind through the port; a success turns the cache's assumption into a bound pod."""

    cache: SchedulerCache
    port: BindingPort
    name: str = "DefaultBinder"

    def bind(self, state: CycleState, pod: PodSpec, node: str) -> Status:
        allocation = state.read(ALLOCATION)
        if self.cache.allocation(pod.name) != allocation:
            # the reservation went (its pod was deleted): binding it would hand its GPUs out twice
            return Status.error(Reason.BIND_FAILED, f"pod {pod.name}: its reservation is no longer held")
        try:
            self.port.bind(allocation)
        except BindError as error:
            return Status.error(Reason.BIND_FAILED, str(error))
        try:
            self.cache.confirm_bound(pod.name)
        except CacheConflict as conflict:  # the reservation went while the bind was in flight
            return Status.error(Reason.BIND_FAILED, str(conflict))
        return Status.success()


@dataclass
class RecordingBinder:
    """A binding port that records binds and evictions, failing the Nth bind (1-based) if asked.

    The benchmark and the tests use it in place of the Kubernetes API.
    """

    fail_on: frozenset[int] = frozenset()
    bound: list[Allocation] = field(default_factory=list)
    evicted: list[Allocation] = field(default_factory=list)
    calls: int = 0

    def bind(self, allocation: Allocation) -> None:
        self.calls += 1
        if self.calls in self.fail_on:
            raise BindError(f"bind #{self.calls} of {allocation.pod} to {allocation.node} refused")
        self.bound.append(allocation)

    def evict(self, allocation: Allocation) -> None:
        self.evicted.append(allocation)
