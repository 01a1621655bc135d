"""Trace replay for placement studies: FGD's arrival sequence, the replay loop and the allocation curve."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tessera.scheduler.domain.placement.fragmentation import FragmentationModel
from tessera.scheduler.domain.placement.model import PlacementInputError, PodShape
from tessera.scheduler.domain.placement.policies import PlacementPolicy
from tessera.scheduler.domain.placement.state import ClusterState, FloatArray, IntArray


def arrival_sequence(
    pods: Sequence[PodShape], capacity_milli: int, seed: int, target: float = 1.3
) -> list[int]:
    """Indices into `pods` (sorted by name) in arrival order, until the GPU request reaches `target`.

    The pods are shuffled, then pods drawn uniformly with replacement are appended, and the sequence
    stops at the first pod that would take the total GPU request (sum of g x k) past
    `target` x `capacity_milli`.
    """
    if not pods:
        raise PlacementInputError("pods: the pod list is empty")
    if capacity_milli <= 0:
        raise PlacementInputError(f"capacity_milli must be > 0, got {capacity_milli}")
    request = np.array([p.gpu_request_milli for p in pods], dtype=np.int64)
    if not request.any():
        raise PlacementInputError("pods: no pod requests a GPU, so the arrival sequence never ends")
    limit = target * capacity_milli
    rng = np.random.default_rng(seed)
    sequence: list[int] = []
    total = 0
    for i in rng.permutation(len(pods)):
        if total + request[i] > limit:
            return sequence
        sequence.append(int(i))
        total += int(request[i])
    while True:
        i = int(rng.integers(len(pods)))
        if total + request[i] > limit:
            return sequence
        sequence.append(i)
        total += int(request[i])


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Per arrival event: GPU milli arrived so far, allocated, and (if tracked) cluster fragmentation."""

    arrived_milli: IntArray
    used_milli: IntArray
    fragmentation_milli: FloatArray
    decision_seconds: FloatArray
    failed: int


def replay(
    state: ClusterState,
    policy: PlacementPolicy,
    arrivals: Sequence[PodShape],
    fragmentation: FragmentationModel | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ReplayResult:
    """Place `arrivals` one by one with `policy` on `state`; a pod that fits nowhere is dropped."""
    n = len(arrivals)
    arrived = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    frag = np.full(n, np.nan)
    seconds = np.zeros(n)
    node_frag = fragmentation.node_fragmentation(state) if fragmentation is not None else None
    total_arrived = 0
    total_used = state.gpu_used_milli
    failed = 0
    for i, pod in enumerate(arrivals):
        start = clock()
        placement = policy.choose(state, pod)
        seconds[i] = clock() - start
        total_arrived += pod.gpu_request_milli
        if placement is None:
            failed += 1
        else:
            state.apply(pod, placement)
            total_used += pod.gpu_request_milli
            if node_frag is not None and fragmentation is not None:
                node_frag[placement.node] = fragmentation.node_fragmentation(
                    state, np.array([placement.node])
                )[0]
        arrived[i] = total_arrived
        used[i] = total_used
        if node_frag is not None:
            frag[i] = node_frag.sum()
    return ReplayResult(arrived, used, frag, seconds, failed)


def ratio_curve(
    arrived_milli: IntArray, values_milli: FloatArray, capacity_milli: int, xs: Sequence[int]
) -> FloatArray:
    """For each x, the mean of value/capacity (%) over events whose arrived/capacity (%) rounds to x.

    With no such event, the events at x-1 and x+1 are used; with none of those either, NaN.
    """
    pct = np.floor(arrived_milli * 100.0 / capacity_milli + 0.5).astype(np.int64)
    values_pct = values_milli * 100.0 / capacity_milli
    out = np.full(len(xs), np.nan)
    for j, x in enumerate(xs):
        hit = pct == x
        if not hit.any():
            hit = (pct == x - 1) | (pct == x + 1)
        if hit.any():
            out[j] = float(values_pct[hit].mean())
    return out
