"""Which nodes the cache changed since a generation: what lets a cycle look only at those.

The cache records here the name of every node it replaces, adds or removes, with the generation the
change made. Its snapshots carry the log, so a reader that has seen the nodes of an older snapshot
of the same cache can ask which of them may differ now instead of comparing every node. The log
keeps its recent entries only; asked about a generation older than those, it answers None (compare
every node). It also keeps which nodes hold each gang's members, for the same reason.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from typing import Protocol


class HoldsGangs(Protocol):
    """What the gang index reads of a node (a :class:`~.snapshot.NodeInfo`)."""

    @property
    def gang_members(self) -> Mapping[str, int]: ...


# Entries kept at most; past this the older half is forgotten.
MAX_LOGGED_CHANGES = 100_000


class NodeChanges:
    """The names of the nodes changed, by the generation each change made (increasing)."""

    __slots__ = ("_floor", "_generations", "_limit", "_names")

    def __init__(self, limit: int | None = None) -> None:
        limit = MAX_LOGGED_CHANGES if limit is None else limit
        if limit < 2:
            raise ValueError(f"limit: must be >= 2, got {limit}")
        self._generations: list[int] = []
        self._names: list[str] = []
        # Changes made at generations above the floor are all logged.
        self._floor = 0
        self._limit = limit

    def __len__(self) -> int:
        return len(self._names)

    def record(self, generation: int, name: str) -> None:
        """``name`` changed, making ``generation`` (not below any generation recorded before)."""
        if self._generations and generation < self._generations[-1]:
            raise ValueError(f"generation {generation} is older than {self._generations[-1]}")
        if len(self._names) >= self._limit:
            cut = len(self._names) // 2
            self._floor = self._generations[cut - 1]
            del self._generations[:cut], self._names[:cut]
        self._generations.append(generation)
        self._names.append(name)

    def since(self, generation: int) -> set[str] | None:
        """The nodes changed at generations after ``generation``; None when those are not all logged."""
        if generation < self._floor:
            return None
        return set(self._names[bisect_right(self._generations, generation) :])


class GangNodes:
    """The nodes holding members of each gang, kept by the cache as its nodes change (the newest
    generation's), so a snapshot answers :meth:`Snapshot.holding` without walking every node."""

    __slots__ = ("_by_gang",)

    def __init__(self) -> None:
        self._by_gang: dict[str, set[str]] = {}

    def replace(self, name: str, old: HoldsGangs | None, new: HoldsGangs | None) -> None:
        """Node ``name`` changed from ``old`` to ``new`` (None: absent)."""
        before: Mapping[str, int] = old.gang_members if old is not None else {}
        after: Mapping[str, int] = new.gang_members if new is not None else {}
        for gang in before:
            if gang not in after:
                nodes = self._by_gang[gang]
                nodes.discard(name)
                if not nodes:
                    del self._by_gang[gang]
        for gang in after:
            if gang not in before:
                self._by_gang.setdefault(gang, set()).add(name)

    def holding(self, gang: str, nodes: Mapping[str, HoldsGangs], later: set[str]) -> frozenset[str]:
        """The ``nodes`` (a snapshot's) holding members of ``gang``, given the nodes the cache
        changed ``later`` than that snapshot."""
        names = set(self._by_gang.get(gang, ()))
        for name in later:  # changed after the snapshot was taken: the snapshot's node says
            node = nodes.get(name)
            if node is not None and gang in node.gang_members:
                names.add(name)
            else:
                names.discard(name)
        return frozenset(names)
