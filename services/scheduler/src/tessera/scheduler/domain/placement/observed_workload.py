"""The typical workload the fragmentation score expects, learnt from the scheduler's own placements.

FGD measures fragmentation against the pods the cluster will be asked to run. The best estimate
of those is the pods it has been running: the GPU pods of the most recent placements, grouped by
shape (:func:`typical_pods`). Until there are enough of them (a new cluster, a quiet one), the
shape of Alibaba's openb trace stands in: mostly shares of one GPU and single GPUs, some
multi-GPU pods. MIG pods are left out: slices are not milli-GPU, and the score does not see them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tessera.scheduler.domain.placement.fragmentation import TypicalPod, typical_pods
from tessera.scheduler.domain.placement.model import PlacementInputError, PodShape

# The cold-start workload (the shape of the openb trace).
OPENB_TYPICAL_WORKLOAD = (
    TypicalPod(4000, 1, 250, frozenset(), 0.2),
    TypicalPod(4000, 1, 500, frozenset(), 0.25),
    TypicalPod(8000, 1, 1000, frozenset(), 0.35),
    TypicalPod(16000, 2, 1000, frozenset(), 0.1),
    TypicalPod(32000, 4, 1000, frozenset(), 0.05),
    TypicalPod(64000, 8, 1000, frozenset(), 0.05),
)


def placed_shape(gpu_milli: Sequence[tuple[int, int]], cpu_milli: int, memory_mib: int) -> PodShape | None:
    """The shape of a placed pod from what it holds ((GPU index, milli) pairs); None for a pod
    that holds no GPU milli (CPU only, or MIG slices) or holds GPUs unevenly."""
    shares = {milli for _, milli in gpu_milli}
    if len(shares) != 1:
        return None
    try:
        return PodShape(cpu_milli, memory_mib, len(gpu_milli), shares.pop())
    except PlacementInputError:
        return None


def typical_workload(
    recent: Iterable[PodShape],
    *,
    min_pods: int,
    coverage: float = 0.95,
    cold_start: Sequence[TypicalPod] = OPENB_TYPICAL_WORKLOAD,
) -> tuple[TypicalPod, ...]:
    """The typical GPU pods of ``recent`` (the latest placements' shapes), or ``cold_start`` when
    fewer than ``min_pods`` of them hold GPUs: below that, a handful of jobs would decide the whole
    profile. The scheduler's settings choose the sample and ``min_pods`` (``workload_profile``)."""
    gpu_pods = [pod for pod in recent if pod.num_gpu > 0]
    if len(gpu_pods) < max(1, min_pods):
        return tuple(cold_start)
    return tuple(typical_pods(gpu_pods, coverage))
