"""Which nodes the cache changed since a generation: what lets a cycle look only at those.

The cache records here the name of every node it replaces, adds or removes, with the generation the
change made. Its snapshots carry the log, so a reader that has seen the nodes of an older snapshot
of the same cache can ask which of them may differ now instead of comparing every node. The log
keeps its recent entries only; asked about a generation older than those, it answers None (compare
every node).
"""

from __future__ import annotations

from bisect import bisect_right

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
