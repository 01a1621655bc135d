"""Staging: host memory allocated once, laid out once, reused by every snapshot.

A snapshot is one copy of every tensor into its slot of an arena; the flush thread then writes the arena
to storage in chunks while training goes on. The arena is allocated on the first snapshot (or by
`prepare`) and touched once then, so later snapshots pay for the copy alone, not for page faults. A
state whose layout changes (an optimizer that grew its moments) is laid out again in the same arena
when it fits, and gets a larger one only when it does not.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.checkpoint_client.tree import Bytes, Flat, LeafAdapter

ALIGN = 256  # every tensor starts on a 256-byte boundary: cache lines, vector loads, DMA
HOST = "host"


@dataclass(frozen=True)
class Slot:
    name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Plan:
    slots: tuple[Slot, ...]
    total_bytes: int

    @property
    def signature(self) -> tuple[tuple[str, int], ...]:
        return tuple((s.name, s.nbytes) for s in self.slots)


def plan_layout(names_and_sizes: Sequence[tuple[str, int]], align: int = ALIGN) -> Plan:
    """Slots in the given order, each aligned; `total_bytes` is where the last one ends."""
    slots = []
    offset = 0
    for name, nbytes in names_and_sizes:
        offset = -(-offset // align) * align
        slots.append(Slot(name, offset, nbytes))
        offset += nbytes
    return Plan(tuple(slots), offset)


def allocate_host(nbytes: int) -> Bytes:
    """Plain host memory, pre-faulted: writing zeros once maps every page (NumPy asks for huge pages)."""
    arena = np.empty(max(nbytes, 1), dtype=np.uint8)
    arena.fill(0)
    return arena


class Staging:
    """One arena and the plan of the state it holds."""

    def __init__(self, arena: Bytes, kind: str, plan: Plan) -> None:
        self.arena = arena
        self.kind = kind
        self.plan = plan
        self.views: list[Bytes] = []
        self.relayout(plan)

    @property
    def capacity(self) -> int:
        return int(self.arena.nbytes)

    def relayout(self, plan: Plan) -> None:
        self.plan = plan
        self.views = [self.arena[s.offset : s.offset + s.nbytes] for s in plan.slots]

    def used(self) -> Bytes:
        return self.arena[: self.plan.total_bytes]


def staging_kind(flat: Flat, adapters: Sequence[LeafAdapter]) -> tuple[str, LeafAdapter | None]:
    for adapter in adapters:
        leaves = [leaf.obj for leaf in flat.tensors if leaf.adapter is adapter]
        if leaves:
            kind = adapter.staging_kind(leaves)
            if kind is not None:
                return kind, adapter
    return HOST, None


class StagingPool:
    """`size` stagings; a snapshot takes a free one, its flush gives it back.

    With one (the default) a snapshot cannot start while the previous flush runs: `acquire(block=False)`
    says so and the caller defers. With two, a snapshot can be taken during a flush at twice the memory.
    """

    def __init__(self, size: int = 1) -> None:
        if size < 1:
            raise ValueError("at least one staging buffer")
        self.size = size
        self._all: list[Staging] = []
        self._free: list[Staging] = []
        self._cond = threading.Condition()
        self._creating = 0
        self.allocations = 0  # arenas allocated so far (a warm pool allocates none)
        self.allocated_bytes = 0

    def free_count(self) -> int:
        with self._cond:
            return self._available()

    def _available(self) -> int:
        return len(self._free) + self.size - len(self._all) - self._creating

    def acquire(
        self, flat: Flat, adapters: Sequence[LeafAdapter], *, block: bool, timeout: float | None = None
    ) -> Staging | None:
        """A staging laid out for `flat`, or None when none is free and `block` is False (or on time-out)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._available() > 0, timeout=timeout if block else 0):
                return None
            staging = self._free.pop() if self._free else None
            if staging is not None:
                self._all.remove(staging)
            self._creating += 1
        try:
            plan = plan_layout([(leaf.name, leaf.info.nbytes) for leaf in flat.tensors if leaf.info])
            kind, adapter = staging_kind(flat, adapters)
            if staging is None or staging.kind != kind or staging.capacity < plan.total_bytes:
                staging = None  # the old arena (if any) goes before the new one is allocated
                arena = (
                    allocate_host(plan.total_bytes)
                    if adapter is None
                    else adapter.allocate(plan.total_bytes, kind)
                )
                staging = Staging(arena, kind, plan)
                with self._cond:
                    self.allocations += 1
                    self.allocated_bytes += staging.capacity
            elif staging.plan.signature != plan.signature:
                staging.relayout(plan)
        except BaseException:
            with self._cond:
                self._creating -= 1
                if staging is not None:
                    self._all.append(staging)
                    self._free.append(staging)
                self._cond.notify_all()
            raise
        with self._cond:
            self._creating -= 1
            self._all.append(staging)
        return staging

    def release(self, staging: Staging) -> None:
        with self._cond:
            if staging in self._all and staging not in self._free:
                self._free.append(staging)
            self._cond.notify_all()

    def wait_all_free(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: len(self._free) == len(self._all) and not self._creating, timeout=timeout
            )
