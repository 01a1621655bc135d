"""Array-backed cluster state that every placement policy reads and the scheduler updates.

One row per node. GPU slots are padded to the largest node; a missing slot has 0 milli left and
never fits anything. Every change bumps the node's `version`, so scorers can cache per node and
recompute only what changed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tessera.scheduler.domain.placement.model import (
    MILLI_PER_GPU,
    NodeSpec,
    Placement,
    PlacementInputError,
    PodShape,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


class ClusterState:
    """Free resources of every node, as numpy arrays updated incrementally."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        if not nodes:
            raise PlacementInputError("nodes: the cluster needs at least one node")
        self.names: list[str] = [n.name for n in nodes]
        self.models: list[str] = sorted({n.model for n in nodes})
        model_of = {m: i for i, m in enumerate(self.models)}
        self.model_idx: IntArray = np.array([model_of[n.model] for n in nodes], dtype=np.int64)
        self.cpu_capacity: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.memory_capacity: IntArray = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.gpu_count: IntArray = np.array([n.gpu_count for n in nodes], dtype=np.int64)
        slots = max(1, int(self.gpu_count.max()))
        self.gpu_exists: BoolArray = np.arange(slots)[None, :] < self.gpu_count[:, None]
        self.cpu_left: IntArray = self.cpu_capacity.copy()
        self.memory_left: IntArray = self.memory_capacity.copy()
        self.gpu_left: IntArray = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.gpu_free: IntArray = self.gpu_left.sum(axis=1)
        self.max_gpu_left: IntArray = self.gpu_left.max(axis=1)
        self.idle_gpus: IntArray = self.gpu_count.copy()
        self.version: IntArray = np.zeros(len(nodes), dtype=np.int64)
        self._allowed_cache: dict[frozenset[str], BoolArray] = {}

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpu_count.sum()) * MILLI_PER_GPU

    @property
    def gpu_used_milli(self) -> int:
        return self.gpu_capacity_milli - int(self.gpu_left.sum())

    def allowed(self, models: frozenset[str]) -> BoolArray:
        """Nodes whose GPU model is in `models` (every node when `models` is empty)."""
        mask = self._allowed_cache.get(models)
        if mask is None:
            ok = np.array([m in models for m in self.models], dtype=np.bool_) if models else None
            mask = np.ones(self.num_nodes, dtype=np.bool_) if ok is None else ok[self.model_idx]
            self._allowed_cache[models] = mask
        return mask

    def feasible(self, pod: PodShape) -> BoolArray:
        """Nodes where `pod` fits: CPU, memory, GPU model, and enough GPU capacity."""
        mask = (self.cpu_left >= pod.cpu_milli) & (self.memory_left >= pod.memory_mib)
        if pod.num_gpu == 0:
            return mask
        mask &= self.allowed(pod.gpu_models)
        if pod.num_gpu == 1:
            return mask & (self.max_gpu_left >= pod.gpu_milli)
        return mask & (self.idle_gpus >= pod.num_gpu)

    def fits(self, pod: PodShape, placement: Placement) -> bool:
        """True when `placement` is a valid place for `pod` right now."""
        n = placement.node
        if not 0 <= n < self.num_nodes or len(placement.gpus) != pod.num_gpu:
            return False
        if len(set(placement.gpus)) != len(placement.gpus):
            return False
        if self.cpu_left[n] < pod.cpu_milli or self.memory_left[n] < pod.memory_mib:
            return False
        if pod.num_gpu and not self.allowed(pod.gpu_models)[n]:
            return False
        for slot in placement.gpus:
            if not 0 <= slot < self.gpu_left.shape[1] or not self.gpu_exists[n, slot]:
                return False
            if self.gpu_left[n, slot] < pod.gpu_milli:
                return False
        return True

    def apply(self, pod: PodShape, placement: Placement) -> None:
        """Take `pod`'s resources on the chosen node and GPUs."""
        if not self.fits(pod, placement):
            raise PlacementInputError(f"placement {placement} does not fit pod {pod}")
        self._change(pod, placement, sign=-1)

    def release(self, pod: PodShape, placement: Placement) -> None:
        """Give back what `apply` took (the pod finished or was evicted)."""
        n = placement.node
        over_cpu = self.cpu_left[n] + pod.cpu_milli > self.cpu_capacity[n]
        over_gpu = any(self.gpu_left[n, s] + pod.gpu_milli > MILLI_PER_GPU for s in placement.gpus)
        if over_cpu or over_gpu:
            raise PlacementInputError(f"release of {placement} would exceed node capacity")
        self._change(pod, placement, sign=+1)

    def _change(self, pod: PodShape, placement: Placement, sign: int) -> None:
        n = placement.node
        self.cpu_left[n] += sign * pod.cpu_milli
        self.memory_left[n] += sign * pod.memory_mib
        for slot in placement.gpus:
            self.gpu_left[n, slot] += sign * pod.gpu_milli
        row = self.gpu_left[n]
        self.gpu_free[n] = row.sum()
        self.max_gpu_left[n] = row.max()
        self.idle_gpus[n] = int(np.count_nonzero(row == MILLI_PER_GPU))
        self.version[n] += 1
