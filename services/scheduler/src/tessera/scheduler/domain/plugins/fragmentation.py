"""Fragmentation-aware scoring (FGD, Weng et al., USENIX ATC'23) as a Score plugin.

It scores a node by how the placement GpuFit chose there changes the node's fragmentation: the
expected idle GPU milli that the workload's typical pods could no longer use. The fragmentation
measure itself is the placement package's (:class:`FragmentationModel`); this plugin only feeds it
the node's state before and after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from tessera.scheduler.domain.framework.cycle_state import CycleState, StateKey
from tessera.scheduler.domain.framework.interfaces import MAX_NODE_SCORE
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.framework.status import Status
from tessera.scheduler.domain.placement import ClusterState, FragmentationModel, NodeSpec, TypicalPod
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.snapshot import NodeInfo

NEUTRAL_SCORE = MAX_NODE_SCORE // 2


# A node state as fragmentation reads it: (GPU model index, CPU milli left, idle milli per GPU).
_NodeState = tuple[int, int, tuple[int, ...]]
# The fragmentation change each scored node would see (None: neutral), written by PreScore.
FRAGMENTATION_CHANGE: StateKey[dict[str, float | None]] = StateKey("Fragmentation/change")
# Node states remembered with their fragmentation; forgotten all at once past this many.
MAX_REMEMBERED_STATES = 200_000


class FragmentationScore:
    """``⌊100·sigmoid((F_before - F_after)/1000)⌋``: 50 leaves fragmentation as it was, higher reduces it.

    PreScore computes every node's change at once: the fragmentation of each node state (before
    and after the placement) is remembered, and the states not seen yet are evaluated together in
    one vectorised call, so scoring a cluster costs one numpy call, not one per node.
    """

    name = "Fragmentation"
    node_local: ClassVar[bool] = True
    node_keys: ClassVar[tuple[StateKey[dict[str, Any]], ...]] = ()

    def __init__(self, typical: Sequence[TypicalPod], models: Sequence[str]) -> None:
        known = sorted(set(models))
        if not known:
            raise ValueError("fragmentation.models: at least one GPU model is needed")
        # The model only reads the cluster's model list, so one placeholder node per model suffices.
        self._placeholder = ClusterState(
            [NodeSpec(f"model-{i}", 0, 0, 0, model) for i, model in enumerate(known)]
        )
        self._model_index = {model: i for i, model in enumerate(self._placeholder.models)}
        self._model = FragmentationModel(list(typical), self._placeholder)
        self._known: dict[_NodeState, float] = {}
        self.revision = 0

    @property
    def typical(self) -> tuple[TypicalPod, ...]:
        """The workload the score expects."""
        return tuple(self._model.typical)

    def expect(self, typical: Sequence[TypicalPod]) -> None:
        """Score against another typical workload from now on (the workload was learnt again)."""
        self._model = FragmentationModel(list(typical), self._placeholder)
        self._known.clear()
        self.revision += 1

    def pre_score(self, state: CycleState, pod: PodSpec, nodes: Sequence[NodeInfo]) -> Status:
        changes = state.get(FRAGMENTATION_CHANGE)
        if changes is None:
            changes = {}
            state.write(FRAGMENTATION_CHANGE, changes)
        changes.update(self._changes(state, pod, nodes))
        return Status.success()

    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int:
        changes = state.get(FRAGMENTATION_CHANGE)
        if changes is not None and node.name in changes:
            change = changes[node.name]
        else:  # scored without PreScore
            change = self._changes(state, pod, [node])[node.name]
        if change is None:
            return NEUTRAL_SCORE
        return min(MAX_NODE_SCORE, math.floor(MAX_NODE_SCORE / (1.0 + math.exp(-change / 1000.0))))

    def _changes(self, state: CycleState, pod: PodSpec, nodes: Sequence[NodeInfo]) -> dict[str, float | None]:
        """F_before - F_after of each node for the GPUs GpuFit chose there; None where neutral."""
        choices = state.get(GPU_CHOICE) or {} if pod.gpu_count else {}
        changes: dict[str, float | None] = {}
        pairs: dict[str, tuple[_NodeState, _NodeState]] = {}
        for node in nodes:
            choice = choices.get(node.name, ())
            model = self._model_index.get(node.gpus[0].model) if choice and node.gpus else None
            if model is None:
                changes[node.name] = None
                continue
            before = node.offered_idle_milli
            after = list(before)
            for index, milli in choice:
                after[index] = node.gpus[index].idle_after(milli)
            cpu_left = node.cpu_milli - node.cpu_used
            pairs[node.name] = ((model, cpu_left, before), (model, cpu_left - pod.cpu_milli, tuple(after)))
        states = {node_state for pair in pairs.values() for node_state in pair}
        missing = {node_state for node_state in states if node_state not in self._known}
        if len(self._known) + len(missing) > MAX_REMEMBERED_STATES:
            self._known.clear()
            missing = states
        self._evaluate(missing)
        for name, (before_state, after_state) in pairs.items():
            changes[name] = self._known[before_state] - self._known[after_state]
        return changes

    def _evaluate(self, states: set[_NodeState]) -> None:
        """Remember the fragmentation of ``states``, one vectorised call per GPU count."""
        by_size: dict[int, list[_NodeState]] = {}
        for node_state in states:
            by_size.setdefault(len(node_state[2]), []).append(node_state)
        for group in by_size.values():
            fragmentation = self._model.evaluate(
                np.array([cpu for _, cpu, _ in group], dtype=np.int64),
                np.array([gpus for _, _, gpus in group], dtype=np.int64).reshape(len(group), -1),
                np.array([model for model, _, _ in group], dtype=np.int64),
            )
            self._known.update(zip(group, fragmentation.tolist(), strict=True))
