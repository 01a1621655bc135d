"""Shared building blocks of policies: tie-breaking, GPU choice on a node, and a per-node score cache."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Literal

import numpy as np

from tessera.scheduler.domain.placement.model import MILLI_PER_GPU, PodShape
from tessera.scheduler.domain.placement.state import ClusterState, FloatArray, IntArray

GpuMode = Literal["binpack", "spread"]


def random_ranks(num_nodes: int, seed: int) -> IntArray:
    """A fixed random rank per node: ties between equal scores go to the lowest rank."""
    return np.random.default_rng(seed).permutation(num_nodes).astype(np.int64)


def pick_best(nodes: IntArray, scores: FloatArray, rank: IntArray) -> int:
    """The node of highest score among `nodes`; ties go to the lowest rank."""
    top = scores >= scores.max()
    tied = nodes[top]
    if tied.size == 1:
        return int(tied[0])
    return int(tied[np.argmin(rank[tied])])


def whole_gpus(state: ClusterState, node: int, count: int) -> tuple[int, ...]:
    """The first `count` fully idle GPU slots of `node`."""
    idle = np.flatnonzero(state.gpu_left[node] == MILLI_PER_GPU)
    return tuple(int(s) for s in idle[:count])


def sharing_gpu(state: ClusterState, node: int, milli: int, mode: GpuMode = "binpack") -> int:
    """The GPU for a sharing pod: the smallest idle GPU that fits (binpack) or the largest (spread)."""
    left = state.gpu_left[node]
    fitting = left >= milli
    if mode == "binpack":
        return int(np.argmin(np.where(fitting, left, np.iinfo(np.int64).max)))
    return int(np.argmax(np.where(fitting, left, -1)))


def gpus_for(state: ClusterState, node: int, pod: PodShape, mode: GpuMode = "binpack") -> tuple[int, ...]:
    """GPU slots for `pod` on `node`: none, one shared GPU by `mode`, or whole idle GPUs."""
    if pod.num_gpu == 0:
        return ()
    if pod.is_sharing:
        return (sharing_gpu(state, node, pod.gpu_milli, mode),)
    return whole_gpus(state, node, pod.num_gpu)


def shape_key(pod: PodShape, with_memory: bool = False) -> tuple[int, int, int, int]:
    """What a per-node score depends on: CPU and GPU request, and memory when the scorer reads it.

    Allowed GPU models are left out: they decide feasibility, not a node's score.
    """
    return (pod.cpu_milli, pod.memory_mib if with_memory else -1, pod.gpu_milli, pod.num_gpu)


ComputeFn = Callable[[IntArray], tuple[FloatArray, IntArray]]


class NodeScoreCache:
    """Per-node scores remembered per pod shape, recomputed only for nodes whose version changed.

    A score depends only on the node's own state and the pod's shape, and each decision changes
    one node, so most of the cluster keeps its cached score from one decision to the next.
    """

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[IntArray, FloatArray, IntArray]] = {}

    def get(
        self, state: ClusterState, key: Hashable, nodes: IntArray, compute: ComputeFn
    ) -> tuple[FloatArray, IntArray]:
        """Scores and chosen GPU slot of `nodes`, calling `compute(stale_nodes)` for the stale ones."""
        entry = self._entries.get(key)
        if entry is None or entry[0].size != state.num_nodes:
            n = state.num_nodes
            entry = (np.full(n, -1, dtype=np.int64), np.zeros(n), np.zeros(n, dtype=np.int64))
            self._entries[key] = entry
        versions, scores, gpus = entry
        stale = nodes[versions[nodes] != state.version[nodes]]
        if stale.size:
            new_scores, new_gpus = compute(stale)
            scores[stale] = new_scores
            gpus[stale] = new_gpus
            versions[stale] = state.version[stale]
        return scores[nodes], gpus[nodes]
