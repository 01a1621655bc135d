"""What the node-local Filter and Score plugins said of each node, per pod shape, until the node changes.

The pods a cluster runs come in few shapes (a job's replicas, a trace's job arrays), and between two
pods of one shape only the nodes that took or freed a pod change. A node-local plugin answers from
the pod's shape and the node alone, so its answer for a node that has not changed since is still
its answer. A verdict is kept with the :class:`NodeInfo` it was computed on and is used only while
the snapshot holds that very object: a ``NodeInfo`` never changes, and a changed node is a new one,
so nothing stale is ever read. Kubernetes' scheduler once kept the same kind of equivalence cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from tessera.scheduler.domain.framework.status import Status
from tessera.scheduler.domain.snapshot import NodeInfo

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


class VerdictCache:
    """Verdicts by pod shape (least recently used shapes go first), within ``max_verdicts`` in all."""

    def __init__(self, max_verdicts: int = DEFAULT_MAX_VERDICTS) -> None:
        if max_verdicts < 1:
            raise ValueError(f"max_verdicts: must be >= 1, got {max_verdicts}")
        self.max_verdicts = max_verdicts
        self._shapes: OrderedDict[Hashable, dict[str, NodeVerdict]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._shapes)

    def for_shape(self, shape: Hashable, nodes: int) -> dict[str, NodeVerdict]:
        """The verdicts of one shape by node name (empty for a new shape); ``nodes``: the cluster's size."""
        verdicts = self._shapes.get(shape)
        if verdicts is not None:
            self._shapes.move_to_end(shape)
            return verdicts
        keep = max(1, self.max_verdicts // max(1, nodes))
        while len(self._shapes) >= keep:
            self._shapes.popitem(last=False)
        verdicts = self._shapes[shape] = {}
        return verdicts

    def clear(self) -> None:
        self._shapes.clear()
