"""Fragmentation Gradient Descent (FGD): place each pod where cluster fragmentation grows least."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.scheduler.domain.placement.choice import NodeScoreCache, pick_best, shape_key, whole_gpus
from tessera.scheduler.domain.placement.fragmentation import FragmentationModel
from tessera.scheduler.domain.placement.model import MILLI_PER_GPU, Placement, PodShape
from tessera.scheduler.domain.placement.state import BoolArray, ClusterState, FloatArray, IntArray


@dataclass(frozen=True, slots=True)
class Candidates:
    """Node states after a hypothetical placement: `per_node` candidates for each of the given nodes.

    Rows are node-major: row i * per_node + c is candidate c of node i. A sharing pod has one candidate
    per GPU slot (`valid` says which slots fit); other pods have one.
    """

    cpu_left: IntArray
    gpu_left: IntArray
    model_idx: IntArray
    valid: BoolArray  # [nodes, per_node]
    per_node: int


def candidate_states(state: ClusterState, nodes: IntArray, pod: PodShape) -> Candidates:
    """Every state `nodes` could be in after taking `pod`."""
    gpu = state.gpu_left[nodes]
    cpu = state.cpu_left[nodes] - pod.cpu_milli
    model = state.model_idx[nodes]
    if pod.is_sharing:
        slots = gpu.shape[1]
        after = np.repeat(gpu[:, None, :], slots, axis=1)  # [S, C, G]
        diag = np.arange(slots)
        after[:, diag, diag] -= pod.gpu_milli
        return Candidates(
            cpu_left=np.repeat(cpu, slots),
            gpu_left=after.reshape(-1, slots),
            model_idx=np.repeat(model, slots),
            valid=gpu >= pod.gpu_milli,
            per_node=slots,
        )
    if pod.num_gpu > 0:
        idle = gpu == MILLI_PER_GPU
        taken = idle & (np.cumsum(idle, axis=1) <= pod.num_gpu)
        gpu = gpu - taken * MILLI_PER_GPU
    return Candidates(cpu, gpu, model, np.ones((nodes.size, 1), dtype=np.bool_), 1)


def fragmentation_change(
    model: FragmentationModel, state: ClusterState, nodes: IntArray, pod: PodShape
) -> tuple[FloatArray, Candidates]:
    """Fragmentation after minus before, [nodes, per_node]; invalid candidates are +inf."""
    cands = candidate_states(state, nodes, pod)
    before = model.node_fragmentation(state, nodes)
    after = model.evaluate(cands.cpu_left, cands.gpu_left, cands.model_idx).reshape(nodes.size, -1)
    change = after - before[:, None]
    return np.where(cands.valid, change, np.inf), cands


def fgd_score(change: FloatArray) -> FloatArray:
    """FGD's node score: floor(100 * sigmoid(-change / 1000)); -inf for invalid candidates."""
    with np.errstate(over="ignore"):
        score = np.floor(100.0 / (1.0 + np.exp(change / 1000.0)))
    return np.where(np.isfinite(change), score, -np.inf)


class FGDPolicy:
    """FGD: the node (and, for a sharing pod, the GPU) of highest integer FGD score.

    Among GPUs of equal score on a node, the lowest slot wins; among nodes, the lowest tie rank.
    """

    name = "FGD"

    def __init__(self, model: FragmentationModel, rank: IntArray) -> None:
        self._model = model
        self._rank = rank
        self._cache = NodeScoreCache()

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None:
        nodes = np.flatnonzero(state.feasible(pod))
        if nodes.size == 0:
            return None

        def compute(stale: IntArray) -> tuple[FloatArray, IntArray]:
            change, _ = fragmentation_change(self._model, state, stale, pod)
            score = fgd_score(change)
            best = np.argmax(score, axis=1)
            return score[np.arange(stale.size), best], best.astype(np.int64)

        scores, slots = self._cache.get(state, shape_key(pod), nodes, compute)
        node = pick_best(nodes, scores, self._rank)
        if pod.is_sharing:
            return Placement(node, (int(slots[np.searchsorted(nodes, node)]),))
        return Placement(node, whole_gpus(state, node, pod.num_gpu))
