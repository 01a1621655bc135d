"""What the node-local Filter and Score plugins said of each node, per pod shape, until the node changes.

The pods a cluster runs come in few shapes (a job's replicas, a trace's job arrays), and between two
pods of one shape only the nodes that took or freed a pod change. A node-local plugin answers from
the pod's shape and the node alone, so its answer for a node that has not changed since is still
its answer. A verdict is kept with the :class:`NodeInfo` it was computed on and is used only while
the snapshot holds that very object: a ``NodeInfo`` never changes, and a changed node is a new one,
so nothing stale is ever read. Kubernetes' scheduler once kept the same kind of equivalence cache.

A shape's verdicts are kept with what a cycle reads of them all (the feasible nodes, their scores,
the rejections counted by reason, the filters' notes), updated node by node as verdicts change. A
snapshot of the cache names the nodes changed since the generation last seen (see
:mod:`tessera.scheduler.domain.node_changes`), so a cycle looks at those alone; any other snapshot
has every node looked at.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from tessera.scheduler.domain.framework.status import Status
from tessera.scheduler.domain.node_changes import NodeChanges
from tessera.scheduler.domain.snapshot import NodeInfo, Snapshot

# Verdicts kept in all (about 100 bytes each): some 330 shapes on the 1,213-node openb cluster.
DEFAULT_MAX_VERDICTS = 400_000


@dataclass(slots=True)
class NodeVerdict:
    """One node's verdict for one pod shape."""

    node: NodeInfo
    """The node state it holds for (compared by identity)."""
    rejection: Status | None
    """The first filter's rejection; None when the node is feasible."""
    notes: tuple[tuple[int, Any], ...]
    """What the filters recorded for this node: (position of the key among the filters'
    ``node_keys``, value)."""
    score: int | None = None
    """The weighted sum of the node-local scores, once scored."""


class ShapeVerdicts:
    """One shape's verdicts on the nodes of the snapshot last seen, and what they add up to."""

    __slots__ = ("_generation", "_log", "feasible", "notes", "rejected", "scores", "unscored", "verdicts")

    def __init__(self) -> None:
        self.verdicts: dict[str, NodeVerdict] = {}
        self.feasible: dict[str, NodeInfo] = {}
        """The nodes no filter rejected."""
        self.scores: dict[str, int] = {}
        """The feasible nodes scored: :attr:`NodeVerdict.score`."""
        self.unscored: set[str] = set()
        """The feasible nodes not scored yet."""
        self.rejected: dict[str, int] = {}
        """The rejected nodes counted by reason, as :meth:`Diagnosis.of` counts them."""
        self.notes: list[dict[str, Any]] = []
        """By position of the key among the filters' ``node_keys``: what each node's filters noted."""
        self._log: NodeChanges | None = None
        self._generation = -1

    def stale(self, snapshot: Snapshot) -> Iterable[str]:
        """The nodes whose verdict may be missing or stale in ``snapshot`` (or gone from it)."""
        log = snapshot.changes
        if log is not None and log is self._log and snapshot.generation >= self._generation:
            changed = log.since(self._generation)
            if changed is not None:
                return changed
        return [*snapshot.nodes, *(name for name in self.verdicts if name not in snapshot.nodes)]

    def seen(self, snapshot: Snapshot) -> None:
        """Every verdict now holds for ``snapshot``'s nodes."""
        self._log, self._generation = snapshot.changes, snapshot.generation

    def put(self, name: str, verdict: NodeVerdict | None) -> None:
        """Node ``name``'s new verdict; None when the node is gone."""
        old = self.verdicts.pop(name, None)
        if old is not None:
            if old.rejection is None:
                del self.feasible[name]
                self.scores.pop(name, None)
                self.unscored.discard(name)
            else:
                for reason in _reasons(old.rejection):
                    left = self.rejected[reason] - 1
                    if left:
                        self.rejected[reason] = left
                    else:
                        del self.rejected[reason]
            for i, _ in old.notes:
                del self.notes[i][name]
        if verdict is None:
            return
        self.verdicts[name] = verdict
        if verdict.rejection is None:
            self.feasible[name] = verdict.node
            if verdict.score is None:
                self.unscored.add(name)
            else:
                self.scores[name] = verdict.score
        else:
            for reason in _reasons(verdict.rejection):
                self.rejected[reason] = self.rejected.get(reason, 0) + 1
        for i, value in verdict.notes:
            while len(self.notes) <= i:
                self.notes.append({})
            self.notes[i][name] = value

    def score(self, name: str, total: int) -> None:
        """A feasible node's node-local score."""
        self.verdicts[name].score = self.scores[name] = total
        self.unscored.discard(name)


def _reasons(status: Status) -> tuple[str, ...]:
    return status.reasons or (status.code.value,)


class VerdictCache:
    """Verdicts by pod shape (least recently used shapes go first), within ``max_verdicts`` in all."""

    def __init__(self, max_verdicts: int = DEFAULT_MAX_VERDICTS) -> None:
        if max_verdicts < 1:
            raise ValueError(f"max_verdicts: must be >= 1, got {max_verdicts}")
        self.max_verdicts = max_verdicts
        self._shapes: OrderedDict[Hashable, ShapeVerdicts] = OrderedDict()

    def __len__(self) -> int:
        return len(self._shapes)

    def for_shape(self, shape: Hashable, nodes: int) -> ShapeVerdicts:
        """The verdicts of one shape by node name (empty for a new shape); ``nodes``: the cluster's size."""
        verdicts = self._shapes.get(shape)
        if verdicts is not None:
            self._shapes.move_to_end(shape)
            return verdicts
        keep = max(1, self.max_verdicts // max(1, nodes))
        while len(self._shapes) >= keep:
            self._shapes.popitem(last=False)
        verdicts = self._shapes[shape] = ShapeVerdicts()
        return verdicts

    def clear(self) -> None:
        self._shapes.clear()
