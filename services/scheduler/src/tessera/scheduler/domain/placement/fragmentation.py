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
        self.level_of: IntArray = np.array([levels.index(t.gpu_milli) for t in gpu_pods], dtype=np.int64)
        self.cpu: IntArray = np.array([t.cpu_milli for t in gpu_pods], dtype=np.int64)
        self.count: IntArray = np.array([t.num_gpu for t in gpu_pods], dtype=np.int64)
        self.weight: FloatArray = np.array([t.weight for t in gpu_pods], dtype=np.float64)
        # allowed_by_model[model, t]: may typical pod t run on that GPU model
        self.allowed_by_model: BoolArray = np.array(
            [[not t.gpu_models or m in t.gpu_models for t in gpu_pods] for m in state.models],
            dtype=np.bool_,
        ).reshape(len(state.models), len(gpu_pods))

    def evaluate(self, cpu_left: IntArray, gpu_left: IntArray, model_idx: IntArray) -> FloatArray:
        """Fragmentation (milli-GPU) of each row: a node state given by CPU left and GPU milli left."""
        total = gpu_left.sum(axis=1).astype(np.float64)
        frag: FloatArray = self.total_weight * total
        if self.weight.size == 0:
            return frag
        fits = gpu_left[:, None, :] >= self.levels[None, :, None]  # [S, L, G]
        fit_count = fits.sum(axis=2)  # [S, L]
        usable = (gpu_left[:, None, :] * fits).sum(axis=2)  # [S, L]: milli on GPUs big enough
        runnable = (
            (fit_count[:, self.level_of] >= self.count[None, :])
            & (cpu_left[:, None] >= self.cpu[None, :])
            & self.allowed_by_model[model_idx]
        )  # [S, T]
        usable_weighted: FloatArray = (runnable * usable[:, self.level_of]) @ self.weight
        return frag - usable_weighted

    def node_fragmentation(self, state: ClusterState, nodes: IntArray | None = None) -> FloatArray:
        """Current fragmentation of `nodes` (all nodes by default)."""
        idx = np.arange(state.num_nodes) if nodes is None else nodes
        return self.evaluate(state.cpu_left[idx], state.gpu_left[idx], state.model_idx[idx])
