"""Fragmentation-aware scoring (FGD, Weng et al., USENIX ATC'23) as a Score plugin.

It scores a node by how the placement GpuFit chose there changes the node's fragmentation: the
expected idle GPU milli that the workload's typical pods could no longer use. The fragmentation
measure itself is the placement package's (:class:`FragmentationModel`); this plugin only feeds it
the node's state before and after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tessera.scheduler.domain.framework.cycle_state import CycleState
from tessera.scheduler.domain.framework.interfaces import MAX_NODE_SCORE
from tessera.scheduler.domain.framework.pod import PodSpec
from tessera.scheduler.domain.placement import ClusterState, FragmentationModel, NodeSpec, TypicalPod
from tessera.scheduler.domain.plugins.filters import GPU_CHOICE
from tessera.scheduler.domain.snapshot import NodeInfo

NEUTRAL_SCORE = MAX_NODE_SCORE // 2


class FragmentationScore:
    """``⌊100·sigmoid((F_before - F_after)/1000)⌋``: 50 leaves fragmentation as it was, higher reduces it."""

    name = "Fragmentation"

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

    @property
    def typical(self) -> tuple[TypicalPod, ...]:
        """The workload the score expects."""
        return tuple(self._model.typical)

    def expect(self, typical: Sequence[TypicalPod]) -> None:
        """Score against another typical workload from now on (the workload was learnt again)."""
        self._model = FragmentationModel(list(typical), self._placeholder)

    def score(self, state: CycleState, pod: PodSpec, node: NodeInfo) -> int:
        choice = state.read(GPU_CHOICE).get(node.name, ()) if pod.gpu_count else ()
        if not choice or not node.gpus:
            return NEUTRAL_SCORE
        model = self._model_index.get(node.gpus[0].model)
        if model is None:
            return NEUTRAL_SCORE
        before = [gpu.idle_milli if gpu.healthy else 0 for gpu in node.gpus]
        after = list(before)
        for index, milli in choice:
            after[index] -= milli
        cpu_left = node.cpu_milli - node.cpu_used
        fragmentation = self._model.evaluate(
            np.array([cpu_left, cpu_left - pod.cpu_milli], dtype=np.int64),
            np.array([before, after], dtype=np.int64),
            np.array([model, model], dtype=np.int64),
        )
        change = float(fragmentation[0] - fragmentation[1])
        return min(MAX_NODE_SCORE, math.floor(MAX_NODE_SCORE / (1.0 + math.exp(-change / 1000.0))))
