"""Fragmentation Gradient Descent (FGD): place each pod where cluster fragmentation grows least."""

from __future__ import annotations

import numpy as np

from tessera.scheduler.domain.placement.choice import NodeScoreCache, pick_best, shape_key, whole_gpus
from tessera.scheduler.domain.placement.fragmentation import FragmentationModel
from tessera.scheduler.domain.placement.model import MILLI_PER_GPU, Placement, PodShape
from tessera.scheduler.domain.placement.state import ClusterState, FloatArray, IntArray


def after_placement(state: ClusterState, nodes: IntArray, pod: PodShape) -> tuple[IntArray, IntArray]:
    """CPU left and GPU milli left of `nodes` after taking a pod that does not share a GPU.

    A multi-GPU or whole-GPU pod takes the first fully idle GPUs (which ones does not change the
    fragmentation: idle GPUs are alike).
    """
    gpu = state.gpu_left[nodes]
    if pod.num_gpu > 0:
        idle = gpu == MILLI_PER_GPU
        taken = idle & (np.cumsum(idle, axis=1) <= pod.num_gpu)
        gpu = gpu - taken * MILLI_PER_GPU
    return state.cpu_left[nodes] - pod.cpu_milli, gpu


def fragmentation_change(
    model: FragmentationModel, state: ClusterState, nodes: IntArray, pod: PodShape
) -> FloatArray:
    """Fragmentation after minus before for each of `nodes`: [nodes, slots] for a sharing pod (one
    column per GPU slot, +inf where the slot does not fit), [nodes, 1] otherwise."""
    gpu = state.gpu_left[nodes]
    cpu = state.cpu_left[nodes]
    models = state.model_idx[nodes]
    total, fit_count, usable = model.level_stats(gpu)
    before = model.from_level_stats(cpu, total, fit_count, usable, models)
    if not pod.is_sharing:
        cpu_after, gpu_after = after_placement(state, nodes, pod)
        return (model.evaluate(cpu_after, gpu_after, models) - before)[:, None]
    # Only the chosen GPU changes: update the per-level statistics of each slot choice in place.
    slots = gpu.shape[1]
    if model.levels.size == 0:  # only CPU-only typical pods: fragmentation is proportional to idle milli
        change_all = np.full(gpu.shape, -model.total_weight * pod.gpu_milli)
        return np.where(gpu >= pod.gpu_milli, change_all, np.inf)
    levels = model.levels[None, None, :]
    old = gpu[:, :, None]
    new = old - pod.gpu_milli
    count_after = fit_count[:, None, :] - (old >= levels) + (new >= levels)  # [S, slots, L]
    usable_after = usable[:, None, :] - old * (old >= levels) + new * (new >= levels)
    after = model.from_level_stats(
        np.repeat(cpu - pod.cpu_milli, slots),
        np.repeat(total - pod.gpu_milli, slots),
        count_after.reshape(-1, levels.shape[2]),
        usable_after.reshape(-1, levels.shape[2]),
        np.repeat(models, slots),
    ).reshape(nodes.size, slots)
    change: FloatArray = after - before[:, None]
    return np.where(gpu >= pod.gpu_milli, change, np.inf)


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
            score = fgd_score(fragmentation_change(self._model, state, stale, pod))
            best = np.argmax(score, axis=1)
            return score[np.arange(stale.size), best], best.astype(np.int64)

        scores, slots = self._cache.get(state, shape_key(pod), nodes, compute)
        node = pick_best(nodes, scores, self._rank)
        if pod.is_sharing:
            return Placement(node, (int(slots[np.searchsorted(nodes, node)]),))
        return Placement(node, whole_gpus(state, node, pod.num_gpu))
