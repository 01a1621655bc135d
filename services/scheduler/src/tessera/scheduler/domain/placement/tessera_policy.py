"""Tessera's placement policy: fragmentation gradient plus a CPU/memory balance lookahead.

FGD (Weng et al., ATC'23) asks, one typical pod at a time, whether a node could still run it.
That check is myopic about CPU and memory: a node with 8 idle GPUs and 40 cores left runs any
single typical pod, yet cannot run eight of them, so the GPUs it keeps idle for later are already
stranded. Tessera adds that lookahead: at the workload's own CPU (and memory) per milli-GPU, the
idle GPU milli a node can no longer feed is counted as stranded, and a placement is scored by the
growth of fragmentation plus stranding. Both terms are in milli-GPU, so one weight (1 by default)
joins them without tuning to a trace. Among equal scores, a sharing pod takes the GPU with the
least milli left (best fit), and nodes tie by a fixed random rank.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tessera.scheduler.domain.placement.choice import NodeScoreCache, pick_best, shape_key, whole_gpus
from tessera.scheduler.domain.placement.fgd import fragmentation_change
from tessera.scheduler.domain.placement.fragmentation import FragmentationModel, TypicalPod, typical_pods
from tessera.scheduler.domain.placement.model import Placement, PlacementInputError, PodShape
from tessera.scheduler.domain.placement.state import ClusterState, FloatArray, IntArray

# Scores are compared after rounding to this many decimals of a milli-GPU, so that float noise in
# otherwise equal scores does not break ties (ties must go to the node rank, not to rounding error).
_SCORE_DECIMALS = 6


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """What the workload asks for, learnt from a pod list: typical pods and resources per milli-GPU."""

    typical: list[TypicalPod]
    cpu_per_gpu_milli: float
    memory_per_gpu_milli: float

    @classmethod
    def from_pods(cls, pods: Iterable[PodShape], coverage: float = 0.95) -> WorkloadProfile:
        pod_list = list(pods)
        gpu_pods = [p for p in pod_list if p.num_gpu > 0]
        gpu_milli = sum(p.gpu_request_milli for p in gpu_pods)
        if gpu_milli == 0:
            raise PlacementInputError("pods: the workload profile needs at least one GPU pod")
        return cls(
            typical=typical_pods(pod_list, coverage),
            cpu_per_gpu_milli=sum(p.cpu_milli for p in gpu_pods) / gpu_milli,
            memory_per_gpu_milli=sum(p.memory_mib for p in gpu_pods) / gpu_milli,
        )


def stranded_gpu_milli(
    gpu_idle: IntArray, cpu_left: IntArray, memory_left: IntArray, profile: WorkloadProfile
) -> FloatArray:
    """Idle GPU milli beyond what the node's CPU and memory left can feed at the workload's ratios."""
    feedable = np.full(gpu_idle.shape, np.inf)
    if profile.cpu_per_gpu_milli > 0:
        feedable = np.minimum(feedable, cpu_left / profile.cpu_per_gpu_milli)
    if profile.memory_per_gpu_milli > 0:
        feedable = np.minimum(feedable, memory_left / profile.memory_per_gpu_milli)
    stranded: FloatArray = np.maximum(0.0, gpu_idle - feedable)
    return stranded


class TesseraPolicy:
    """Least growth of (fragmentation + stranded GPU milli); see the module docstring."""

    name = "Tessera"

    def __init__(
        self,
        model: FragmentationModel,
        profile: WorkloadProfile,
        rank: IntArray,
        balance_weight: float = 1.0,
    ) -> None:
        if balance_weight < 0:
            raise PlacementInputError(f"balance_weight must be >= 0, got {balance_weight}")
        self._model = model
        self._profile = profile
        self._rank = rank
        self._balance = balance_weight
        self._cache = NodeScoreCache()  # fragmentation growth and GPU slot, by shape without memory
        self._costs = NodeScoreCache()  # the node's score (-cost) and GPU slot, by shape with memory

    def stranding_change(self, state: ClusterState, nodes: IntArray, pod: PodShape) -> FloatArray:
        """Growth of stranded GPU milli on each of `nodes` if `pod` went there."""
        idle = state.gpu_free[nodes]
        cpu = state.cpu_left[nodes]
        memory = state.memory_left[nodes]
        before = stranded_gpu_milli(idle, cpu, memory, self._profile)
        after = stranded_gpu_milli(
            idle - pod.gpu_request_milli, cpu - pod.cpu_milli, memory - pod.memory_mib, self._profile
        )
        change: FloatArray = after - before
        return change

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None:
        nodes = np.flatnonzero(state.feasible(pod))
        if nodes.size == 0:
            return None
        frag_key = shape_key(pod)

        def compute_fragmentation(stale: IntArray) -> tuple[FloatArray, IntArray]:
            change = np.round(
                fragmentation_change(self._model, state, stale, pod), _SCORE_DECIMALS
            )  # +inf where the GPU does not fit
            best = np.argmin(change, axis=1)
            if pod.is_sharing:  # best fit among the GPUs of equal fragmentation growth
                top = change <= change[np.arange(stale.size), best][:, None]
                left = np.where(top, state.gpu_left[stale], np.iinfo(np.int64).max)
                best = np.argmin(left, axis=1)
            return change[np.arange(stale.size), best], best.astype(np.int64)

        def compute_score(stale: IntArray) -> tuple[FloatArray, IntArray]:
            # Both terms depend only on the node's own state, so a node's score is kept until the
            # node changes: each decision scores again only the nodes changed since this shape's last.
            frag_change, slots = self._cache.get(state, frag_key, stale, compute_fragmentation)
            cost = frag_change
            if self._balance:
                cost = frag_change + self._balance * self.stranding_change(state, stale, pod)
            return -np.round(cost, _SCORE_DECIMALS), slots

        scores, slots = self._costs.get(state, shape_key(pod, with_memory=True), nodes, compute_score)
        node = pick_best(nodes, scores, self._rank)
        if pod.is_sharing:
            return Placement(node, (int(slots[np.searchsorted(nodes, node)]),))
        return Placement(node, whole_gpus(state, node, pod.num_gpu))
