"""The placement policy interface and the classic heuristics: Random, BestFit, DotProd, binpack, spread."""

from __future__ import annotations

from typing import Literal, Protocol

import numpy as np

from tessera.scheduler.domain.placement.choice import GpuMode, gpus_for, pick_best
from tessera.scheduler.domain.placement.model import Placement, PodShape
from tessera.scheduler.domain.placement.state import ClusterState, FloatArray, IntArray

# Normalisation of the scoring heuristics of the FGD simulator: the largest node of the openb trace.
CPU_SCALE_MILLI = 128_000
GPU_SCALE_MILLI = 8_000


class PlacementPolicy(Protocol):
    """Chooses where one pod goes, or None when it fits nowhere. It never changes the state."""

    name: str

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None: ...


def _leftover(state: ClusterState, nodes: IntArray, pod: PodShape) -> tuple[FloatArray, FloatArray]:
    cpu = (state.cpu_left[nodes] - pod.cpu_milli) / CPU_SCALE_MILLI
    gpu = (state.gpu_free[nodes] - pod.gpu_request_milli) / GPU_SCALE_MILLI
    return cpu, gpu


class RandomPolicy:
    """Any feasible node, uniformly at random; a sharing pod takes any GPU that fits, at random.

    (With a random GPU, the 10-seed means land within 0.1 point of the FGD paper's Random.)
    """

    name = "Random"

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None:
        nodes = np.flatnonzero(state.feasible(pod))
        if nodes.size == 0:
            return None
        node = int(nodes[self._rng.integers(nodes.size)])
        if pod.is_sharing:
            fitting = np.flatnonzero(state.gpu_left[node] >= pod.gpu_milli)
            return Placement(node, (int(fitting[self._rng.integers(fitting.size)]),))
        return Placement(node, gpus_for(state, node, pod))


class BestFitPolicy:
    """The node with the least leftover (CPU/128k + GPU milli/8k)/2, scored in integer steps of 1%."""

    name = "BestFit"

    def __init__(self, rank: IntArray) -> None:
        self._rank = rank

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None:
        nodes = np.flatnonzero(state.feasible(pod))
        if nodes.size == 0:
            return None
        cpu, gpu = _leftover(state, nodes, pod)
        scores = np.floor(100.0 * (1.0 - (cpu + gpu) / 2.0))
        node = pick_best(nodes, scores, self._rank)
        return Placement(node, gpus_for(state, node, pod))


class DotProdPolicy:
    """The node whose free (CPU, GPU) aligns least with the request (Tetris-style, as in FGD's study)."""

    name = "DotProd"

    def __init__(self, rank: IntArray) -> None:
        self._rank = rank

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None:
        nodes = np.flatnonzero(state.feasible(pod))
        if nodes.size == 0:
            return None
        free_cpu = state.cpu_left[nodes] / CPU_SCALE_MILLI
        free_gpu = state.gpu_free[nodes] / GPU_SCALE_MILLI
        dot = (
            free_cpu * (pod.cpu_milli / CPU_SCALE_MILLI)
            + free_gpu * (pod.gpu_request_milli / GPU_SCALE_MILLI)
        ) / 2
        scores = np.floor(100.0 * (1.0 - dot))
        node = pick_best(nodes, scores, self._rank)
        return Placement(node, gpus_for(state, node, pod))


NodeMode = Literal["binpack", "spread"]


class PackingPolicy:
    """Node-level binpack (most allocated after placement) or spread (least), and GPU-level binpack or spread.

    Utilisation is the mean of CPU and GPU shares used after placement (CPU alone for GPU-less nodes).
    """

    def __init__(
        self, rank: IntArray, node_mode: NodeMode = "binpack", gpu_mode: GpuMode = "binpack"
    ) -> None:
        self._rank = rank
        self._node_mode = node_mode
        self._gpu_mode = gpu_mode
        self.name = f"Node{node_mode.capitalize()}-Gpu{gpu_mode.capitalize()}"

    def choose(self, state: ClusterState, pod: PodShape) -> Placement | None:
        nodes = np.flatnonzero(state.feasible(pod))
        if nodes.size == 0:
            return None
        cpu_cap = np.maximum(state.cpu_capacity[nodes], 1)
        cpu_used = 1.0 - (state.cpu_left[nodes] - pod.cpu_milli) / cpu_cap
        gpu_cap = state.gpu_count[nodes] * 1000
        has_gpu = gpu_cap > 0
        gpu_used = np.where(
            has_gpu,
            1.0 - (state.gpu_free[nodes] - pod.gpu_request_milli) / np.maximum(gpu_cap, 1),
            0.0,
        )
        utilisation = np.where(has_gpu, (cpu_used + gpu_used) / 2.0, cpu_used)
        scores = utilisation if self._node_mode == "binpack" else -utilisation
        node = pick_best(nodes, scores, self._rank)
        return Placement(node, gpus_for(state, node, pod, self._gpu_mode))
