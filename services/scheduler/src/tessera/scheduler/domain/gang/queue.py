"""The gang queue: active gangs by priority then submit time, backoff, and gangs parked until a hint fires.

It follows kube-scheduler's three queues. A gang that fit nowhere is parked with the cluster events
that could change that (its *requeue hints*) and comes back when one of them happens, or after
``max_parked_s`` as a safety net. A gang that timed out or failed to bind goes to backoff directly.
Either way it waits out an exponential backoff before it is tried again.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from tessera.scheduler.domain.framework.status import Reason
from tessera.scheduler.domain.gang.spec import GangSpec


class ClusterEvent(StrEnum):
    """Cluster changes that may let a parked gang fit."""

    CAPACITY_FREED = "capacity_freed"
    NODE_ADDED = "node_added"
    NODE_CHANGED = "node_changed"
    LAYOUT_CHANGED = "layout_changed"
    GANG_MEMBER_ADDED = "gang_member_added"


class RequeueReason(StrEnum):
    UNSCHEDULABLE = "unschedulable"
    PERMIT_TIMEOUT = "permit_timeout"
    BIND_FAILED = "bind_failed"
    RESERVE_FAILED = "reserve_failed"
    NODE_LOST = "node_lost"
    # Found bound below quorum when state was rebuilt (the scheduler stopped halfway through binding).
    PARTIAL_AFTER_RESTART = "partial_after_restart"


_CAPACITY = frozenset({ClusterEvent.CAPACITY_FREED, ClusterEvent.NODE_ADDED, ClusterEvent.NODE_CHANGED})
_HINTS: dict[str, frozenset[ClusterEvent]] = {
    Reason.INSUFFICIENT_GPU: _CAPACITY | {ClusterEvent.LAYOUT_CHANGED},
    Reason.INSUFFICIENT_CPU: _CAPACITY,
    Reason.INSUFFICIENT_MEMORY: _CAPACITY,
    Reason.GANG_EXCEEDS_FREE_CAPACITY: _CAPACITY | {ClusterEvent.LAYOUT_CHANGED},
    Reason.UNHEALTHY_GPU: frozenset({ClusterEvent.NODE_CHANGED, ClusterEvent.NODE_ADDED}),
    Reason.OVER_MPS_CLIENT_LIMIT: frozenset(
        {ClusterEvent.LAYOUT_CHANGED, ClusterEvent.NODE_CHANGED, ClusterEvent.NODE_ADDED}
    ),
    Reason.MODEL_NOT_ALLOWED: frozenset({ClusterEvent.NODE_ADDED, ClusterEvent.NODE_CHANGED}),
    Reason.NODE_UNSCHEDULABLE: frozenset({ClusterEvent.NODE_CHANGED, ClusterEvent.NODE_ADDED}),
    Reason.INSUFFICIENT_MIG: frozenset(
        {ClusterEvent.LAYOUT_CHANGED, ClusterEvent.CAPACITY_FREED, ClusterEvent.NODE_ADDED}
    ),
    Reason.GANG_INCOMPLETE: frozenset({ClusterEvent.GANG_MEMBER_ADDED}),
}
ALL_EVENTS = frozenset(ClusterEvent)


def hints_for(reasons: Iterable[str]) -> frozenset[ClusterEvent]:
    """The events worth waking a gang for, given why its nodes were rejected. Unknown reasons wake on any."""
    hints: set[ClusterEvent] = set()
    for reason in reasons:
        known = next((events for prefix, events in _HINTS.items() if reason.startswith(prefix)), None)
        hints |= known if known is not None else ALL_EVENTS
    return frozenset(hints) | {ClusterEvent.GANG_MEMBER_ADDED}


@dataclass(frozen=True)
class BackoffPolicy:
    initial_s: float = 1.0
    max_s: float = 60.0

    def __post_init__(self) -> None:
        if self.initial_s <= 0:
            raise ValueError(f"backoff.initial_s: must be > 0, got {self.initial_s}")
        if self.max_s < self.initial_s:
            raise ValueError(f"backoff.max_s: must be >= initial_s ({self.initial_s}), got {self.max_s}")

    def delay(self, attempts: int) -> float:
        """Doubles with every failed attempt, up to the maximum."""
        return float(min(self.max_s, self.initial_s * 2.0 ** max(0, min(attempts - 1, 62))))


class QueueOrder(StrEnum):
    """Which time breaks ties between gangs of equal priority."""

    # When the gang was submitted: a gang keeps its place however often it fails (coscheduling).
    SUBMITTED = "submitted"
    # When it was last queued: a failed attempt sends it behind the others, as kube-scheduler's
    # PrioritySort does for single pods (the queue refreshes a pod's timestamp when it is re-added).
    LAST_QUEUED = "last_queued"


@dataclass
class QueuedGang:
    name: str
    priority: int
    submitted_at: float
    attempts: int = 0
    backoff_until: float = 0.0
    parked_at: float | None = None
    hints: frozenset[ClusterEvent] = frozenset()
    last_reason: RequeueReason | None = None
    last_message: str = ""
    seq: int = field(default=0, repr=False)
    queued_at: float = 0.0

    def sort_key(self, order: QueueOrder = QueueOrder.SUBMITTED) -> tuple[int, float, int]:
        at = self.submitted_at if order is QueueOrder.SUBMITTED else self.queued_at
        return (-self.priority, at, self.seq)


class GangQueue:
    def __init__(
        self,
        backoff: BackoffPolicy | None = None,
        max_parked_s: float = 300.0,
        order: QueueOrder = QueueOrder.SUBMITTED,
    ) -> None:
        self.backoff = backoff or BackoffPolicy()
        self.max_parked_s = max_parked_s
        self.order = order
        self._entries: dict[str, QueuedGang] = {}
        self._active: list[tuple[tuple[int, float, int], str]] = []
        self._in_active: set[str] = set()
        self._backoff: set[str] = set()
        self._parked: set[str] = set()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, gang: str) -> bool:
        return gang in self._entries

    def entry(self, gang: str) -> QueuedGang:
        return self._entries[gang]

    def add(self, spec: GangSpec) -> None:
        """Queue a new gang; for a known one (more members arrived) wake it if it is parked."""
        if spec.name in self._entries:
            entry = self._entries[spec.name]
            entry.priority = spec.priority
            if spec.name in self._parked:
                self._wake(spec.name, now=entry.backoff_until)
            elif spec.name not in self._backoff:
                self._push_active(entry)
            return
        self._seq += 1
        entry = QueuedGang(
            spec.name, spec.priority, spec.submitted_at, seq=self._seq, queued_at=spec.submitted_at
        )
        self._entries[spec.name] = entry
        self._push_active(entry)

    def remove(self, gang: str) -> None:
        """Placed or withdrawn: out of every queue (stale heap entries are skipped on pop)."""
        self._entries.pop(gang, None)
        self._in_active.discard(gang)
        self._backoff.discard(gang)
        self._parked.discard(gang)

    def pop(self, now: float) -> QueuedGang | None:
        """The highest-priority, earliest-submitted active gang, after moving due backoffs in."""
        self.flush(now)
        while self._active:
            _, name = heapq.heappop(self._active)
            if name in self._in_active:
                self._in_active.discard(name)
                return self._entries[name]
        return None

    def requeue(
        self,
        gang: str,
        reason: RequeueReason,
        now: float,
        *,
        hints: frozenset[ClusterEvent] = ALL_EVENTS,
        message: str = "",
    ) -> QueuedGang:
        """A failed attempt: park it on its hints (unschedulable) or send it to backoff (anything else)."""
        entry = self._entries[gang]
        self._in_active.discard(gang)
        entry.attempts += 1
        entry.queued_at = now
        self._seq += 1
        entry.seq = self._seq
        entry.backoff_until = now + self.backoff.delay(entry.attempts)
        entry.last_reason, entry.last_message, entry.hints = reason, message, hints
        if reason is RequeueReason.UNSCHEDULABLE:
            entry.parked_at = now
            self._parked.add(gang)
        else:
            self._backoff.add(gang)
        return entry

    def on_event(self, event: ClusterEvent, now: float) -> int:
        """Wake the parked gangs whose hints include ``event``; returns how many woke."""
        woken = [name for name in self._parked if event in self._entries[name].hints]
        for name in woken:
            self._wake(name, now)
        return len(woken)

    def flush(self, now: float) -> None:
        for name in [
            n for n in self._parked if now - (self._entries[n].parked_at or now) >= self.max_parked_s
        ]:
            self._wake(name, now)
        for name in [n for n in self._backoff if self._entries[n].backoff_until <= now]:
            self._backoff.discard(name)
            self._push_active(self._entries[name])

    def next_wakeup(self) -> float | None:
        """When the next backoff ends or a parked gang is flushed; None if nothing is timed."""
        times = [self._entries[n].backoff_until for n in self._backoff]
        if math.isfinite(self.max_parked_s):
            times += [(self._entries[n].parked_at or 0.0) + self.max_parked_s for n in self._parked]
        return min(times, default=None)

    def active(self) -> tuple[str, ...]:
        return tuple(sorted(self._in_active, key=lambda n: self._entries[n].sort_key(self.order)))

    def parked(self) -> tuple[str, ...]:
        return tuple(sorted(self._parked))

    def backing_off(self) -> tuple[str, ...]:
        return tuple(sorted(self._backoff))

    def _wake(self, name: str, now: float) -> None:
        self._parked.discard(name)
        entry = self._entries[name]
        entry.parked_at = None
        if entry.backoff_until <= now:
            self._push_active(entry)
        else:
            self._backoff.add(name)

    def _push_active(self, entry: QueuedGang) -> None:
        if entry.name not in self._in_active:
            self._in_active.add(entry.name)
            heapq.heappush(self._active, (entry.sort_key(self.order), entry.name))
