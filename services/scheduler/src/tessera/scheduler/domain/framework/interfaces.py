"""One Protocol per extension point. A plugin joins a phase by having that phase's method.

The contracts follow kube-scheduler's ``framework/interface.go``:
- PreFilter runs once per cycle and may write to :class:`CycleState` for Filter and Score to read;
  returning ``Skip`` takes the plugin's Filter out of the cycle.
- Filter says whether one node can hold the pod; Score ranks the feasible nodes from 0 to 100.
- PreScore runs once per cycle before Score, with the nodes about to be scored, so a plugin can
  compute for all of them at once what its Score then reads back.
- Reserve claims what the pod will use; Unreserve gives it back, must be idempotent and may not fail.
- Permit approves, rejects, or says ``Wait`` with a timeout in seconds.
- Bind makes the placement real; the first plugin that does not ``Skip`` decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from tessera.scheduler.domain.framework.cycle_state import CycleState, StateKey
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.status import Status
from tessera.scheduler.domain.snapshot import NodeInfo, Snapshot

MAX_NODE_SCORE = 100


class Plugin(Protocol):
    @property
    def name(self) -> str: ...


@runtime_checkable
class PreFilterPlugin(Plugin, Protocol):
    def pre_filter(self, state: CycleState, pod: PodSpec, snapshot: Snapshot) -> Status: ...


@runtime_checkable
class FilterPlugin(Plugin, Protocol):
    def filter(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> Status: ...


@runtime_checkable
class ScorePlugin(Plugin, Protocol):
    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int: ...


@runtime_checkable
class SparseScorePlugin(ScorePlugin, Protocol):
    """A Score plugin that scores most nodes 0 can name the others instead: the framework then asks
    it once per cycle, not once per node; the scores must equal its ``score``."""

    def sparse_score(
        self, state: CycleState, pod: PodSpec, nodes: Mapping[str, NodeInfo]
    ) -> dict[str, int]: ...


@runtime_checkable
class PreScorePlugin(Plugin, Protocol):
    def pre_score(self, state: CycleState, pod: PodSpec, nodes: Sequence[NodeInfo]) -> Status: ...


@runtime_checkable
class NodeLocal(Protocol):
    """A Filter or Score plugin whose answer for a node depends only on the pod's shape (requests,
    models, policies: not its name or gang) and on that node, so the framework may keep it until the
    node changes. Per-node data it records goes only under ``node_keys`` (maps keyed by node name).
    ``revision`` changes when its answers change for another reason (a new expected workload)."""

    @property
    def node_local(self) -> bool: ...

    @property
    def node_keys(self) -> tuple[StateKey[dict[str, Any]], ...]: ...

    @property
    def revision(self) -> int: ...


@runtime_checkable
class ReservePlugin(Plugin, Protocol):
    def reserve(self, state: CycleState, pod: PodSpec, node: str) -> Status: ...

    def unreserve(self, state: CycleState, pod: PodSpec, node: str) -> None: ...


@runtime_checkable
class PermitPlugin(Plugin, Protocol):
    def permit(self, state: CycleState, pod: PodSpec, node: str) -> tuple[Status, float]: ...


@runtime_checkable
class BindPlugin(Plugin, Protocol):
    def bind(self, state: CycleState, pod: PodSpec, node: str) -> Status: ...
