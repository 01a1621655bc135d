"""Which GPUs of one node a pod gets: the best-wired whole-GPU set, or the share of one GPU.

Whole GPUs: sets of k free GPUs are ranked by their worst link, then total link cost (NVLink
before PCIe before the host bridge before crossing NUMA), then by the GPU policy: binpack takes the
set with the fewest free NVLink neighbours left outside it (it fills fragments and keeps whole
islands free), spread the set with the most. A share: binpack takes the fullest GPU that still fits,
spread the emptiest (on a time-sliced GPU it fits a free replica, and fullness counts replicas).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import lru_cache
from math import comb

from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.snapshot import MILLI_PER_GPU, Link, NodeInfo, Topology

GpuSet = tuple[tuple[int, int], ...]
_Rank = Callable[[tuple[int, ...]], tuple[int, int, int, tuple[int, ...]]]


def choose_gpus(pod: PodSpec, node: NodeInfo, policy: Policy, exhaustive_limit: int = 5000) -> GpuSet | None:
    """(GPU index, milli) pairs for the pod on this node, or None if it does not fit."""
    if pod.gpu_count == 0:
        return ()
    allowed = [
        gpu for gpu in node.gpus if gpu.offered and (not pod.gpu_models or gpu.model in pod.gpu_models)
    ]
    if pod.fractional:
        fits = [gpu for gpu in allowed if gpu.fits(pod.gpu_milli)]
        if not fits:
            return None
        if policy is Policy.BINPACK:
            chosen = min(fits, key=lambda gpu: (gpu.idle_milli, gpu.index))
        else:
            chosen = min(fits, key=lambda gpu: (-gpu.idle_milli, gpu.index))
        return ((chosen.index, pod.gpu_milli),)
    free = tuple(gpu.index for gpu in allowed if gpu.fully_idle)
    best = best_gpu_set(node.topology, free, pod.gpu_count, policy, exhaustive_limit)
    return None if best is None else tuple((index, MILLI_PER_GPU) for index in best)


@lru_cache(maxsize=65536)
def best_gpu_set(
    topology: Topology, free: tuple[int, ...], k: int, policy: Policy, exhaustive_limit: int = 5000
) -> tuple[int, ...] | None:
    """The best k of the ``free`` GPUs (memoised: a cluster has few distinct (topology, free) shapes)."""
    if k > len(free):
        return None
    if k == len(free):
        return free
    sign = 1 if policy is Policy.BINPACK else -1

    def rank(combo: tuple[int, ...]) -> tuple[int, int, int, tuple[int, ...]]:
        worst, total = topology.set_cost(combo)
        return worst, total, sign * _free_nvlink_neighbours(topology, free, combo), combo

    if comb(len(free), k) <= exhaustive_limit:
        return min(itertools.combinations(free, k), key=rank)
    return _greedy(free, k, rank)


def set_link(topology: Topology, gpus: tuple[int, ...]) -> Link | None:
    """The worst link inside a GPU set, or None for fewer than two GPUs."""
    if len(gpus) < 2:
        return None
    return Link(topology.set_cost(gpus)[0])


def _free_nvlink_neighbours(topology: Topology, free: tuple[int, ...], combo: tuple[int, ...]) -> int:
    inside = set(combo)
    return sum(
        1
        for other in free
        if other not in inside and any(topology.link(other, member) is Link.NVLINK for member in combo)
    )


def _greedy(free: tuple[int, ...], k: int, rank: _Rank) -> tuple[int, ...]:
    """Grow a set from each seed by the cheapest next GPU; keep the best result. Used past the limit."""
    best: tuple[int, ...] | None = None
    for seed in free:
        chosen = [seed]
        while len(chosen) < k:
            rest = [gpu for gpu in free if gpu not in chosen]
            chosen.append(min(rest, key=lambda gpu: rank(tuple(sorted([*chosen, gpu])))))
        candidate = tuple(sorted(chosen))
        if best is None or rank(candidate) < rank(best):
            best = candidate
    assert best is not None
    return best
