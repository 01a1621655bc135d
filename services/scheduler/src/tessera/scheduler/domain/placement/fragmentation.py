"""GPU fragmentation as defined by FGD (Weng et al., USENIX ATC'23).

A node's fragmentation is the expected idle GPU milli that a typical pod could not use there:
for each typical pod m, weighted by its frequency, either all the node's idle GPU milli (m cannot
run on the node at all: CPU-only, wrong model, too little CPU, too few GPUs), or the idle milli of
the GPUs individually too small for m.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tessera.scheduler.domain.placement.model import PlacementInputError, PodShape
from tessera.scheduler.domain.placement.state import BoolArray, ClusterState, FloatArray, IntArray


@dataclass(frozen=True, slots=True)
class TypicalPod:
    """One group of the workload: its CPU and GPU request and its share of all pods."""

    cpu_milli: int
    num_gpu: int
    gpu_milli: int
    gpu_models: frozenset[str]
    weight: float


def typical_pods(pods: Iterable[PodShape], coverage: float = 0.95) -> list[TypicalPod]:
    """Group pods by (cpu, g, k, models); keep the most frequent groups up to `coverage` of the pods.

    Weights are the groups' frequencies, renormalised over the groups kept. Groups of equal count
    are ordered by their key, so the choice is deterministic.
    """
    if not 0 < coverage <= 1:
        raise PlacementInputError(f"coverage must be in (0, 1], got {coverage}")
    counts = Counter((p.cpu_milli, p.gpu_milli, p.num_gpu, tuple(sorted(p.gpu_models))) for p in pods)
    if not counts:
        raise PlacementInputError("pods: typical pods need at least one pod")
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept: list[tuple[tuple[int, int, int, tuple[str, ...]], int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= coverage * total:
            break
        kept.append((key, count))
        covered += count
    return [
        TypicalPod(cpu_milli=c, gpu_milli=g, num_gpu=k, gpu_models=frozenset(models), weight=n / covered)
        for (c, g, k, models), n in kept
    ]


class FragmentationModel:
    """Typical pods compiled against a cluster's GPU models, evaluated over many node states at once."""

    def __init__(self, typical: list[TypicalPod], state: ClusterState) -> None:
        if not typical:
            raise PlacementInputError("typical: at least one typical pod is needed")
        self.typical = typical
        self.total_weight = float(sum(t.weight for t in typical))
        gpu_pods = [t for t in typical if t.num_gpu > 0]
        levels = sorted({t.gpu_milli for t in gpu_pods})
        self.levels: IntArray = np.array(levels, dtype=np.int64)
        # Typical GPU pods that differ only in CPU form a group; within a group, the weight of the
        # pods a node can still run is a step function of its CPU left, tabulated once here.
        groups: dict[tuple[int, int, tuple[bool, ...]], dict[int, float]] = {}
        for t in gpu_pods:
            allowed = tuple(not t.gpu_models or m in t.gpu_models for m in state.models)
            by_cpu = groups.setdefault((levels.index(t.gpu_milli), t.num_gpu, allowed), {})
            by_cpu[t.cpu_milli] = by_cpu.get(t.cpu_milli, 0.0) + t.weight
        keys = list(groups)
        self.cpu_steps: IntArray = np.array(sorted({t.cpu_milli for t in gpu_pods}), dtype=np.int64)
        step_weight = np.zeros((self.cpu_steps.size + 1, len(keys)))  # [CPU step, group]
        for j, key in enumerate(keys):
            for cpu, weight in groups[key].items():
                step_weight[np.searchsorted(self.cpu_steps, cpu) + 1, j] += weight
        self.weight_by_cpu_step: FloatArray = np.cumsum(step_weight, axis=0)
        self.group_level: IntArray = np.array([k[0] for k in keys], dtype=np.int64)
        self.group_count: IntArray = np.array([k[1] for k in keys], dtype=np.int64)
        self.group_allowed: BoolArray = (
            np.array([k[2] for k in keys], dtype=np.bool_).reshape(len(keys), len(state.models)).T
        )

    def level_stats(self, gpu_left: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """Per row: idle milli in all, and per GPU level the count and idle milli of GPUs at least that big."""
        fits = gpu_left[:, None, :] >= self.levels[None, :, None]  # [S, L, G]
        return gpu_left.sum(axis=1), fits.sum(axis=2), (gpu_left[:, None, :] * fits).sum(axis=2)

    def from_level_stats(
        self, cpu_left: IntArray, total: IntArray, fit_count: IntArray, usable: IntArray, model_idx: IntArray
    ) -> FloatArray:
        """Fragmentation of each row from its CPU left, model and `level_stats`."""
        frag: FloatArray = self.total_weight * total.astype(np.float64)
        if self.group_level.size == 0:
            return frag
        # weight of the typical pods of each group that the CPU left still admits: [S, J]
        runnable_weight = self.weight_by_cpu_step[np.searchsorted(self.cpu_steps, cpu_left, side="right")]
        runnable_weight = runnable_weight * (
            (fit_count[:, self.group_level] >= self.group_count) & self.group_allowed[model_idx]
        )
        usable_weighted: FloatArray = (runnable_weight * usable[:, self.group_level]).sum(axis=1)
        return frag - usable_weighted

    def evaluate(self, cpu_left: IntArray, gpu_left: IntArray, model_idx: IntArray) -> FloatArray:
        """Fragmentation (milli-GPU) of each row: a node state given by CPU left and GPU milli left."""
        return self.from_level_stats(cpu_left, *self.level_stats(gpu_left), model_idx)

    def node_fragmentation(self, state: ClusterState, nodes: IntArray | None = None) -> FloatArray:
        """Current fragmentation of `nodes` (all nodes by default)."""
        idx = np.arange(state.num_nodes) if nodes is None else nodes
        return self.evaluate(state.cpu_left[idx], state.gpu_left[idx], state.model_idx[idx])
